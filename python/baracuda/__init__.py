"""baracuda: a plan-based op library; Python bindings.

    import baracuda.functional as F
    y = F.gelu(x, approximate="tanh")      # x: torch (CPU/CUDA), numpy, cupy, DLPack
    dx = F.gelu_backward(dy, x, approximate="tanh")

Low level: `ops()` lists the registry, `infer` gives output specs, `run`
executes any op on arrays (numpy, torch, any DLPack producer), `plan_info`
names the kernel `select` picks.
"""
import sys as _sys


def _share_libstdcxx():
    """Note [libstdc++ in the global scope]: where libbaracuda.so carries a
    static libstdc++ with exported symbols (seen with the GPU machine's
    toolchain), a process that already loaded the system libstdc++ (numpy,
    torch) ends up with two copies whose GNU-unique locale ids mix, and the
    first error message libbaracuda formats segfaults. Promoting the process's
    libstdc++ to the global scope before loading the extension makes
    libbaracuda bind to that one copy. Harmless where libstdc++ is shared."""
    if _sys.platform.startswith("linux"):
        import ctypes
        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:
            pass


_share_libstdcxx()

from . import _baracuda as _C  # noqa: E402
from ._baracuda import UnsupportedError, clear_plan_cache, cuda_available, infer, plan_info, run  # noqa: E402,F401
from ._interop import dtype_name  # noqa: E402,F401

__version__ = "0.1.0"

#: Dtype names in code order (the index is the code the 'cast' op takes).
dtypes = tuple(_C.dtypes())

_OPS = tuple(_C.ops())
_BY_NAME = {op["name"]: op for op in _OPS}


def ops(category=None):
    """Registered ops as dicts (name, category, family, direction, gradient,
    input_names, output_names, variadic (a list op such as grouped_gemm: the
    names are one group's, and a call takes any number of groups, every
    group's first operand, then every group's second...), dtypes, attrs
    {name: default}, backends, doc, and test hints: domains, sample_attrs,
    tolerance_scale, integer_inputs)."""
    return [dict(op) for op in _OPS if category is None or op["category"] == category]


def op_info(name):
    """The registry entry of one op (a dict, as in ops())."""
    if name not in _BY_NAME:
        raise ValueError(f"unknown op '{name}' (see baracuda.ops())")
    return dict(_BY_NAME[name])


from . import functional, special  # noqa: E402,F401
