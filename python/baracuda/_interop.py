"""Array interop: dtype names, allocation, scalars and streams for numpy,
torch and cupy arrays. torch and cupy are imported only when an array of
theirs is seen; any other DLPack producer is wrapped as a numpy (host) or
torch/cupy (CUDA) array on entry.
"""
import numpy as np

from . import _baracuda as _C

# baracuda dtype name -> the numpy / torch / cupy spelling.
_FRAMEWORK_NAME = {
    "f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
    "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
    "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32", "i64": "int64", "u32": "uint32",
    "bool": "bool", "c64": "complex64", "c128": "complex128",
}
_BARACUDA_NAME = {v: k for k, v in _FRAMEWORK_NAME.items()}
# Dtypes DLPack producers may fail to export: passed as raw bytes plus the dtype.
_BYTE_VIEW = {"bf16": "uint16", "fp8_e4m3": "uint8", "fp8_e5m2": "uint8"}

_DLPACK_HOST = (1, 3)  # kDLCPU, kDLCUDAHost


def dtype_name(dtype):
    """The baracuda name ('f32', 'bf16', ...) of a baracuda name or alias, a
    numpy dtype or type, or a torch dtype."""
    if isinstance(dtype, str):
        if dtype in _FRAMEWORK_NAME:
            return dtype
        if dtype in _BARACUDA_NAME:
            return _BARACUDA_NAME[dtype]
        return _C.dtypes()[_C.dtype_code(dtype)]  # aliases; TypeError when unknown
    if type(dtype).__module__ == "torch":  # torch.float16 -> 'float16'
        return dtype_name(str(dtype).rpartition(".")[2])
    return dtype_name(np.dtype(dtype).name)


def _known(name, what):
    if name not in _BARACUDA_NAME:
        raise _C.UnsupportedError(f"{what} dtype {name} has no baracuda equivalent")
    return _BARACUDA_NAME[name]


def numpy_dtype(name):
    """The numpy dtype of a baracuda dtype name (bf16/fp8 need ml_dtypes)."""
    try:
        return np.dtype(_FRAMEWORK_NAME[name])
    except TypeError:
        try:
            import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 with numpy)
            return np.dtype(_FRAMEWORK_NAME[name])
        except (ImportError, TypeError):
            raise _C.UnsupportedError(
                f"numpy has no {_FRAMEWORK_NAME[name]} dtype: install ml_dtypes or use torch tensors") from None


_NUMPY_NAME = {np.dtype(v): k for k, v in _FRAMEWORK_NAME.items() if k not in _BYTE_VIEW}  # fast path


class _Numpy:
    """Host arrays; also the fallback for lists and other host DLPack producers."""

    @staticmethod
    def spec(x):
        name = _NUMPY_NAME.get(x.dtype)
        return (name or _known(x.dtype.name, "numpy")), x.shape

    @staticmethod
    def empty(dtype, shape, like):
        return np.empty(shape, numpy_dtype(dtype))

    @staticmethod
    def scalar(value, like):
        return np.asarray(value, dtype=like.dtype)

    @staticmethod
    def export(x, dtype):
        if dtype in _BYTE_VIEW:
            return x.view(_BYTE_VIEW[dtype]), dtype
        return x, None

    @staticmethod
    def stream(like):
        return 0


_TORCH_NAME = {}  # torch.dtype -> baracuda name, filled as dtypes are seen
_TORCH_DTYPE = {}  # baracuda name -> torch.dtype, filled as outputs are allocated


def torch_stream_getter():
    """torch's current-stream getter, CUDA device id -> cudaStream_t as int:
    its raw one (what Triton uses; ~0.1 us) or, if a torch lacks it, the
    public ~10 us path. The fast path calls what this returns, once a call."""
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        def raw(device):
            return torch.cuda.current_stream(device).cuda_stream
    return raw


_stream_getter = None


def torch_dtype_name(dtype):
    """The baracuda name of a torch dtype (UnsupportedError when it has none)."""
    name = _TORCH_NAME.get(dtype)
    if name is None:
        name = _TORCH_NAME[dtype] = _known(str(dtype)[6:], "torch")
    return name


def torch_stream(device):
    """The current torch stream of CUDA device `device`, a cudaStream_t as int."""
    global _stream_getter
    if _stream_getter is None:
        _stream_getter = torch_stream_getter()
    return _stream_getter(device)


class _Torch:
    @staticmethod
    def spec(x):
        return torch_dtype_name(x.dtype), tuple(x.shape)

    @staticmethod
    def empty(dtype, shape, like):
        import torch
        torch_dtype = _TORCH_DTYPE.get(dtype)
        if torch_dtype is None:
            torch_dtype = _TORCH_DTYPE[dtype] = getattr(torch, _FRAMEWORK_NAME[dtype])
        return torch.empty(shape, dtype=torch_dtype, device=like.device)

    @staticmethod
    def scalar(value, like):
        import torch
        return torch.full((), value, dtype=like.dtype, device=like.device)

    @staticmethod
    def export(x, dtype):
        """A raw view (pointer, dtype, shape, strides, DLPack device): no
        DLPack export, whose stream handshake costs microseconds per tensor.
        The caller holds `x` for the call."""
        if x.is_conj() or x.is_neg():  # rare: a resolved copy, which the caller's list holds through DLPack
            x = x.resolve_conj().resolve_neg().detach()
            if dtype in ("fp8_e4m3", "fp8_e5m2"):
                import torch
                return x.view(torch.uint8), dtype
            return x, None
        if x.is_cuda:
            return (x.data_ptr(), dtype, tuple(x.shape), x.stride(), 2, x.get_device()), None
        if not x.is_cpu:
            raise ValueError(f"baracuda: tensors on {x.device} are not supported (cpu or cuda)")
        return (x.data_ptr(), dtype, tuple(x.shape), x.stride(), 1, 0), None

    @staticmethod
    def stream(like):
        if not like.is_cuda:
            return 0
        return torch_stream(like.get_device())


class _Cupy:
    @staticmethod
    def spec(x):
        return _known(x.dtype.name, "cupy"), x.shape

    @staticmethod
    def empty(dtype, shape, like):
        import cupy
        with like.device:
            return cupy.empty(shape, dtype=_FRAMEWORK_NAME[dtype])

    @staticmethod
    def scalar(value, like):
        import cupy
        with like.device:
            return cupy.full((), value, dtype=like.dtype)

    export = _Numpy.export

    @staticmethod
    def stream(like):
        import cupy
        return cupy.cuda.get_current_stream().ptr


NUMPY, TORCH, CUPY = _Numpy(), _Torch(), _Cupy()


def is_torch_type(tp):
    """Whether adapt() takes arrays of type `tp` as torch tensors."""
    return tp.__module__.partition(".")[0] == "torch" and hasattr(tp, "data_ptr")


def adapt(x):
    """(adapter, array) for an array-like; (None, x) for a Python scalar."""
    if isinstance(x, np.ndarray):
        return NUMPY, x
    if is_torch_type(type(x)):
        return TORCH, x
    if type(x).__module__.partition(".")[0] == "cupy" and hasattr(x, "data"):
        return CUPY, x
    if isinstance(x, (bool, int, float, complex)):
        return None, x
    if not hasattr(x, "__dlpack__"):  # numpy scalars, lists, buffer-protocol objects
        return NUMPY, np.asarray(x)
    if x.__dlpack_device__()[0] in _DLPACK_HOST:
        return NUMPY, np.from_dlpack(x)
    try:
        import torch
        return TORCH, torch.from_dlpack(x)
    except ImportError:
        import cupy
        return CUPY, cupy.from_dlpack(x)
