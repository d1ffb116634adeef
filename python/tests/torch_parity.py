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
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol,
                               msg=(lambda detail: f"{msg}: {detail}") if msg else None)


def close_product(got, x, y, dtype, scale=1.0, msg=""):
    """got ~ x @ y (computed here in float64) within the dtype's tolerance times `scale`, relative to the
    product's own scale: a sum of K rounded terms errs by about sqrt(K) * eps * its terms' size whatever
    its value, so an output near zero of a long sum is held to (|x| @ |y|) / sqrt(K), not to its own size."""
    tol = TOL[str(dtype).replace("torch.", "")] * scale
    x, y = x.double(), y.double()
    want = x @ y
    size = (x.abs() @ y.abs()) / max(x.shape[-1], 1) ** 0.5
    excess = (got.double() - want).abs() - tol * (1 + torch.maximum(size, want.abs()))
    if excess.numel() and excess.max() > 0:
        worst = divmod(int(excess.argmax()), want.shape[-1])
        raise AssertionError(f"{msg}: {int((excess > 0).sum())} of {want.numel()} elements out of tolerance; "
                             f"worst at {worst}: got {got.double()[worst].item()}, want {want[worst].item()} "
                             f"(tolerance {tol} x (1 + {size[worst].item():.4g}))")
