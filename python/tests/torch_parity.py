"""Shared pieces of the CUDA-vs-torch tests: the skip marker, the dtypes and
the per-dtype tolerance (torch is optional: without it `gpu` tests skip)."""
import pytest

import baracuda

try:
    import torch
except ImportError:  # the host tests still run
    torch = None
CUDA = torch is not None and torch.cuda.is_available() and baracuda.cuda_available()
gpu = pytest.mark.skipif(not CUDA, reason="needs torch with CUDA and a CUDA build of baracuda")
cpu_torch = pytest.mark.skipif(torch is None, reason="needs torch (CPU tensors run on the host backend)")
DTYPES = ["float32", "float16", "bfloat16", "float64"]
TOL = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 1.6e-2, "float64": 1e-11}


def close(got, want, dtype, scale=1.0, msg=""):
    """got ~ want within the dtype's tolerance times `scale`, compared in float64."""
    tol = TOL[str(dtype).replace("torch.", "")] * scale
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=msg)
