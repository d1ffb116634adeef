"""baracuda.functional on CUDA tensors against torch: every elementwise op of
the registry in f32/f16/bf16/f64 (plus i32/bool where offered), compared with
the torch function evaluated in float64 on the same (rounded) inputs, and
every backward op against torch.autograd.grad. Skipped without torch + CUDA.
"""
import zlib

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as TF  # noqa: E402

import baracuda  # noqa: E402
import baracuda.functional as F  # noqa: E402

if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)
if not baracuda.cuda_available():
    pytest.skip("baracuda was built without CUDA (BARACUDA_CUDA=OFF)", allow_module_level=True)

OPS = {op["name"]: op for op in baracuda.ops("elementwise")}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "f64": torch.float64,
          "i32": torch.int32, "bool": torch.bool}
FLOATS = ("f32", "f16", "bf16", "f64")
# Kernels do the math in f32 (f64 for f64): the output rounding dominates.
TOL = {"f64": (1e-10, 1e-12), "f32": (1e-5, 1e-5), "f16": (2e-3, 2e-3), "bf16": (1.6e-2, 1.6e-2)}
# torch is the less accurate side here in f64: f32 constants (1/6 in hardswish and
# hardsigmoid, 1/alpha in celu's gradient) and a short trigamma series.
TORCH_F64_TOL = {"hardswish": 1e-7, "hardsigmoid": 1e-7, "hardswish_backward": 1e-7,
                 "hardsigmoid_backward": 1e-7, "celu_backward": 1e-6, "digamma_backward": 1e-8}


def _gated(f):
    return lambda x, dim: f(*x.chunk(2, dim=int(dim)))


def _same_name(*names):
    return {n: getattr(torch, n) for n in names}


REFS = {
    **_same_name("neg", "abs", "sign", "square", "reciprocal", "sqrt", "rsqrt", "exp", "exp2", "expm1", "log",
                 "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
                 "asinh", "acosh", "atanh", "floor", "ceil", "round", "trunc", "frac", "sigmoid", "erf", "erfc",
                 "lgamma", "digamma", "bitwise_not", "isnan", "isinf", "isfinite", "logical_not", "mul", "div",
                 "pow", "atan2", "hypot", "copysign", "nextafter", "fmax", "fmin", "maximum", "minimum",
                 "floor_divide", "fmod", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor",
                 "bitwise_left_shift", "bitwise_right_shift", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
                 "logical_or", "logical_xor", "clamp", "lerp", "where"),
    "cube": lambda x: x * x * x, "cbrt": lambda x: torch.sign(x) * x.abs().pow(1 / 3),
    "relu": TF.relu, "relu6": TF.relu6, "gelu": TF.gelu, "gelu_tanh": lambda x: TF.gelu(x, approximate="tanh"),
    "silu": TF.silu, "mish": TF.mish, "softplus": TF.softplus, "hardswish": TF.hardswish,
    "hardsigmoid": TF.hardsigmoid, "hardtanh": TF.hardtanh, "logit": lambda x, eps: torch.logit(x, eps if eps >= 0 else None),
    "softsign": TF.softsign, "tanhshrink": TF.tanhshrink, "selu": TF.selu, "leaky_relu": TF.leaky_relu,
    "elu": TF.elu, "celu": TF.celu, "hardshrink": TF.hardshrink, "softshrink": TF.softshrink,
    "step": lambda x: (x > 0).to(x.dtype) + 0 * x,  # zero gradient, as the op's
    "threshold": TF.threshold, "pow_scalar": torch.pow, "affine": lambda x, scale, shift: x * scale + shift,
    "add": lambda a, b, alpha: torch.add(a, b, alpha=alpha), "sub": lambda a, b, alpha: torch.sub(a, b, alpha=alpha),
    "prelu": TF.prelu, "fma": lambda a, b, c: a * b + c, "addcmul": torch.addcmul, "addcdiv": torch.addcdiv,
    "glu": lambda x, dim: TF.glu(x, int(dim)), "reglu": _gated(lambda a, b: TF.relu(a) * b),
    "swiglu": _gated(lambda a, b: TF.silu(a) * b), "geglu": _gated(lambda a, b: TF.gelu(a) * b),
}
HANDLED_APART = {"cast", "fill"}  # test_cast, test_fill
SHAPES = {"unary": [(129, 257)], "predicate": [(129, 257)], "binary": [(3, 1, 65), (4, 65)],
          "compare": [(3, 1, 65), (4, 65)], "ternary": [(4, 65), (65,), (4, 1)], "gated": [(6, 64)],
          "where": [(4, 1), (4, 65), (65,)]}
INT_DIVISORS = {"floor_divide", "fmod", "remainder"}


def forward_ops():
    return [op for op, info in OPS.items() if info["direction"] == "forward" and op not in HANDLED_APART]


def shapes_of(op):
    return [(4, 3, 65), (3,)] if op == "prelu" else SHAPES[OPS[op]["family"]]


def make_inputs(op, dtype, shapes, seed):
    """Random inputs from the registry's domains, as CUDA tensors of `dtype`."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    info = OPS[op]
    xs = []
    for i, shape in enumerate(shapes):
        if op == "where" and i == 0:
            xs.append(torch.rand(shape, generator=gen, device="cuda") > 0.5)
            continue
        lo, hi, symmetric = info["domains"][min(i, len(info["domains"]) - 1)]
        x = torch.empty(shape, dtype=torch.float64, device="cuda").uniform_(lo, hi, generator=gen)
        if symmetric:
            x *= torch.randint(0, 2, shape, generator=gen, device="cuda") * 2 - 1
        if info["integer_inputs"] or dtype in ("i32", "bool"):
            x = x.round()
        xs.append(x)
    if op == "clamp":  # ordered bounds: torch and baracuda may differ where min == max
        xs[1], xs[2] = -xs[1].abs() - 0.1, xs[2].abs() + 0.1
    if op in INT_DIVISORS and dtype == "i32":
        xs[1][xs[1] == 0] = 1
    if info["family"] == "predicate" and dtype in FLOATS:
        flat = xs[0].view(-1)
        flat[::7], flat[::11], flat[::13] = float("nan"), float("inf"), -float("inf")
    return [x if x.dtype == torch.bool else x.to(DTYPES[dtype]) for x in xs]


def up(x):
    """float64 copy of a floating tensor (other dtypes unchanged)."""
    return x.double() if x.is_floating_point() else x


def attrs_for(info, sample, dtype):
    attrs = {**info["attrs"], **sample}
    attrs = {k: int(v) if k == "dim" else v for k, v in attrs.items()}
    if dtype in ("i32", "bool"):
        if any(v != int(v) for v in attrs.values()):
            return None  # a fractional attribute has no meaning for integers (torch refuses it)
        attrs = {k: int(v) for k, v in attrs.items()}
    return attrs


def assert_matches(op, dtype, got, want):
    if want.dtype == torch.bool or dtype in ("i32", "bool") or op == "nextafter":
        assert got.dtype == want.dtype and torch.equal(got, want), op
        return
    rtol, atol = TOL[dtype]
    if dtype == "f64" and op in TORCH_F64_TOL:
        rtol = atol = TORCH_F64_TOL[op]
    scale = OPS[op]["tolerance_scale"]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * scale, atol=atol * scale,
                               equal_nan=True, msg=lambda m: f"{op} {dtype}: {m}")


def test_every_op_has_a_reference():
    missing = [op for op in forward_ops() if op not in REFS]
    assert not missing, f"add torch references for {missing}"
    undefined = [op for op in OPS if not hasattr(F, op) and op not in HANDLED_APART]
    assert not undefined, f"baracuda.functional lacks {undefined}"


FORWARD_CASES = [(op, dt, i) for op in forward_ops() for dt in DTYPES if dt in OPS[op]["dtypes"]
                 for i in range(len(OPS[op]["sample_attrs"]))]


@pytest.mark.parametrize("op,dtype,sample", FORWARD_CASES)
def test_forward(op, dtype, sample):
    info = OPS[op]
    attrs = attrs_for(info, info["sample_attrs"][sample], dtype)
    if attrs is None:
        pytest.skip("fractional attribute on an integer dtype")
    xs = make_inputs(op, dtype, shapes_of(op), seed=zlib.crc32(f"{op}/{dtype}/{sample}".encode()))
    got = getattr(F, op)(*xs, **attrs)
    ref_inputs = [up(x) for x in xs] if dtype in FLOATS and op != "nextafter" else xs
    assert_matches(op, dtype, got, REFS[op](*ref_inputs, **attrs))
    if info["family"] == "unary":  # a transposed (non-contiguous) input and output
        xt = xs[0].t()
        out = torch.empty_like(xt.t()).t()
        getattr(F, op)(xt, **attrs, out=out)
        assert_matches(op, dtype, out, REFS[op](up(xt) if dtype in FLOATS else xt, **attrs))


BACKWARD_CASES = [(info["gradient"], dt, i) for info in OPS.values() if info["direction"] == "backward"
                  for dt in FLOATS if dt in info["dtypes"] for i in range(len(info["sample_attrs"]))]


@pytest.mark.parametrize("op,dtype,sample", BACKWARD_CASES)
def test_backward(op, dtype, sample):
    info = OPS[op]
    attrs = attrs_for(info, info["sample_attrs"][sample], dtype)
    shapes = [(33, 65)] if info["family"] == "unary" else shapes_of(op)
    xs = make_inputs(op, dtype, shapes, seed=zlib.crc32(f"{op}/{dtype}/{sample}/bwd".encode()))
    leaves = [up(x).requires_grad_() if x.is_floating_point() else x for x in xs]
    y = REFS[op](*leaves, **attrs)
    grad = torch.rand(y.shape, dtype=torch.float64, device="cuda") * 2 - 1
    grad = grad.to(DTYPES[dtype])
    wrt = [x for x in leaves if x.requires_grad]
    want = torch.autograd.grad(y, wrt, up(grad), allow_unused=True)
    got = getattr(F, op + "_backward")(grad, *xs, **attrs)
    got = got if isinstance(got, tuple) else (got,)
    assert len(got) == len(wrt)
    for g, w, x in zip(got, want, wrt):
        assert g.shape == x.shape and g.dtype == DTYPES[dtype]
        assert_matches(op + "_backward", dtype, g, torch.zeros_like(x) if w is None else w)


CAST_SOURCES = ("f32", "f16", "bf16", "f64", "i32", "bool")
CAST_TARGETS = [d for d in baracuda.dtypes]


def _rounded_once(x, significand_bits):
    """float64 values (positive normals) rounded to `significand_bits`, half to even, exactly in float64."""
    m, e = torch.frexp(x)  # x = m 2^e, m in [0.5, 1)
    return torch.ldexp(torch.round(m * 2.0**significand_bits), e - significand_bits)  # torch.round: half to even


@pytest.mark.parametrize("source", CAST_SOURCES)
@pytest.mark.parametrize("target", CAST_TARGETS)
def test_cast(source, target):
    x = torch.empty((33, 65), dtype=torch.float64, device="cuda").uniform_(0, 100)
    x = x.to(DTYPES[source]) if source != "bool" else x > 50
    got = F.to(x, target)
    want = x.to(getattr(torch, baracuda._interop._FRAMEWORK_NAME[target]))
    if source == "f64" and target in ("f16", "bf16"):
        # torch converts float64 to half types through float32 (two roundings, which differ from one
        # about once in 2^14 elements for f16, 2^17 for bf16); we round once, as numpy does.
        x = x.clamp_min(2.0**-14)  # normal in both types, so a fixed significand width
        x[0, 0], x[0, 1] = 1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-8 + 2.0**-40  # just past a half / bf16 tie
        got = F.to(x, target)
        want = _rounded_once(x, 11 if target == "f16" else 8).to(want.dtype)
    assert got.dtype == want.dtype and got.shape == want.shape
    if target.startswith("fp8"):
        got, want = got.float(), want.float()
    elif target == "u32":  # few torch kernels take uint32: compare the bits
        got, want = got.view(torch.int32), want.view(torch.int32)
    assert torch.equal(got, want), f"{source} -> {target}"


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "f64", "i32", "bool", "c64", "fp8_e4m3"])
def test_fill(dtype):
    like = torch.empty((7, 9), device="cuda")
    got = F.full_like(like, 1, dtype=dtype)
    want = torch.ones((7, 9), device="cuda").to(getattr(torch, baracuda._interop._FRAMEWORK_NAME[dtype]))
    assert got.dtype == want.dtype
    if dtype.startswith("fp8"):
        got, want = got.float(), want.float()
    assert torch.equal(got, want)


def test_streams_devices_and_autograd_tensors():
    x = torch.randn(1000, 1000, device="cuda", requires_grad=True)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = F.silu(x)  # runs on `stream`, like torch ops would
    stream.synchronize()
    torch.testing.assert_close(y, TF.silu(x.detach()))
    assert y.device == x.device and not y.requires_grad
    with pytest.raises(ValueError, match="is on"):
        F.add(x.detach(), torch.ones(1000, 1000))  # CUDA and host operands
    cpu = F.gelu(torch.linspace(-3, 3, 11, dtype=torch.float64))  # torch CPU tensors run on the host backend
    torch.testing.assert_close(cpu, TF.gelu(torch.linspace(-3, 3, 11, dtype=torch.float64)))
    assert baracuda.plan_info("gelu", [("f32", (8,))], device="cuda")["backend"] == "cuda"
