"""Elementwise ops with torch's names and argument conventions.

Every function takes torch tensors (CPU or CUDA), numpy arrays, cupy arrays
or any DLPack producer, and returns the same kind of array on the same
device, or writes into ``out=`` (a tuple for several outputs). CUDA tensors
run on the current torch/cupy stream; host arrays run on the host backend.
Python scalars become 0-d arrays of the other operands' dtype; there is no
other type promotion (mixed dtypes raise ValueError: cast with ``to``).

Most functions are generated from the op registry (``baracuda.ops()``):
``name(inputs..., attrs..., *, out=None)``, unary activations also take
``inplace=False``. ``<name>_backward(grad_output, forward inputs..., attrs...)``
returns the gradient of each forward input (a tuple when there are several),
summed over broadcast dimensions as torch.autograd does. Only the functions
whose torch signature differs from the op's are written by hand below.
"""
import builtins as _builtins
import functools as _functools
import sys as _sys

import numpy as _np

from . import _baracuda as _C
from . import _interop
from ._interop import NUMPY as _NUMPY, _FRAMEWORK_NAME, adapt as _adapt, dtype_name as _dtype_name

_OPS = {op["name"]: op for op in _C.ops() if op["category"] == "elementwise"}


@_functools.lru_cache(maxsize=4096)
def _infer(op, specs, attrs, out_specs):
    """Output specs, cached by (op, input specs, attrs, given output specs); all hashable."""
    return tuple((d, tuple(s)) for d, s in _C.infer(op, list(specs), dict(attrs), out_specs and list(out_specs)))


def _operand(x):
    """(adapter, array, (dtype, shape)) for an array-like; (None, x, None) for a Python scalar."""
    adapter, a = _adapt(x)
    return adapter, a, adapter.spec(a) if adapter is not None else None


def _call_python(op, args, attrs, out=None, out_specs=None):
    """Runs registry op `op` on `args` (arrays or Python scalars).

    Outputs are allocated like the first non-bool array operand (shapes and
    dtypes from `infer`; `out_specs` gives them for ops that need them) unless
    `out` is given; a None entry of an `out` sequence is allocated so too.
    Returns the output, or a tuple of outputs.

    The reference for `_call` (= _C.call), which does the same natively for
    numpy arrays, torch tensors and Python scalars and hands everything else
    to this function (Note [Functional fast path] in python/src/module.cpp).
    """
    ins = [_operand(a) for a in args]
    outs = None if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
    given = None if outs is None else [None if o is None else _operand(o) for o in outs]
    arrays = [o for o in ins + [g for g in given or [] if g is not None] if o[0] is not None]
    if not arrays:  # only Python scalars: numpy decides their dtypes
        ins = arrays = [_operand(_np.asarray(a)) for a in args]
    ref_adapter, ref, _ = next((o for o in arrays if o[2][0] != "bool"), arrays[0])
    ins = [o if o[0] is not None else _operand(ref_adapter.scalar(o[1], ref)) for o in ins]
    if given is None or _builtins.any(o is None for o in outs):  # None in `out`: allocated here too
        out_specs = _infer(op, tuple(spec for _, _, spec in ins), tuple(attrs.items()), out_specs)
        if given is not None and len(given) != len(out_specs):
            raise ValueError(f"{op}: out has {len(given)} entries, the op has {len(out_specs)} outputs")
        given = [(ref_adapter, ref_adapter.empty(d, s, ref), (d, s)) if given is None or given[j] is None else given[j]
                 for j, (d, s) in enumerate(out_specs)]
        outs = [a for _, a, _ in given]
    exported = [adapter.export(a, spec[0]) for adapter, a, spec in ins + given]
    dtypes = [d for _, d in exported]
    _C.run(op, [a for a, _ in exported[:len(ins)]], [a for a, _ in exported[len(ins):]], attrs,
           ref_adapter.stream(ref), dtypes if _builtins.any(dtypes) else None)
    return outs[0] if len(outs) == 1 else tuple(outs)


_C._set_call_hooks(_call_python, _interop.is_torch_type, _interop.torch_dtype_name, _interop.TORCH.empty,
                   _interop.TORCH.scalar, _interop.torch_stream_getter)
_call = _C.call


def _spec(x):
    return _operand(x)[2] or (None, ())


def _shape(x):
    """x's shape as a tuple: its own `shape` where that is one (numpy, torch.Size, cupy), else _spec's."""
    shape = getattr(x, "shape", None)
    return shape if isinstance(shape, tuple) else tuple(_spec(x)[1])


# ---------------------------------------------------------------- generated wrappers

def _generate(info):
    """Defines `name(inputs..., attrs..., [inplace=False,] *, out=None)` for a registry op."""
    name, inputs, attrs = info["name"], info["input_names"], info["attrs"]
    params = inputs + [f"{a}={int(v) if a == 'dim' else v!r}" for a, v in attrs.items()]
    target = "out"
    if info["family"] == "unary" and info["direction"] == "forward":
        params.append("inplace=False")
        target = "input if inplace else out"
    attr_dict = "{" + ", ".join(f"{a!r}: {a}" for a in attrs) + "}"
    src = (f"def {name}({', '.join(params)}, *, out=None):\n"
           f"    return _call({name!r}, ({''.join(i + ', ' for i in inputs)}), {attr_dict}, {target})\n")
    namespace = {"_call": _call}
    exec(src, namespace)  # a real signature for help() and tracebacks, no per-call binding cost
    fn = namespace[name]
    fn.__module__ = __name__
    fn.__doc__ = _doc(info)
    return fn


def _doc(info):
    outs = ", ".join(info["output_names"])
    text = f"baracuda op '{info['name']}' ({info['family']}, {info['direction']}) -> {outs}."
    if info["doc"]:
        text += f" {info['doc']}."
    if info["direction"] == "backward":
        text += f" Gradients of '{info['gradient']}' with respect to its inputs, reduced to their shapes."
    return text + f"\n\nDtypes: {', '.join(info['dtypes'])}."


# No generic signature fits these.
_HANDWRITTEN = {"fill", "cast", "where_backward", "grouped_gemm", "grouped_gemm_backward", "add_rms_norm_backward",
                "add_layer_norm_backward"}
for _info in _OPS.values():
    if _info["name"] not in _HANDWRITTEN:
        globals()[_info["name"]] = _generate(_info)
_generated_pow, _generated_clamp_backward = pow, clamp_backward  # noqa: F821 (generated above)


# ---------------------------------------------------------------- hand-written: torch signatures

def _approximate_op(approximate):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return "gelu" if approximate == "none" else "gelu_tanh"


def gelu(input, approximate="none", *, out=None):
    """torch.nn.functional.gelu: exact (x * Phi(x)) or the tanh approximation."""
    return _call(_approximate_op(approximate), (input,), {}, out)


def gelu_backward(grad_output, input, approximate="none", *, out=None):
    """Gradient of gelu(input, approximate) with respect to input."""
    return _call(_approximate_op(approximate) + "_backward", (grad_output, input), {}, out)


def logit(input, eps=None, *, out=None):
    """torch.logit: log(x / (1 - x)), x clamped to [eps, 1 - eps] when eps is given."""
    return _call("logit", (input,), {"eps": -1.0 if eps is None else eps}, out)


def logit_backward(grad_output, input, eps=None, *, out=None):
    """Gradient of logit(input, eps) with respect to input."""
    return _call("logit_backward", (grad_output, input), {"eps": -1.0 if eps is None else eps}, out)


def _is_number(x):
    return isinstance(x, (int, float)) and not isinstance(x, _builtins.bool)


def pow(input, exponent, *, out=None):
    """torch.pow: a Python-number exponent runs 'pow_scalar', a tensor one 'pow'."""
    if _is_number(exponent) and not _is_number(input):
        return _call("pow_scalar", (input,), {"exponent": exponent}, out)
    return _generated_pow(input, exponent, out=out)


def pow_backward(grad_output, input, exponent, *, out=None):
    """Gradients of pow: grad_input for a number exponent, else (grad_input, grad_exponent)."""
    if _is_number(exponent) and not _is_number(input):
        return _call("pow_scalar_backward", (grad_output, input), {"exponent": exponent}, out)
    return _call("pow_backward", (grad_output, input, exponent), {}, out)


def _bounds(op, input, min, max):
    """clamp's bounds: None -> the dtype's extremes (infinities for floats)."""
    if min is None and max is None:
        raise ValueError(f"{op}: at least one of 'min' or 'max' must not be None")
    dtype = _spec(input)[0]
    if dtype in ("i8", "u8", "i16", "i32", "i64", "u32"):
        info = _np.iinfo(_FRAMEWORK_NAME[dtype])
        lo, hi = int(info.min), int(info.max)
    else:
        lo, hi = -float("inf"), float("inf")
    return (lo if min is None else min), (hi if max is None else max)


def clamp(input, min=None, max=None, *, out=None):
    """torch.clamp: bounds are tensors (broadcast) or Python numbers; None means unbounded."""
    lo, hi = _bounds("clamp", input, min, max)
    return _call("clamp", (input, lo, hi), {}, out)


def clamp_backward(grad_output, input, min=None, max=None, *, out=None):
    """Gradients of clamp: (grad_input, grad_min, grad_max), each shaped like its operand."""
    lo, hi = _bounds("clamp_backward", input, min, max)
    return _generated_clamp_backward(grad_output, input, lo, hi, out=out)


def div(input, other, *, rounding_mode=None, out=None):
    """torch.div: true division, or rounded with rounding_mode 'trunc' or 'floor'."""
    if rounding_mode is None:
        return _call("div", (input, other), {}, out)
    if rounding_mode == "floor":
        return _call("floor_divide", (input, other), {}, out)
    if rounding_mode == "trunc":
        quotient = _call("div", (input, other), {}, out)
        return _call("trunc", (quotient,), {}, quotient)
    raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


def where_backward(grad_output, condition, input, other, *, out=None):
    """Gradients of where(condition, input, other): (grad_input, grad_other),
    summed to the shapes of input and other."""
    dtype = _spec(grad_output)[0]
    specs = ((dtype, _shape(input)), (dtype, _shape(other)))
    return _call("where_backward", (grad_output, condition), {}, out, out_specs=specs)


def _channel_weight(input, weight):
    """prelu's weight [C] as [1, C, 1, ...] (channels are dim 1); one weight as a scalar."""
    shape, w_shape = _shape(input), _shape(weight)
    count = int(_np.prod(w_shape))
    if count == 1:
        return weight.reshape(())
    if len(w_shape) != 1 or len(shape) < 2 or shape[1] != count:
        raise ValueError(f"prelu: weight of shape {list(w_shape)} must have 1 or input.shape[1] "
                         f"elements, input has shape {list(shape)}")
    return weight.reshape((1, count) + (1,) * (len(shape) - 2))


def prelu(input, weight, *, out=None):
    """torch.nn.functional.prelu: x > 0 ? x : weight * x, weight [C] along dim 1 (or one value)."""
    return _call("prelu", (input, _channel_weight(input, weight)), {}, out)


def prelu_backward(grad_output, input, weight, *, out=None):
    """Gradients of prelu: (grad_input, grad_weight) with grad_weight shaped like weight."""
    w = _channel_weight(input, weight)
    if out is not None:
        out = (out[0], out[1].reshape(_shape(w)))
    grad_input, grad_weight = _call("prelu_backward", (grad_output, input, w), {}, out)
    return grad_input, grad_weight.reshape(_shape(weight))


def to(input, dtype, *, out=None):
    """Converts to `dtype` (a baracuda name, numpy dtype or torch dtype);
    float -> int truncates and saturates, NaN -> 0."""
    return _call("cast", (input,), {"dtype": _C.dtype_code(_dtype_name(dtype))}, out)


cast = to

_FLOATS = ("f32", "f16", "bf16", "f64", "fp8_e4m3", "fp8_e5m2")


def _in_dtype(op, input, dtype, out, promotes_ints=False, **attrs):
    """torch's `dtype=` of sums, means, products, scans, norms and softmax: the input cast to dtype before the
    op (one more pass where it differs), the result in dtype. `promotes_ints`: the op gives i64 for
    narrower integers, so an integer dtype other than i64 also casts the result."""
    name = _dtype_name(dtype)
    x = input if _spec(input)[0] == name else to(input, name)
    if promotes_ints and name not in _FLOATS and name != "i64":
        return to(_call(op, (x,), attrs, None), name, out=out)
    return _call(op, (x,), attrs, out)


def fill_(input, value):
    """Fills `input` with `value` in place and returns it."""
    return _call("fill", (), {"value": value}, input)


def full_like(input, fill_value, *, dtype=None):
    """An array like `input` (same kind, device and shape; dtype unless given) filled with fill_value."""
    adapter, a = _adapt(input)
    name = adapter.spec(a)[0] if dtype is None else _dtype_name(dtype)
    return fill_(adapter.empty(name, tuple(adapter.spec(a)[1]), a), fill_value)


def full(size, fill_value, *, dtype=None, device=None):
    """torch.full: a numpy array when device is None, else a torch tensor on
    `device`. The dtype follows fill_value (bool, i64, f32) unless given."""
    if dtype is None:
        dtype = "bool" if isinstance(fill_value, _builtins.bool) else "i64" if isinstance(fill_value, int) else "f32"
    size = (size,) if isinstance(size, int) else tuple(size)
    if device is None:
        adapter, like = _adapt(_np.empty(0))
    else:
        import torch
        adapter, like = _adapt(torch.empty(0, device=device))
    return fill_(adapter.empty(_dtype_name(dtype), size, like), fill_value)


# ---------------------------------------------------------------- reductions

def _dims(op, input, dim):
    """torch's dim (None, an int or a sequence; negative from the end) as the 'dims' bitmask."""
    if dim is None or (isinstance(dim, (tuple, list)) and len(dim) == 0):
        return -1
    rank = len(_shape(input))
    mask = 0
    for d in ((dim,) if isinstance(dim, int) else tuple(dim)):
        if not -max(rank, 1) <= d < max(rank, 1):
            raise IndexError(f"{op}: dim {d} is out of range for a tensor of rank {rank}")
        mask |= 1 << (d % rank if rank else 0)
    return mask


def _reduction(op, doc, extra=(), takes_dtype=False):
    """Defines `op(input, dim=None, keepdim=False, *extra, out=None)` with torch's conventions
    (`takes_dtype`: and torch's `dtype=`, the input cast to it first)."""
    def fn(input, dim=None, keepdim=False, *, out=None, **kwargs):
        attrs = {"dims": _dims(op, input, dim), "keepdim": 1 if keepdim else 0}
        for name, default in extra:
            attrs[name] = kwargs.pop(name, default)
        dtype = kwargs.pop("dtype", None) if takes_dtype else None
        if kwargs:
            raise TypeError(f"{op}: unexpected arguments {sorted(kwargs)}")
        if dtype is not None:
            return _in_dtype(op, input, dtype, out, promotes_ints=op != "mean", **attrs)
        return _call(op, (input,), attrs, out)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = doc
    return fn


sum = _reduction("sum", "torch.sum over dim (None: all); ints and bool sum to i64; dtype= casts the input first.",
                 takes_dtype=True)
mean = _reduction("mean", "torch.mean over dim (None: all); floats only; dtype= casts the input first.",
                  takes_dtype=True)
prod = _reduction("prod", "torch.prod over dim (None: all); ints and bool multiply in i64; dtype= casts the "
                  "input first.", takes_dtype=True)
amax = _reduction("amax", "torch.amax: maximum over dim (None: all); NaN propagates.")
amin = _reduction("amin", "torch.amin: minimum over dim (None: all); NaN propagates.")
logsumexp = _reduction("logsumexp", "torch.logsumexp over dim, computed stably.")
any = _reduction("any", "torch.any over dim: bool.")
all = _reduction("all", "torch.all over dim: bool.")
_var = _reduction("var", "", (("correction", 1),))
_std = _reduction("std", "", (("correction", 1),))
_norm = _reduction("norm", "", (("p", 2.0),))


def var(input, dim=None, *, correction=1, keepdim=False, out=None):
    """torch.var: sum((x - mean)^2) / (N - correction) over dim (None: all)."""
    return _var(input, dim, keepdim, correction=correction, out=out)


def std(input, dim=None, *, correction=1, keepdim=False, out=None):
    """torch.std: sqrt(var(input, dim, correction))."""
    return _std(input, dim, keepdim, correction=correction, out=out)


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """torch.linalg.vector_norm: ord 2, 1, inf, -inf, 0 (non-zero count) or any real; dtype= casts x first."""
    if dtype is not None:
        return _in_dtype("norm", x, dtype, out, dims=_dims("norm", x, dim), keepdim=1 if keepdim else 0,
                         p=float(ord))
    return _norm(x, dim, keepdim, p=float(ord), out=out)


def norm(input, p=2, dim=None, keepdim=False, *, out=None, dtype=None):
    """torch.norm for vector norms (p a number); dtype= casts the input first."""
    return vector_norm(input, p, dim, keepdim, dtype=dtype, out=out)


def _arg(op):
    def fn(input, dim=None, keepdim=False, *, out=None):
        return _call(op, (input,), {"dims": _dims(op, input, dim), "keepdim": 1 if keepdim else 0}, out)
    fn.__name__ = fn.__qualname__ = op
    fn.__doc__ = f"torch.{op}: i64 index of the first extreme over dim (None: the flattened input); NaN wins."
    return fn


argmax, argmin = _arg("argmax"), _arg("argmin")


def count_nonzero(input, dim=None, *, out=None):
    """torch.count_nonzero over dim (None: all): i64."""
    return _call("count_nonzero", (input,), {"dims": _dims("count_nonzero", input, dim), "keepdim": 0}, out)


def sum_to_size(input, *size, out=None):
    """torch.Tensor.sum_to_size: sums the input down to a shape it broadcasts from."""
    size = tuple(size[0]) if len(size) == 1 and not isinstance(size[0], int) else tuple(size)
    dtype = _spec(input)[0]
    out_dtype = dtype if dtype in ("f32", "f16", "bf16", "f64", "fp8_e4m3", "fp8_e5m2") else "i64"
    return _call("sum_to", (input,), {}, out, out_specs=((out_dtype, size),))


def trace(input, *, out=None):
    """torch.trace: the sum of the diagonal of a matrix."""
    return _call("trace", (input,), {}, out)


def trace_backward(grad_output, input, *, out=None):
    """Gradient of trace: grad_output on the diagonal, 0 elsewhere."""
    return _call("trace_backward", (grad_output, input), {}, out)


def _reduction_grad(op, with_output, extra=()):
    """`op`_backward(grad_output, input, [output,] dim=None, keepdim=False, **extra): grad_input."""
    def fn(grad_output, input, *args, dim=None, keepdim=False, out=None, **kwargs):
        operands = (grad_output, input) + tuple(args[:1] if with_output else ())
        if len(args) != (1 if with_output else 0):
            raise TypeError(f"{op}_backward: expected grad_output, input{', output' if with_output else ''}")
        attrs = {"dims": _dims(op, input, dim), "keepdim": 1 if keepdim else 0}
        for name, default in extra:
            attrs[name] = kwargs.pop(name, default)
        if kwargs:
            raise TypeError(f"{op}_backward: unexpected arguments {sorted(kwargs)}")
        return _call(op + "_backward", operands, attrs, out)
    fn.__name__ = fn.__qualname__ = op + "_backward"
    fn.__doc__ = (f"Gradient of {op} with respect to input; grad_output{' and output' if with_output else ''} "
                  f"shaped like {op}'s result for the same dim and keepdim.")
    return fn


sum_backward = _reduction_grad("sum", False)
mean_backward = _reduction_grad("mean", False)
logsumexp_backward = _reduction_grad("logsumexp", True)
var_backward = _reduction_grad("var", False, (("correction", 1),))
std_backward = _reduction_grad("std", True, (("correction", 1),))
_norm_backward = _reduction_grad("norm", True, (("p", 2.0),))
prod_backward = _reduction_grad("prod", True)  # zeros as torch: the product of the others at a lone zero
amax_backward = _reduction_grad("amax", True)  # ties share the gradient evenly, as torch
amin_backward = _reduction_grad("amin", True)


def vector_norm_backward(grad_output, x, output, ord=2, dim=None, keepdim=False, *, out=None):
    """Gradient of vector_norm (0 where the norm is 0; ord +-inf splits it among the tied extremes, as torch)."""
    return _norm_backward(grad_output, x, output, dim=dim, keepdim=keepdim, p=float(ord), out=out)


# ---------------------------------------------------------------- scans

def cumsum(input, dim, *, dtype=None, out=None):
    """torch.cumsum along dim (ints and bool accumulate in i64); dtype= casts the input first."""
    if dtype is not None:
        return _in_dtype("cumsum", input, dtype, out, promotes_ints=True, dim=dim)
    return _call("cumsum", (input,), {"dim": dim}, out)


def cumprod(input, dim, *, dtype=None, out=None):
    """torch.cumprod along dim (ints and bool multiply in i64); dtype= casts the input first."""
    if dtype is not None:
        return _in_dtype("cumprod", input, dtype, out, promotes_ints=True, dim=dim)
    return _call("cumprod", (input,), {"dim": dim}, out)


def logcumsumexp(input, dim, *, out=None):
    """torch.logcumsumexp along dim, computed stably."""
    return _call("logcumsumexp", (input,), {"dim": dim}, out)


def cummax(input, dim, *, out=None):
    """torch.cummax: (values, indices); ties take the later index, NaN propagates."""
    return _call("cummax", (input,), {"dim": dim}, out)


def cummin(input, dim, *, out=None):
    """torch.cummin: (values, indices); ties take the later index, NaN propagates."""
    return _call("cummin", (input,), {"dim": dim}, out)


def cumsum_backward(grad_output, input, dim, *, out=None):
    """Gradient of cumsum: the reversed running sum of grad_output."""
    return _call("cumsum_backward", (grad_output, input), {"dim": dim}, out)


def cumprod_backward(grad_output, input, dim, output, *, out=None):
    """Gradient of cumprod (aten::cumprod_backward's order); output is cumprod(input, dim).
    Exact where input has zeros."""
    return _call("cumprod_backward", (grad_output, input, output), {"dim": dim}, out)


def logcumsumexp_backward(grad_output, input, output, dim, *, out=None):
    """Gradient of logcumsumexp (aten::logcumsumexp_backward's order); output is logcumsumexp(input, dim)."""
    return _call("logcumsumexp_backward", (grad_output, input, output), {"dim": dim}, out)


def cummax_backward(grad_output, input, indices, dim, *, out=None):
    """Gradient of cummax (aten::cummaxmin_backward's order): grad_output summed onto the saved indices."""
    return _call("cummax_backward", (grad_output, input, indices), {"dim": dim}, out)


def cummin_backward(grad_output, input, indices, dim, *, out=None):
    """Gradient of cummin (aten::cummaxmin_backward's order): grad_output summed onto the saved indices."""
    return _call("cummin_backward", (grad_output, input, indices), {"dim": dim}, out)


# ---------------------------------------------------------------- softmax family

def _softmax_fn(op):
    def fn(input, dim=-1, *, dtype=None, out=None):
        if dtype is not None:
            return _in_dtype(op, input, dtype, out, dim=dim)
        return _call(op, (input,), {"dim": dim}, out)

    def backward(grad_output, output, dim=-1, *, out=None):
        return _call(op + "_backward", (grad_output, output), {"dim": dim}, out)
    fn.__name__ = fn.__qualname__ = op
    backward.__name__ = backward.__qualname__ = op + "_backward"
    fn.__doc__ = f"torch.nn.functional.{op} along dim (default -1); dtype= casts the input first (one more pass)."
    backward.__doc__ = f"Gradient of {op} from grad_output and the forward output (torch's _{op}_backward_data)."
    return fn, backward


softmax, softmax_backward = _softmax_fn("softmax")
log_softmax, log_softmax_backward = _softmax_fn("log_softmax")
softmin, softmin_backward = _softmax_fn("softmin")


def gumbel_softmax(logits, tau=1, hard=False, eps=1e-10, dim=-1, *, seed=0, offset=0, return_soft=False, out=None):
    """torch.nn.functional.gumbel_softmax with a reproducible sample.

    softmax((logits + g) / tau) along dim, g = -log(-log(u)) drawn from
    (seed, offset, row, col) by Philox-4x32-10 (whole numbers in [0, 2^53];
    advance ``offset`` by the number of rows between calls for fresh noise):
    the same sample on every backend and memory layout. ``hard`` returns the
    one-hot of the argmax (the first on ties). ``eps`` is accepted and ignored
    (deprecated in torch). The backward needs the soft sample:
    ``return_soft=True`` returns (out, soft); ``out=`` takes both buffers.
    """
    del eps
    attrs = {"dim": dim, "tau": float(tau), "hard": int(bool(hard)), "seed": int(seed), "offset": int(offset)}
    y, soft = _call("gumbel_softmax", (logits,), attrs, out)
    return (y, soft) if return_soft else y


def gumbel_softmax_backward(grad_output, soft, tau=1, dim=-1, *, out=None):
    """Gradient of gumbel_softmax with respect to the logits, from the soft sample:
    soft * (grad_output - sum(grad_output * soft)) / tau (straight-through when hard)."""
    return _call("gumbel_softmax_backward", (grad_output, soft), {"dim": dim, "tau": float(tau)}, out)


def sparsemax(input, dim=-1, *, out=None):
    """Sparsemax (Martins & Astudillo 2016) along dim: the projection of the input onto the simplex."""
    return _call("sparsemax", (input,), {"dim": dim}, out)


def sparsemax_backward(grad_output, output, dim=-1, *, out=None):
    """Gradient of sparsemax from the forward output: on its support (output > 0),
    grad_output minus its mean over the support; zero elsewhere."""
    return _call("sparsemax_backward", (grad_output, output), {"dim": dim}, out)


# ---------------------------------------------------------------- normalization

def _normalized(op, input, normalized_shape, weight):
    shape = _shape(input)
    ns = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if len(ns) == 0 or shape[len(shape) - len(ns):] != ns:
        raise ValueError(f"{op}: normalized_shape {list(ns)} must be the trailing dims of input shape {list(shape)}")
    if weight is not None and _shape(weight) != ns:
        raise ValueError(f"{op}: weight shape {list(_shape(weight))} != normalized_shape {list(ns)}")
    return len(ns)


def native_layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(out, mean, rstd) like torch.native_layer_norm (statistics shaped like the leading dims, f32 for halves)."""
    k = _normalized("layer_norm", input, normalized_shape, weight)
    if weight is None and bias is None:
        return _call("layer_norm_noaffine", (input,), {"eps": eps, "normalized_dims": k})
    if weight is None or bias is None:
        raise ValueError("layer_norm: give both weight and bias, or neither")
    return _call("layer_norm", (input, weight, bias), {"eps": eps})


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.layer_norm."""
    return native_layer_norm(input, normalized_shape, weight, bias, eps)[0]


def layer_norm_backward(grad_output, input, mean, rstd, weight=None, *, normalized_dims=None):
    """(grad_input, grad_weight, grad_bias) with weight, else grad_input."""
    if weight is None:
        k = 1 if normalized_dims is None else normalized_dims
        return _call("layer_norm_noaffine_backward", (grad_output, input, mean, rstd), {"normalized_dims": k})
    return _call("layer_norm_backward", (grad_output, input, mean, rstd, weight), {})


def native_rms_norm(input, normalized_shape, weight=None, eps=None):
    """(out, rstd); eps None is the dtype's machine epsilon, as torch.nn.functional.rms_norm."""
    k = _normalized("rms_norm", input, normalized_shape, weight)
    e = -1.0 if eps is None else eps
    if weight is None:
        return _call("rms_norm_noaffine", (input,), {"eps": e, "normalized_dims": k})
    return _call("rms_norm", (input, weight), {"eps": e})


def rms_norm(input, normalized_shape, weight=None, eps=None):
    """torch.nn.functional.rms_norm."""
    return native_rms_norm(input, normalized_shape, weight, eps)[0]


def rms_norm_backward(grad_output, input, rstd, weight=None, *, normalized_dims=None):
    """(grad_input, grad_weight) with weight, else grad_input."""
    if weight is None:
        k = 1 if normalized_dims is None else normalized_dims
        return _call("rms_norm_noaffine_backward", (grad_output, input, rstd), {"normalized_dims": k})
    return _call("rms_norm_backward", (grad_output, input, rstd, weight), {})


def add_rms_norm(input, residual, weight, eps=None):
    """Fused residual add + rms_norm: (out, residual_out, rstd); residual_out = input + residual."""
    return _call("add_rms_norm", (input, residual, weight), {"eps": -1.0 if eps is None else eps})


def add_layer_norm(input, residual, weight, bias, eps=1e-5):
    """Fused residual add + layer_norm: (out, residual_out, mean, rstd)."""
    return _call("add_layer_norm", (input, residual, weight, bias), {"eps": eps})


def add_rms_norm_backward(grad_output, grad_residual_out, residual_out, rstd, weight):
    """Gradients of add_rms_norm: (grad_input, grad_weight), grad_input being the gradient of both input and
    residual (rms_norm_backward over residual_out, plus grad_residual_out; None: residual_out's gradient is 0)."""
    g = _absent(residual_out) if grad_residual_out is None else grad_residual_out
    return _call("add_rms_norm_backward", (grad_output, g, residual_out, rstd, weight), {})


def add_layer_norm_backward(grad_output, grad_residual_out, residual_out, mean, rstd, weight):
    """Gradients of add_layer_norm: (grad_input, grad_weight, grad_bias), grad_input being the gradient of both
    input and residual (layer_norm_backward over residual_out, plus grad_residual_out; None: zero)."""
    g = _absent(residual_out) if grad_residual_out is None else grad_residual_out
    return _call("add_layer_norm_backward", (grad_output, g, residual_out, mean, rstd, weight), {})


_ABSENT = {}  # (array type, dtype, device, stat) -> an empty [0] array: it holds no memory, nothing writes it


def _absent(input, stat=False):
    """An empty [0] array like input (`stat`: of the statistics dtype, f32, f64 for f64 input): an optional
    operand not given (made once per type, dtype, device and kind: making it cost a third of a small loss's
    call, and half of a small attention's)."""
    try:
        key = (type(input), input.dtype, getattr(input, "device", None), stat)
        return _ABSENT[key]
    except (AttributeError, TypeError):  # no dtype, or an unhashable one: made per call
        key = None
    except KeyError:
        pass
    adapter, a, (dtype, _) = _operand(input)
    made = adapter.empty(("f64" if dtype == "f64" else "f32") if stat else dtype, (0,), a)
    if key is not None and len(_ABSENT) < 256:
        _ABSENT[key] = made
    return made


def _bn_attrs(training, eps, momentum=None):
    attrs = {"training": 1.0 if training else 0.0, "eps": float(eps)}
    if momentum is not None:
        attrs["momentum"] = float(momentum)
    return attrs


def _empty_like(a):
    """An output of a's shape and dtype in a's memory layout (channels-last stays channels-last, as in
    torch) for numpy, torch and cupy arrays; None (the call allocates it row-major) for other arrays."""
    module = type(a).__module__.split(".")[0]
    return _sys.modules[module].empty_like(a) if module in ("numpy", "torch", "cupy") else None


def native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps):
    """(out, save_mean, save_invstd) like torch.native_batch_norm: input [N, C, *], statistics per channel.

    Training updates running_mean / running_var in place when given (the unbiased variance goes into
    running_var). save_mean / save_invstd are f32 (f64 for f64): the batch statistics in training, the
    running ones used in eval (torch returns them empty in eval)."""
    ops = tuple(_absent(input) if t is None else t for t in (weight, bias, running_mean, running_var))
    # out keeps input's memory layout; the statistics and, with absent running stats, their [0] outputs in the
    # parameters' dtype are allocated by the call; given running stats are updated in place.
    running = (ops[2], ops[3]) if running_mean is not None else (None, None)
    outs = _call("batch_norm", (input,) + ops, _bn_attrs(training, eps, momentum),
                 (_empty_like(input), None, None) + running)
    return outs[:3]


def batch_norm(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5):
    """torch.nn.functional.batch_norm (running stats updated in place when training)."""
    return native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


def native_batch_norm_backward(grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
                               output_mask=(True, True, True)):
    """(grad_input, grad_weight, grad_bias) like torch.native_batch_norm_backward (None where output_mask is False).

    Training uses save_mean / save_invstd from the forward, eval running_mean / running_var."""
    ops = tuple(_absent(input) if t is None else t for t in (weight, save_mean, save_invstd, running_mean, running_var))
    # grad_input keeps input's memory layout; grad_weight and grad_bias are allocated by the call.
    grads = _call("batch_norm_backward", (grad_out, input) + ops, _bn_attrs(train, eps),
                  (_empty_like(input), None, None))
    return tuple(g if keep else None for g, keep in zip(grads, output_mask))


def batch_norm_backward(grad_output, input, save_mean=None, save_invstd=None, weight=None, running_mean=None,
                        running_var=None, training=True, eps=1e-5):
    """(grad_input, grad_weight, grad_bias) of batch_norm; grad_weight and grad_bias also without a weight."""
    return native_batch_norm_backward(grad_output, input, weight, running_mean, running_var, save_mean, save_invstd,
                                      training, eps)
# ---------------------------------------------------------------- group / instance normalization

def _channel_params(op, input, weight, bias):
    """(weight, bias) both given or both None; a missing one of a pair becomes ones / zeros."""
    shape = _shape(input)
    if len(shape) < 2:
        raise ValueError(f"{op}: input must be [N, C, *], got shape {list(shape)}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and _shape(p) != (shape[1],):
            raise ValueError(f"{op}: {name} shape {list(_shape(p))} != [{shape[1]}] (one per channel)")
    if weight is None and bias is not None:
        weight = full_like(bias, 1.0)
    elif bias is None and weight is not None:
        bias = full_like(weight, 0.0)
    return weight, bias


def _group_norm(op, input, weight, bias, attrs):
    weight, bias = _channel_params(op, input, weight, bias)
    if weight is None:
        return _call(op + "_noaffine", (input,), attrs)
    return _call(op, (input, weight, bias), attrs)


def native_group_norm(input, weight, bias, N, C, HxW, group, eps):
    """(out, mean, rstd) like torch.native_group_norm: mean/rstd [N, group], f32 (f64 for f64)."""
    shape = _shape(input)
    if len(shape) < 2 or (shape[0], shape[1], int(_np.prod(shape[2:], dtype=_np.int64))) != (N, C, HxW):
        raise ValueError(f"native_group_norm: N, C, HxW = {N}, {C}, {HxW} do not describe input shape {list(shape)}")
    return _group_norm("group_norm", input, weight, bias, {"num_groups": int(group), "eps": float(eps)})


def group_norm(input, num_groups, weight=None, bias=None, eps=1e-5):
    """torch.nn.functional.group_norm: input [N, C, *], statistics per (n, group) of C / num_groups channels."""
    return _group_norm("group_norm", input, weight, bias, {"num_groups": int(num_groups), "eps": float(eps)})[0]


def group_norm_backward(grad_output, input, mean, rstd, weight=None):
    """(grad_input, grad_weight, grad_bias) with weight, else grad_input (torch.native_group_norm_backward);
    num_groups comes from mean's shape [N, num_groups]."""
    if weight is None:
        return _call("group_norm_noaffine_backward", (grad_output, input, mean, rstd), {})
    return _call("group_norm_backward", (grad_output, input, mean, rstd, weight), {})


def native_instance_norm(input, weight=None, bias=None, eps=1e-5):
    """(out, mean, rstd) of instance normalization with the input's statistics: mean/rstd [N, C]."""
    return _group_norm("instance_norm", input, weight, bias, {"eps": float(eps)})


def instance_norm(input, running_mean=None, running_var=None, weight=None, bias=None, use_input_stats=True,
                  momentum=0.1, eps=1e-5):
    """torch.nn.functional.instance_norm. With use_input_stats and running stats given, running_mean and
    running_var are updated in place (op instance_norm_running_stats: momentum-weighted mean over the batch of
    the instance means and unbiased variances, as torch). use_input_stats=False normalises with the running
    stats through elementwise ops."""
    shape = _shape(input)
    if (running_mean is None) != (running_var is None):
        raise ValueError("instance_norm: give both running_mean and running_var, or neither")
    if use_input_stats:
        out, mean, rstd = native_instance_norm(input, weight, bias, eps)
        if running_mean is not None:
            attrs = {"momentum": float(momentum), "eps": float(eps), "spatial": int(_np.prod(shape[2:], dtype=_np.int64))}
            _call("instance_norm_running_stats", (running_mean, running_var, mean, rstd), attrs,
                  (running_mean, running_var))
        return out
    if running_mean is None:
        raise ValueError("instance_norm: running_mean and running_var are needed when use_input_stats is False")
    weight, bias = _channel_params("instance_norm", input, weight, bias)
    view = (1, shape[1]) + (1,) * (len(shape) - 2)
    scale = rsqrt(add(running_var, eps))  # noqa: F821 (generated)
    if weight is not None:
        scale = mul(scale, weight)  # noqa: F821
    out = mul(sub(input, running_mean.reshape(view)), scale.reshape(view))  # noqa: F821
    return add(out, bias.reshape(view)) if bias is not None else out  # noqa: F821


def instance_norm_backward(grad_output, input, mean, rstd, weight=None):
    """(grad_input, grad_weight, grad_bias) with weight, else grad_input, from native_instance_norm's mean/rstd."""
    if weight is None:
        return _call("instance_norm_noaffine_backward", (grad_output, input, mean, rstd), {})
    return _call("instance_norm_backward", (grad_output, input, mean, rstd, weight), {})


# ---------------------------------------------------------------- losses

_REDUCTIONS = {"none": 0, "mean": 1, "sum": 2, "batchmean": 3}


def _reduction_code(op, reduction):
    if reduction not in _REDUCTIONS or (reduction == "batchmean" and op != "kl_div"):
        raise ValueError(f"{op}: reduction must be 'none', 'mean' or 'sum', got {reduction!r}")
    return _REDUCTIONS[reduction]


def _pointwise_loss(op, operands, params=(), defaults=None):
    """Defines `op(operands..., reduction='mean', params...)` and `op_backward(grad_output, operands..., ...)`."""
    defaults = defaults or {}

    def attrs_of(reduction, kwargs):
        attrs = {"reduction": _reduction_code(op, reduction)}
        for name, default in params:
            value = kwargs.pop(name, default)
            attrs[name] = float(value)
        if kwargs:
            raise TypeError(f"{op}: unexpected arguments {sorted(kwargs)}")
        return attrs

    def forward(*args, reduction=defaults.get("reduction", "mean"), out=None, **kwargs):
        return _call(op, args, attrs_of(reduction, kwargs), out)

    def backward(grad_output, *args, reduction=defaults.get("reduction", "mean"), out=None, **kwargs):
        return _call(op + "_backward", (grad_output,) + args, attrs_of(reduction, kwargs), out)

    forward.__name__ = forward.__qualname__ = op
    backward.__name__ = backward.__qualname__ = op + "_backward"
    forward.__doc__ = (f"torch.nn.functional.{op}({', '.join(operands)}, reduction='mean'"
                       + "".join(f", {n}={d!r}" for n, d in params) + ").")
    backward.__doc__ = f"Gradients of {op} with respect to its differentiable operands (a tuple when several)."
    return forward, backward


mse_loss, mse_loss_backward = _pointwise_loss("mse_loss", ("input", "target"))
l1_loss, l1_loss_backward = _pointwise_loss("l1_loss", ("input", "target"))
huber_loss, huber_loss_backward = _pointwise_loss("huber_loss", ("input", "target"), (("delta", 1.0),))
smooth_l1_loss, smooth_l1_loss_backward = _pointwise_loss("smooth_l1_loss", ("input", "target"), (("beta", 1.0),))
soft_margin_loss, soft_margin_loss_backward = _pointwise_loss("soft_margin_loss", ("input", "target"))
hinge_embedding_loss, hinge_embedding_loss_backward = _pointwise_loss(
    "hinge_embedding_loss", ("input", "target"), (("margin", 1.0),))
margin_ranking_loss, margin_ranking_loss_backward = _pointwise_loss(
    "margin_ranking_loss", ("input1", "input2", "target"), (("margin", 0.0),))
_kl_div, kl_div_backward = _pointwise_loss("kl_div", ("input", "target"), (("log_target", 0.0),))
_poisson, poisson_nll_loss_backward = _pointwise_loss(
    "poisson_nll_loss", ("input", "target"), (("log_input", 1.0), ("full", 0.0), ("eps", 1e-8)))
_gaussian, _gaussian_backward = _pointwise_loss("gaussian_nll_loss", ("input", "target", "var"),
                                                (("full", 0.0), ("eps", 1e-6)))
_bce, _bce_backward = _pointwise_loss("binary_cross_entropy", ("input", "target", "weight"))
_bce_logits, _bce_logits_backward = _pointwise_loss(
    "binary_cross_entropy_with_logits", ("input", "target", "weight", "pos_weight"))
_multilabel, _multilabel_backward = _pointwise_loss("multilabel_soft_margin_loss", ("input", "target", "weight"))


def kl_div(input, target, reduction="mean", log_target=False, *, out=None):
    """torch.nn.functional.kl_div (input as log-probabilities; 'batchmean' divides by dim 0)."""
    return _kl_div(input, target, reduction=reduction, log_target=log_target, out=out)


def poisson_nll_loss(input, target, log_input=True, full=False, eps=1e-8, reduction="mean", *, out=None):
    """torch.nn.functional.poisson_nll_loss."""
    return _poisson(input, target, reduction=reduction, log_input=log_input, full=full, eps=eps, out=out)


def _gaussian_var(input, var):
    shape, vshape = _shape(input), _shape(var)
    if vshape != shape and vshape == shape[:-1]:  # torch: one variance per row
        return var.reshape(vshape + (1,))
    return var


def gaussian_nll_loss(input, target, var, full=False, eps=1e-6, reduction="mean", *, out=None):
    """torch.nn.functional.gaussian_nll_loss (var broadcasts; a var of input's shape minus the last dim is one per row)."""
    return _gaussian(input, target, _gaussian_var(input, var), reduction=reduction, full=full, eps=eps, out=out)


def gaussian_nll_loss_backward(grad_output, input, target, var, full=False, eps=1e-6, reduction="mean"):
    """(grad_input, grad_target, grad_var), grad_var shaped like var."""
    v = _gaussian_var(input, var)
    gi, gt, gv = _gaussian_backward(grad_output, input, target, v, reduction=reduction, full=full, eps=eps)
    return gi, gt, gv.reshape(_shape(var))


def binary_cross_entropy(input, target, weight=None, reduction="mean", *, out=None):
    """torch.nn.functional.binary_cross_entropy (weight broadcasts)."""
    return _bce(input, target, 1.0 if weight is None else weight, reduction=reduction, out=out)


def binary_cross_entropy_backward(grad_output, input, target, weight=None, reduction="mean"):
    """(grad_input, grad_target)."""
    return _bce_backward(grad_output, input, target, 1.0 if weight is None else weight, reduction=reduction)


def binary_cross_entropy_with_logits(input, target, weight=None, reduction="mean", pos_weight=None, *, out=None):
    """torch.nn.functional.binary_cross_entropy_with_logits (weight and pos_weight broadcast)."""
    return _bce_logits(input, target, 1.0 if weight is None else weight, 1.0 if pos_weight is None else pos_weight,
                       reduction=reduction, out=out)


def binary_cross_entropy_with_logits_backward(grad_output, input, target, weight=None, reduction="mean",
                                              pos_weight=None):
    """(grad_input, grad_target)."""
    return _bce_logits_backward(grad_output, input, target, 1.0 if weight is None else weight,
                                1.0 if pos_weight is None else pos_weight, reduction=reduction)


def multilabel_soft_margin_loss(input, target, weight=None, reduction="mean", *, out=None):
    """torch.nn.functional.multilabel_soft_margin_loss (the class mean per row, then the reduction)."""
    return _multilabel(input, target, 1.0 if weight is None else weight, reduction=reduction, out=out)


def multilabel_soft_margin_loss_backward(grad_output, input, target, weight=None, reduction="mean"):
    """(grad_input, grad_target)."""
    return _multilabel_backward(grad_output, input, target, 1.0 if weight is None else weight, reduction=reduction)


def _class_weight(input, weight):
    """The class weights, or an empty [0] array of input's dtype (no weights)."""
    return weight if weight is not None else _absent(input)


def _class_attrs(op, reduction, ignore_index, label_smoothing=None):
    attrs = {"reduction": _reduction_code(op, reduction), "ignore_index": float(ignore_index)}
    if label_smoothing is not None:
        attrs["label_smoothing"] = float(label_smoothing)
    return attrs


def cross_entropy_forward(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """(loss, lse): cross_entropy and the per-row logsumexp (f32; f64 for f64) that its backward takes."""
    return _call("cross_entropy", (input, target, _class_weight(input, weight)),
                 _class_attrs("cross_entropy", reduction, ignore_index, label_smoothing))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                  label_smoothing=0.0):
    """torch.nn.functional.cross_entropy: class dim 1, class-index (i64/i32) or probability targets."""
    if size_average is not None or reduce is not None:
        raise TypeError("cross_entropy: size_average and reduce are deprecated in torch; use reduction")
    return cross_entropy_forward(input, target, weight, ignore_index, reduction, label_smoothing)[0]


def cross_entropy_backward(grad_output, input, target, lse, weight=None, ignore_index=-100, reduction="mean",
                           label_smoothing=0.0, *, out=None):
    """Gradient of cross_entropy with respect to the logits, from the lse that cross_entropy_forward saved."""
    return _call("cross_entropy_backward", (grad_output, input, target, _class_weight(input, weight), lse),
                 _class_attrs("cross_entropy", reduction, ignore_index, label_smoothing), out)


def cross_entropy_fused(input, target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    """(loss, grad_input) in one pass: the gradient is for grad_output = 1 (multiply by the real one after)."""
    return _call("cross_entropy_fused", (input, target, _class_weight(input, weight)),
                 _class_attrs("cross_entropy", reduction, ignore_index, label_smoothing))


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean", *,
             out=None):
    """torch.nn.functional.nll_loss: log-probabilities with class dim 1, class-index targets."""
    if size_average is not None or reduce is not None:
        raise TypeError("nll_loss: size_average and reduce are deprecated in torch; use reduction")
    return _call("nll_loss", (input, target, _class_weight(input, weight)),
                 _class_attrs("nll_loss", reduction, ignore_index), out)


def nll_loss_backward(grad_output, input, target, weight=None, ignore_index=-100, reduction="mean", *, out=None):
    """Gradient of nll_loss with respect to the log-probabilities."""
    return _call("nll_loss_backward", (grad_output, input, target, _class_weight(input, weight)),
                 _class_attrs("nll_loss", reduction, ignore_index), out)


def _row_loss_attrs(op, reduction, size_average=None, reduce=None, **attrs):
    if size_average is not None or reduce is not None:
        raise TypeError(f"{op}: size_average and reduce are deprecated in torch; use reduction")
    return {"reduction": _reduction_code(op, reduction), **{k: float(v) for k, v in attrs.items()}}


def cosine_embedding_loss(input1, input2, target, margin=0.0, size_average=None, reduce=None, reduction="mean", *,
                          out=None):
    """torch.nn.functional.cosine_embedding_loss: [N, D] or [D] inputs, target +-1 (input's dtype, i64 or i32)."""
    return _call("cosine_embedding_loss", (input1, input2, target),
                 _row_loss_attrs("cosine_embedding_loss", reduction, size_average, reduce, margin=margin), out)


def cosine_embedding_loss_backward(grad_output, input1, input2, target, margin=0.0, reduction="mean"):
    """(grad_input1, grad_input2)."""
    return _call("cosine_embedding_loss_backward", (grad_output, input1, input2, target),
                 _row_loss_attrs("cosine_embedding_loss", reduction, margin=margin))


def triplet_margin_loss(anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False, size_average=None,
                        reduce=None, reduction="mean", *, out=None):
    """torch.nn.functional.triplet_margin_loss: rows along the last dim; the three operands of one shape."""
    return _call("triplet_margin_loss", (anchor, positive, negative),
                 _row_loss_attrs("triplet_margin_loss", reduction, size_average, reduce, margin=margin, p=p, eps=eps,
                                 swap=swap), out)


def triplet_margin_loss_backward(grad_output, anchor, positive, negative, margin=1.0, p=2, eps=1e-6, swap=False,
                                 reduction="mean"):
    """(grad_anchor, grad_positive, grad_negative)."""
    return _call("triplet_margin_loss_backward", (grad_output, anchor, positive, negative),
                 _row_loss_attrs("triplet_margin_loss", reduction, margin=margin, p=p, eps=eps, swap=swap))


def _one_target(input, target):
    """torch takes a [1] target for a [C] input: the 0-d target of the registry op."""
    if len(_shape(input)) == 1 and _shape(target) == (1,):
        return target.reshape(())
    return target


def multi_margin_loss(input, target, p=1, margin=1.0, weight=None, size_average=None, reduce=None, reduction="mean", *,
                      out=None):
    """torch.nn.functional.multi_margin_loss: [N, C] or [C] input, class-index target (i64 or i32), p 1 or 2."""
    return _call("multi_margin_loss", (input, _one_target(input, target), _class_weight(input, weight)),
                 _row_loss_attrs("multi_margin_loss", reduction, size_average, reduce, p=p, margin=margin), out)


def multi_margin_loss_backward(grad_output, input, target, p=1, margin=1.0, weight=None, reduction="mean", *, out=None):
    """Gradient of multi_margin_loss with respect to the input."""
    return _call("multi_margin_loss_backward",
                 (grad_output, input, _one_target(input, target), _class_weight(input, weight)),
                 _row_loss_attrs("multi_margin_loss", reduction, p=p, margin=margin), out)


def multilabel_margin_loss(input, target, size_average=None, reduce=None, reduction="mean", *, out=None):
    """torch.nn.functional.multilabel_margin_loss: target (i64/i32) of input's shape lists classes, padded with -1."""
    return _call("multilabel_margin_loss", (input, target),
                 _row_loss_attrs("multilabel_margin_loss", reduction, size_average, reduce), out)


def multilabel_margin_loss_backward(grad_output, input, target, reduction="mean", *, out=None):
    """Gradient of multilabel_margin_loss with respect to the input."""
    return _call("multilabel_margin_loss_backward", (grad_output, input, target),
                 _row_loss_attrs("multilabel_margin_loss", reduction), out)


def _ctc_indices(x, like):
    """Targets or lengths as an integer array where log_probs lives: ints, lists, tuples and host arrays
    given with device log_probs are copied there (i64; i32 arrays stay i32); a torch tensor on another
    device is moved (torch takes CPU lengths with CUDA log_probs)."""
    adapter, ref = _adapt(like)
    x_adapter, x = _adapt(x)
    if x_adapter is None or (x_adapter is _NUMPY and adapter is not _NUMPY):
        values = _np.asarray(x)
        values = values.astype(_np.int32 if values.dtype == _np.int32 else _np.int64)
        if adapter is _NUMPY:
            return values
        out = adapter.empty("i32" if values.dtype == _np.int32 else "i64", values.shape, ref)
        if hasattr(out, "copy_"):  # torch
            import torch
            out.copy_(torch.from_numpy(values))
        else:  # cupy
            out.set(values)
        return out
    if hasattr(x, "to") and hasattr(x, "device") and hasattr(ref, "device") and x.device != ref.device:
        return x.to(ref.device)
    return x


def _ctc_attrs(reduction, blank, zero_infinity):
    return {"reduction": _reduction_code("ctc_loss", reduction), "blank": float(blank),
            "zero_infinity": float(bool(zero_infinity))}


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean", zero_infinity=False, *,
             out=None):
    """torch.nn.functional.ctc_loss: log_probs [T, N, C] (or [T, C] unbatched), targets padded [N, S] or
    concatenated [sum(target_lengths)] (i64/i32), lengths [N] as tensors, lists or tuples. Mean divides each
    loss by its target length (at least 1), then averages over the batch."""
    return _call("ctc_loss", (log_probs, _ctc_indices(targets, log_probs), _ctc_indices(input_lengths, log_probs),
                              _ctc_indices(target_lengths, log_probs)),
                 _ctc_attrs(reduction, blank, zero_infinity), out)


def ctc_loss_backward(grad_output, log_probs, targets, input_lengths, target_lengths, blank=0, reduction="mean",
                      zero_infinity=False, *, out=None):
    """Gradient of ctc_loss with respect to log_probs, as torch's autograd gives it (torch's ctc_loss_backward:
    exp(log_probs) minus the alignment occupancy, scaled; zero for t >= input_length)."""
    lengths = [_ctc_indices(x, log_probs) for x in (targets, input_lengths, target_lengths)]
    return _call("ctc_loss_backward", (grad_output, log_probs, *lengths), _ctc_attrs(reduction, blank, zero_infinity),
                 out)


# ---------------------------------------------------------------- torch aliases

clip = clamp
absolute = abs  # noqa: F821 (generated)
negative = neg  # noqa: F821
multiply = mul  # noqa: F821
subtract = sub  # noqa: F821
divide = true_divide = div
arcsin, arccos, arctan, arctan2 = asin, acos, atan, atan2  # noqa: F821
arcsinh, arccosh, arctanh = asinh, acosh, atanh  # noqa: F821
greater, greater_equal, less, less_equal, not_equal = gt, ge, lt, le, ne  # noqa: F821
fix = trunc  # noqa: F821

__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == __name__)


# ---------------------------------------------------------------- matrix products

def matmul(input, other, *, out=None):
    """torch.matmul: vectors, matrices and broadcast batches (cuBLASLt on CUDA)."""
    return _call("matmul", (input, other), {}, out)


def mm(input, mat2, *, out=None):
    """torch.mm."""
    return _call("mm", (input, mat2), {}, out)


def bmm(input, mat2, *, out=None):
    """torch.bmm."""
    return _call("bmm", (input, mat2), {}, out)


def mv(input, vec, *, out=None):
    """torch.mv."""
    return _call("mv", (input, vec), {}, out)


def dot(input, other, *, out=None):
    """torch.dot."""
    return _call("dot", (input, other), {}, out)


def addmm(input, mat1, mat2, *, beta=1, alpha=1, out=None):
    """torch.addmm: beta * input + alpha * mat1 @ mat2 (input is not read when beta == 0)."""
    return _call("addmm", (input, mat1, mat2), {"beta": beta, "alpha": alpha}, out)


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1, out=None):
    """torch.baddbmm."""
    return _call("baddbmm", (input, batch1, batch2), {"beta": beta, "alpha": alpha}, out)


_ACTIVATIONS = {None: 0, "none": 0, "relu": 1, "gelu": 2, "gelu_tanh": 3, "silu": 4}


def linear(input, weight, bias=None, *, activation=None, out=None):
    """torch.nn.functional.linear, with an optional fused activation epilogue:
    None, 'relu', 'gelu' (exact), 'gelu_tanh' or 'silu'."""
    if activation not in _ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {sorted(k for k in _ACTIVATIONS if k)}, got {activation!r}")
    return _call("linear", (input, weight, _absent(input) if bias is None else bias),
                 {"activation": _ACTIVATIONS[activation]}, out)


def matmul_backward(grad_output, input, other, *, alpha=1):
    """(grad_input, grad_other) of torch.matmul, summed over broadcast batch dims; alpha scales both."""
    return _call("matmul_backward", (grad_output, input, other), {"alpha": alpha})


def linear_backward(grad_output, input, weight, *, bias=True):
    """(grad_input, grad_weight, grad_bias) of linear without activation; grad_bias is None when bias=False."""
    gi, gw, gb = _call("linear_backward", (grad_output, input, weight), {"bias": 1 if bias else 0})
    return gi, gw, (gb if bias else None)


def _group_offsets(offs, like):
    """offs as an i32 array where `like` lives; None becomes [0] (absent: 3D x 3D)."""
    if offs is None:
        adapter, a, _ = _operand(like)
        return adapter.empty("i32", (0,), a)
    if _spec(offs)[0] != "i32":
        raise ValueError(f"grouped_mm: offs must be int32 (torch._grouped_mm's dtype), got {_spec(offs)[0]}")
    return offs


def _grouped_mm(a, b, offs, out=None):
    return _call("grouped_mm", (a, b, _group_offsets(offs, a)), {}, out)


def grouped_mm_backward(grad_output, a, b, offs=None):
    """(grad_a, grad_b) of grouped_mm."""
    return _call("grouped_mm_backward", (grad_output, a, b, _group_offsets(offs, a)), {})


def _autograd_function(make):
    """A getter of the torch.autograd.Function class that make(torch) defines, made on first use (torch
    stays an optional dependency)."""
    made = []

    def get():
        if not made:
            import torch
            made.append(make(torch))
        return made[0]
    return get


def _make_grouped_mm_function(torch):
    """A torch.autograd.Function over grouped_mm / grouped_mm_backward."""
    class GroupedMM(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, offs):
            ctx.save_for_backward(a, b, offs)
            return _grouped_mm(a, b, offs)

        @staticmethod
        def backward(ctx, grad_output):
            a, b, offs = ctx.saved_tensors
            grad_a, grad_b = grouped_mm_backward(grad_output, a, b, offs)  # any strides
            return grad_a, grad_b, None
    return GroupedMM


_grouped_autograd = _autograd_function(_make_grouped_mm_function)


def grouped_mm(mat_a, mat_b, offs=None, *, out=None):
    """torch._grouped_mm (the MoE expert product, torch's argument names), same dtype in and out; with a =
    mat_a and b = mat_b:

    - a [M, K], b [G, K, N], offs [G] int32: rows [offs[g-1], offs[g]) of a use b[g] -> [M, N]
      (rows at or past offs[G-1] are zeros; torch leaves them undefined);
    - a [G, M, K], b [G, K, N], offs None -> [G, M, N];
    - a [M, K], b [K, N], offs [G] over K -> [G, M, N] (the weight-gradient form);
    - a [G, M, K], b [K, N], offs [G] over N: columns [offs[g-1], offs[g]) of b use a[g] -> [M, N]
      (columns at or past offs[G-1] are zeros).

    bf16/f16 on sm_90 run CUTLASS's TMA + WGMMA ptr-array grouped kernel (as torch does); other
    dtypes, devices and layouts the bespoke kernels.

    offs are read on the device (no sync: graph-capturable); must be non-decreasing and at most the split
    extent (the host backend raises otherwise; CUDA clamps them). torch tensors that require grad go
    through autograd (grouped_mm_backward)."""
    a, b = mat_a, mat_b
    if out is None and (getattr(a, "requires_grad", False) or getattr(b, "requires_grad", False)):
        import torch
        if torch.is_grad_enabled():
            return _grouped_autograd().apply(a, b, _group_offsets(offs, a))
    return _grouped_mm(a, b, offs, out)


def _group_lists(op, *lists):
    """The operand lists of a list op as one tuple (every list in turn), checked for equal, non-zero length."""
    lists = [list(x) for x in lists]
    if not lists[0] or _builtins.any(len(x) != len(lists[0]) for x in lists):
        raise ValueError(f"{op}: expected lists of one equal, non-zero length, got lengths {[len(x) for x in lists]}")
    return tuple(t for x in lists for t in x), len(lists[0])


def _as_list(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def grouped_gemm_backward(grad_output, a, b, *, alpha=1.0):
    """(grad_a, grad_b) of grouped_gemm, lists of G: grad_a[g] = alpha * grad_output[g] @ b[g]^T,
    grad_b[g] = alpha * a[g]^T @ grad_output[g]."""
    operands, groups = _group_lists("grouped_gemm_backward", grad_output, a, b)
    grads = _as_list(_call("grouped_gemm_backward", operands, {"alpha": alpha}))
    return grads[:groups], grads[groups:]


def _make_grouped_gemm_function(torch):
    """A torch.autograd.Function over grouped_gemm / grouped_gemm_backward."""
    class GroupedGemm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, alpha, groups, *operands):
            ctx.alpha, ctx.groups = alpha, groups
            ctx.save_for_backward(*operands)
            return tuple(_as_list(_call("grouped_gemm", operands, {"alpha": alpha, "beta": 0.0})))

        @staticmethod
        def backward(ctx, *grads):
            operands, g = ctx.saved_tensors, ctx.groups
            a, b = operands[:g], operands[g:]
            grads = [x if x is not None else torch.zeros(a[i].shape[0], b[i].shape[1], dtype=a[i].dtype,
                                                         device=a[i].device) for i, x in enumerate(grads)]
            grad_a, grad_b = grouped_gemm_backward(grads, a, b, alpha=ctx.alpha)
            return (None, None, *grad_a, *grad_b)
    return GroupedGemm


_grouped_gemm_autograd = _autograd_function(_make_grouped_gemm_function)


def grouped_gemm(a, b, *, alpha=1.0, beta=0.0, out=None):
    """A list of G products, each with its own M, N and K (cuBLAS's grouped GEMM with the sizes on the host):
    out[g] = alpha * a[g] @ b[g] + beta * out[g], a[g] [M_g, K_g], b[g] [K_g, N_g]. Returns a list of G.

    a and b are sequences of G >= 1 matrices of one dtype (f32 f16 bf16 f64 i8 i32 i64; int8 products give
    int32), any strides. beta != 0 reads `out` (then required); beta = 0 never reads it. One plan covers
    the list (cuBLASLt readies an algorithm for each shape); a run launches the groups in turn. torch
    tensors that require grad go through autograd (grouped_gemm_backward)."""
    operands, groups = _group_lists("grouped_gemm", a, b)
    if beta != 0 and out is None:
        raise ValueError("grouped_gemm: beta != 0 reads out, so out must be given")
    if out is None and _builtins.any(getattr(t, "requires_grad", False) for t in operands):
        import torch
        if torch.is_grad_enabled():
            return list(_grouped_gemm_autograd().apply(float(alpha), groups, *operands))
    if out is not None:
        out = list(out)
        if len(out) != groups:
            raise ValueError(f"grouped_gemm: out has {len(out)} entries, expected {groups}")
    return _as_list(_call("grouped_gemm", operands, {"alpha": alpha, "beta": beta}, out))


def scaled_mm(a, b, scale_a, scale_b, bias=None, scale_result=None, out_dtype=None, use_fast_accum=False, *,
              out=None):
    """torch._scaled_mm: scale_result * ((a * scale_a) @ (b * scale_b) + bias), accumulated in f32.

    a [M, K] and b [K, N] are fp8 (e4m3/e5m2; on cuBLASLt not both e5m2, a
    row-major, b column-major as b = w.t() of a row-major w, K and the
    leading dims multiples of 16; other views run on the bespoke kernel).
    Scales are f32: per tensor (scalars [] or [1]), row-wise (scale_a [M, 1],
    scale_b [1, N]) or block-wise (scale_a [M, ceil(K/128)] per 1 x 128,
    scale_b [ceil(K/128), ceil(N/128)] per 128 x 128); on sm_90 CUTLASS runs
    row-wise and block-wise e4m3 x e4m3 -> bf16/f16/f32 in cuBLASLt's layout
    (K and N multiples of 16 bytes), the bespoke kernel the rest. bias [N] is
    bf16 (f16 for an f16 output; either for fp8).
    out_dtype: bf16, f16, f32, or fp8 e4m3/e5m2 (saturated to the largest
    finite value); None takes out's dtype, else a's (torch's default, fp8).
    scale_result (an f32 scalar) multiplies an fp8 output only."""
    if out_dtype is not None:
        result = _dtype_name(out_dtype)
    else:
        result = _spec(out if out is not None else a)[0]
    attrs = {"use_fast_accum": 1 if use_fast_accum else 0, "out_dtype": _C.dtype_code(result)}
    adapter, x, _ = _operand(a)
    if bias is None:
        bias = adapter.empty("f16" if result == "f16" else "bf16", (0,), x)
    if scale_result is None:
        scale_result = adapter.empty("f32", (0,), x)
    return _call("scaled_mm", (a, b, scale_a, scale_b, bias, scale_result), attrs, out)


def _lce_attrs(reduction, ignore_index, label_smoothing, chunk_rows, f32_weight_grad=True):
    return {"reduction": _reduction_code("linear_cross_entropy", reduction), "ignore_index": float(ignore_index),
            "label_smoothing": float(label_smoothing), "chunk_rows": float(chunk_rows),
            "f32_weight_grad": 1.0 if f32_weight_grad else 0.0}


def _lce_operands(input, weight, target, bias, class_weight=None):
    return (input, weight, target, _absent(input) if bias is None else bias,
            _absent(input) if class_weight is None else class_weight)


def _make_lce_function(torch):
    """torch.autograd.Function for linear_cross_entropy.

    mean and sum run linear_cross_entropy_fused in the forward (the gradients come out of the same
    pass over the logits) and scale them by grad_output in the backward; none runs the forward op
    and recomputes the logits in linear_cross_entropy_backward.
    """
    class LinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, input, weight, target, bias, class_weight, attrs):
            ops = _lce_operands(input, weight, target, bias, class_weight)
            ctx.has_bias, ctx.attrs = bias is not None, attrs
            if attrs["reduction"] == 0:
                ctx.save_for_backward(input, weight, target, bias, class_weight)
                return _call("linear_cross_entropy", ops, attrs)
            loss, *grads = _call("linear_cross_entropy_fused", ops, attrs)
            ctx.save_for_backward(*grads)
            return loss

        @staticmethod
        def backward(ctx, grad_output):
            if ctx.attrs["reduction"] == 0:
                input, weight, target, bias, class_weight = ctx.saved_tensors
                gi, gw, gb = _call("linear_cross_entropy_backward", (grad_output.contiguous(),)
                                   + _lce_operands(input, weight, target, bias, class_weight), ctx.attrs)
            else:
                gi, gw, gb = (g * grad_output for g in ctx.saved_tensors)
            return gi, gw, None, (gb if ctx.has_bias else None), None, None
    return LinearCrossEntropy


_lce_autograd = _autograd_function(_make_lce_function)


def linear_cross_entropy(input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0, reduction="mean",
                         *, chunk_rows=0, f32_weight_grad=True, class_weight=None):
    """cross_entropy(linear(input, weight, bias), target, weight=class_weight) without the [N, V] logits in
    memory: input [N, H], weight [V, H], bias [V], class-index target [N] (i64/i32), class_weight [V] (torch's
    cross_entropy `weight`: mean divides by the sum of the weights of the targets not ignored; not
    differentiated). The CUDA plan holds `chunk_rows` rows of
    logits at a time (0: as many as fit 256 MiB, and at least H rows where the weight gradient sums in f32). f16/bf16 gradients of weight and bias sum across chunks
    in f32 (V * H * 4 bytes of workspace, one rounding), or with f32_weight_grad=False in their own dtype
    (one rounding per chunk). Torch tensors that require grad go through a torch.autograd.Function whose
    backward is this op's gradient."""
    attrs = _lce_attrs(reduction, ignore_index, label_smoothing, chunk_rows, f32_weight_grad)
    if _builtins.any(getattr(a, "requires_grad", False) for a in (input, weight, bias)):
        return _lce_autograd().apply(input, weight, target, bias, class_weight, attrs)
    return _call("linear_cross_entropy", _lce_operands(input, weight, target, bias, class_weight), attrs)


def linear_cross_entropy_backward(grad_output, input, weight, target, bias=None, ignore_index=-100,
                                  label_smoothing=0.0, reduction="mean", *, chunk_rows=0, f32_weight_grad=True,
                                  class_weight=None):
    """(grad_input, grad_weight, grad_bias) of linear_cross_entropy; grad_bias is None without bias."""
    gi, gw, gb = _call("linear_cross_entropy_backward",
                       (grad_output,) + _lce_operands(input, weight, target, bias, class_weight),
                       _lce_attrs(reduction, ignore_index, label_smoothing, chunk_rows, f32_weight_grad))
    return gi, gw, (gb if bias is not None else None)


def linear_cross_entropy_fused(input, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                               reduction="mean", *, chunk_rows=0, f32_weight_grad=True, class_weight=None):
    """(loss, grad_input, grad_weight, grad_bias) in one pass over the chunks of logits, the gradients for
    grad_output = 1 (reduction none: for grad_output all ones); grad_bias is None without bias."""
    loss, gi, gw, gb = _call("linear_cross_entropy_fused", _lce_operands(input, weight, target, bias, class_weight),
                             _lce_attrs(reduction, ignore_index, label_smoothing, chunk_rows, f32_weight_grad))
    return loss, gi, gw, (gb if bias is not None else None)


def set_allow_tf32(allow):
    """Lets f32 matrix products multiply in TF32 (as torch.backends.cuda.matmul.allow_tf32); off by default."""
    _C.set_allow_tf32(bool(allow))


def set_deterministic(only):
    """Asks every plan chosen from now on to be bitwise reproducible run to run (as
    torch.use_deterministic_algorithms): the attention backward then sums dQ in a fixed order instead of by
    atomics (cuDNN's deterministic backward, or the bespoke kernels' two passes); off by default."""
    _C.set_deterministic(bool(only))


# ---------------------------------------------------------------- attention

def _slopes(query, alibi_slopes):
    """ALiBi slopes, or an absent [0] operand: f32 (f64 for f64 queries), as lse."""
    return _absent(query, stat=True) if alibi_slopes is None else alibi_slopes


def _mask(query, attn_mask):
    """The mask, or an absent [0] operand of query's dtype."""
    return _absent(query) if attn_mask is None else attn_mask


def _pair_out(out):
    """`out` of a forward attention: (out, lse), or out alone (lse then allocated)."""
    return out if out is None or isinstance(out, (tuple, list)) else (out, None)


def _attention_attrs(op, dropout_p, causal, scale, window, bottom_right, softcap, seed, offset):
    left, right = (-1, -1) if window is None else window
    if scale is not None and scale <= 0:
        raise ValueError(f"{op}: scale must be > 0 or None (1/sqrt(D)), got {scale}")
    return {"scale": 0.0 if scale is None else float(scale), "causal": 1 if causal else 0,
            "bottom_right": 1 if bottom_right else 0, "window_left": int(left), "window_right": int(right),
            "softcap": float(softcap), "dropout_p": float(dropout_p), "seed": int(seed), "offset": int(offset)}


def _check_gqa(op, query, key, enable_gqa):
    hq, hkv = _shape(query)[-3], _shape(key)[-3]
    if hq != hkv and not enable_gqa:
        raise ValueError(f"{op}: query has {hq} heads and key {hkv}; pass enable_gqa=True for grouped-query attention")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, window=None, bottom_right=False, softcap=0.0, alibi_slopes=None,
                                 seed=0, offset=0, return_lse=False, out=None):
    """torch.nn.functional.scaled_dot_product_attention over [B, H, S, D] (or [H, S, D]) views.

    Beyond torch: ``window=(left, right)`` keys around the query's position
    (-1 unbounded), ``bottom_right`` aligns the causal diagonal and the window
    to the last key (KV-cache prefill), ``softcap``, ``alibi_slopes`` (f32 [H]
    or [B, H]), a reproducible dropout from ``seed`` and ``offset`` (Philox;
    torch's RNG is not used), and ``return_lse`` for (out, lse) with lse
    [B, H, S] f32 (the natural-log log-sum-exp the backward needs). A query
    that sees no key gets zeros (torch's math backend gives NaN). ``out``: the
    output tensor, or (out, lse) with either None (allocated).
    """
    _check_gqa("scaled_dot_product_attention", query, key, enable_gqa)
    attrs = _attention_attrs("scaled_dot_product_attention", dropout_p, is_causal, scale, window, bottom_right, softcap,
                             seed, offset)
    o, lse = _call("scaled_dot_product_attention",
                   (query, key, value, _mask(query, attn_mask), _slopes(query, alibi_slopes)), attrs, _pair_out(out))
    return (o, lse) if return_lse else o


def scaled_dot_product_attention_backward(grad_output, query, key, value, out, lse, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False, *, window=None,
                                          bottom_right=False, softcap=0.0, alibi_slopes=None, seed=0, offset=0):
    """(grad_query, grad_key, grad_value) from the forward's out and lse (the same options). As torch's, the
    default may sum grad_query in any order (its last bits vary run to run); set_deterministic(True) fixes it."""
    _check_gqa("scaled_dot_product_attention_backward", query, key, enable_gqa)
    attrs = _attention_attrs("scaled_dot_product_attention_backward", dropout_p, is_causal, scale, window,
                             bottom_right, softcap, seed, offset)
    mask, slopes = _mask(query, attn_mask), _slopes(query, alibi_slopes)
    return _call("scaled_dot_product_attention_backward", (grad_output, query, key, value, out, lse, mask, slopes), attrs)


def varlen_attention(query, key, value, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q=0, max_seqlen_kv=0, *,
                     dropout_p=0.0, causal=False, scale=None, window=None, bottom_right=False, softcap=0.0,
                     alibi_slopes=None, seed=0, offset=0, return_lse=False, out=None):
    """Attention over packed sequences (flash_attn_varlen_func): query [Tq, Hq, D], key/value [Tk, Hkv, D];
    sequence b is tokens cu_seqlens[b]:cu_seqlens[b + 1] (int32 on the tensors' device). lse is [Hq, Tq]."""
    attrs = _attention_attrs("varlen_attention", dropout_p, causal, scale, window, bottom_right, softcap, seed, offset)
    attrs.update(max_seqlen_q=int(max_seqlen_q), max_seqlen_kv=int(max_seqlen_kv))
    slopes = _slopes(query, alibi_slopes)
    o, lse = _call("varlen_attention", (query, key, value, cu_seqlens_q, cu_seqlens_kv, slopes), attrs,
                   _pair_out(out))
    return (o, lse) if return_lse else o


def varlen_attention_backward(grad_output, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_kv, max_seqlen_q=0,
                              max_seqlen_kv=0, *, dropout_p=0.0, causal=False, scale=None, window=None,
                              bottom_right=False, softcap=0.0, alibi_slopes=None, seed=0, offset=0):
    """(grad_query, grad_key, grad_value) of varlen_attention."""
    attrs = _attention_attrs("varlen_attention_backward", dropout_p, causal, scale, window, bottom_right, softcap, seed,
                             offset)
    attrs.update(max_seqlen_q=int(max_seqlen_q), max_seqlen_kv=int(max_seqlen_kv))
    slopes = _slopes(query, alibi_slopes)
    return _call("varlen_attention_backward", (grad_output, query, key, value, out, lse, cu_seqlens_q, cu_seqlens_kv,
                                               slopes), attrs)


# ---------------------------------------------------------------- rotary embedding and the KV cache

_ROPE_SCALING = {None: 0, "none": 0, "linear": 1, "ntk": 2, "llama3": 3}


def _rope_attrs(op, base, rotary_dim, interleaved, scaling, factor, low_freq_factor, high_freq_factor,
                original_max_position):
    if scaling not in _ROPE_SCALING:
        raise ValueError(f"{op}: scaling must be None, 'linear', 'ntk' or 'llama3', got {scaling!r}")
    return {"base": float(base), "rotary_dim": int(rotary_dim or 0), "interleaved": 1 if interleaved else 0,
            "scaling": _ROPE_SCALING[scaling], "factor": float(factor), "low_freq_factor": float(low_freq_factor),
            "high_freq_factor": float(high_freq_factor), "original_max_position": float(original_max_position)}


def rope(x, positions, base=10000.0, rotary_dim=None, interleaved=False, scaling=None, factor=1.0,
         low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192, *, inplace=False, out=None):
    """Rotary position embedding of x [batch, seq, heads, dim] (or [seq, heads, dim]) at integer
    positions [batch, seq] or [seq]. Pairs (d, d + rotary_dim/2) (NeoX/Llama rotate_half) or, with
    interleaved=True, (2i, 2i+1) (GPT-J); dims past rotary_dim (None: all) pass through. scaling:
    None, 'linear' (positions / factor), 'ntk' (base * factor^(rd/(rd-2))) or 'llama3' (with
    low_freq_factor, high_freq_factor, original_max_position). Angles are formed in f64; cos/sin and
    the rotation run in f32 (f64 for f64)."""
    attrs = _rope_attrs("rope", base, rotary_dim, interleaved, scaling, factor, low_freq_factor, high_freq_factor,
                        original_max_position)
    return _call("rope", (x, positions), attrs, x if inplace else out)


def rope_backward(grad_output, positions, base=10000.0, rotary_dim=None, interleaved=False, scaling=None, factor=1.0,
                  low_freq_factor=1.0, high_freq_factor=4.0, original_max_position=8192, *, inplace=False, out=None):
    """Gradient of rope with respect to x: grad_output turned back by the same angles."""
    attrs = _rope_attrs("rope_backward", base, rotary_dim, interleaved, scaling, factor, low_freq_factor,
                        high_freq_factor, original_max_position)
    return _call("rope_backward", (grad_output, positions), attrs, grad_output if inplace else out)


def kv_append(k_new, v_new, k_cache, v_cache, cache_seqlens, block_table=None):
    """Writes new keys/values into a KV cache in place and returns (k_cache, v_cache).

    k_new [B, T, Hkv, D], v_new [B, T, Hkv, Dv]; cache_seqlens int32 [B] (tokens already cached):
    token t of sequence b goes to position cache_seqlens[b] + t. Paged caches [num_blocks,
    block_size, Hkv, D] with block_table int32 [B, max_blocks]; block_table None: contiguous caches
    [B, max_seqlen, Hkv, D]. Caches may be fp8 (e4m3/e5m2). Only the appended slots are written;
    out-of-range positions or block ids raise on the host and are skipped on CUDA."""
    if block_table is None:
        adapter, a, _ = _operand(k_new)
        block_table = adapter.empty("i32", (0,), a)
    _call("kv_append", (k_new, v_new, block_table, cache_seqlens), {}, (k_cache, v_cache))
    return k_cache, v_cache


# ---------------------------------------------------------------- decode attention

def decode_attention(q, k_cache, v_cache, seq_lens, block_table=None, *, scale=None, softcap=0.0, window_left=-1,
                     num_splits=0, out=None):
    """Flash decoding of one new query token per sequence: returns (out, lse).

    q [B, Hq, D]; paged caches k_cache [num_blocks, block_size, Hkv, D], v_cache [num_blocks,
    block_size, Hkv, Dv] with block_table int32 [B, max_blocks], or block_table None and
    per-sequence caches [B, S_max, Hkv, D] (any strides: torch's [B, Hkv, S, D] as
    ``k.transpose(1, 2)``). seq_lens int32 [B] counts the cached tokens, the new one included.
    Hkv divides Hq (GQA). scale None: 1/sqrt(D); softcap > 0: score = softcap * tanh(score /
    softcap); window_left >= 0: only keys j >= seq_len - 1 - window_left. out [B, Hq, Dv] in q's
    dtype, lse [B, Hq] f32 (f64 for f64; -inf and out 0 for an empty sequence)."""
    if block_table is None:
        adapter, a, _ = _operand(q)
        block_table = adapter.empty("i32", (0,), a)
    attrs = {"scale": 0.0 if scale is None else float(scale), "softcap": float(softcap),
             "window_left": int(window_left), "num_splits": int(num_splits)}
    return _call("decode_attention", (q, k_cache, v_cache, block_table, seq_lens), attrs, out)
