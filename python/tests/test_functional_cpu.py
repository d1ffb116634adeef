"""baracuda.functional on the host backend, numpy only: every op family
against closed forms in float64, broadcasting, out=, in-place, strided
inputs, error messages and backward ops against finite differences.

Run: PYTHONPATH=<build>/python python3 -m pytest python/tests -q
"""
import math

import numpy as np
import pytest

import baracuda
import baracuda.functional as F

OPS = {op["name"]: op for op in baracuda.ops()}
DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16}
# Host kernels do the math in f64: only the final rounding (and libm) differs.
TOL = {"f64": (1e-10, 1e-12), "f32": (2e-6, 1e-6), "f16": (2e-3, 2e-3)}

_erf = np.vectorize(math.erf, otypes=[float])
_erfc = np.vectorize(math.erfc, otypes=[float])
_lgamma = np.vectorize(math.lgamma, otypes=[float])


def _digamma(x):
    """psi(x) = psi(x + 10) - sum 1/(x + k), psi(x + 10) by a 4th-order difference of lgamma."""
    shift, h = 10.0, 1e-3
    y = x + shift
    d = (-_lgamma(y + 2 * h) + 8 * _lgamma(y + h) - 8 * _lgamma(y - h) + _lgamma(y - 2 * h)) / (12 * h)
    return d - sum(1.0 / (x + k) for k in range(int(shift)))


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


def _gelu(x):
    return x * 0.5 * (1 + _erf(x / math.sqrt(2)))


SELU_ALPHA, SELU_SCALE = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946

UNARY = {
    "neg": lambda x: -x, "abs": np.abs, "sign": np.sign, "square": np.square, "reciprocal": lambda x: 1 / x,
    "cube": lambda x: x ** 3, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "cbrt": np.cbrt,
    "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log, "log2": np.log2, "log10": np.log10,
    "log1p": np.log1p, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh, "floor": np.floor, "ceil": np.ceil, "round": np.round,
    "trunc": np.trunc, "frac": lambda x: x - np.trunc(x), "relu": lambda x: np.maximum(x, 0),
    "relu6": lambda x: np.clip(x, 0, 6), "gelu": _gelu,
    "gelu_tanh": lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
    "silu": lambda x: x * _sigmoid(x), "mish": lambda x: x * np.tanh(np.log1p(np.exp(x))), "sigmoid": _sigmoid,
    "softplus": lambda x, beta, threshold: np.where(x * beta > threshold, x, np.log1p(np.exp(beta * x)) / beta),
    "hardswish": lambda x: x * np.clip(x + 3, 0, 6) / 6, "hardsigmoid": lambda x: np.clip(x + 3, 0, 6) / 6,
    "hardtanh": lambda x, min_val, max_val: np.clip(x, min_val, max_val), "erf": _erf, "erfc": _erfc,
    "lgamma": _lgamma, "digamma": _digamma,
    "logit": lambda x, eps: (lambda z: np.log(z / (1 - z)))(np.clip(x, eps, 1 - eps) if eps >= 0 else x),
    "softsign": lambda x: x / (1 + np.abs(x)), "tanhshrink": lambda x: x - np.tanh(x),
    "selu": lambda x: SELU_SCALE * np.where(x > 0, x, SELU_ALPHA * np.expm1(x)),
    "leaky_relu": lambda x, negative_slope: np.where(x > 0, x, negative_slope * x),
    "elu": lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x)),
    "celu": lambda x, alpha: np.where(x > 0, x, alpha * np.expm1(x / alpha)),
    "hardshrink": lambda x, lambd: np.where(np.abs(x) <= lambd, 0, x),
    "softshrink": lambda x, lambd: np.where(x > lambd, x - lambd, np.where(x < -lambd, x + lambd, 0)),
    "step": lambda x: (x > 0).astype(float), "threshold": lambda x, threshold, value: np.where(x > threshold, x, value),
    "pow_scalar": lambda x, exponent: x ** exponent, "affine": lambda x, scale, shift: scale * x + shift,
}
BINARY = {
    "add": lambda a, b, alpha: a + alpha * b, "sub": lambda a, b, alpha: a - alpha * b, "mul": np.multiply,
    "div": np.divide, "pow": np.power, "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign,
    "fmax": np.fmax, "fmin": np.fmin, "maximum": np.maximum, "minimum": np.minimum,
    "floor_divide": np.floor_divide, "fmod": np.fmod, "remainder": np.remainder,
    "prelu": lambda a, w: np.where(a > 0, a, w * a),
}
COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal, "logical_and": np.logical_and, "logical_or": np.logical_or,
           "logical_xor": np.logical_xor}
TERNARY = {
    "clamp": lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi), "fma": lambda a, b, c: a * b + c,
    "addcmul": lambda x, a, b, value: x + value * a * b, "addcdiv": lambda x, a, b, value: x + value * a / b,
    "lerp": lambda a, b, w: a + w * (b - a),
}
GATED = {"glu": lambda a, b: a * _sigmoid(b), "reglu": lambda a, b: np.maximum(a, 0) * b,
         "swiglu": lambda a, b: a * _sigmoid(a) * b, "geglu": lambda a, b: _gelu(a) * b}


def sample(op, index, shape, dtype, rng):
    """Random input `index` of `op` from the registry's domain for it."""
    lo, hi, symmetric = OPS[op]["domains"][min(index, len(OPS[op]["domains"]) - 1)]
    x = rng.uniform(lo, hi, shape)
    if symmetric:
        x *= rng.choice([-1.0, 1.0], shape)
    if OPS[op]["integer_inputs"]:
        x = np.round(x)
    return x.astype(dtype)


def check(op, dtype, got, want):
    rtol, atol = TOL[dtype]
    scale = OPS[op]["tolerance_scale"]
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=rtol * scale, atol=atol * scale, err_msg=op)


def float_cases(table):
    return [(op, dt, attrs) for op in table for dt in DTYPES if dt in OPS[op]["dtypes"]
            for attrs in OPS[op]["sample_attrs"]]


# ---------------------------------------------------------------- forward values

@pytest.mark.parametrize("op,dtype,attrs", float_cases(UNARY))
def test_unary(op, dtype, attrs):
    rng = np.random.default_rng(0)
    x = sample(op, 0, (5, 7), DTYPES[dtype], rng)
    full_attrs = {**OPS[op]["attrs"], **attrs}
    got = getattr(F, op)(x, **attrs)
    assert got.dtype == x.dtype and got.shape == x.shape
    check(op, dtype, got, UNARY[op](x.astype(np.float64), **full_attrs))


@pytest.mark.parametrize("op,dtype,attrs", float_cases(BINARY))
def test_binary_broadcast(op, dtype, attrs):
    rng = np.random.default_rng(1)
    a = sample(op, 0, (3, 1, 5), DTYPES[dtype], rng)
    b = sample(op, 1, (4, 5), DTYPES[dtype], rng)
    if op == "prelu":
        got = F._call("prelu", (a, b), {})  # the raw op broadcasts weight like any operand
    else:
        got = getattr(F, op)(a, b, **attrs)
    assert got.shape == (3, 4, 5) and got.dtype == a.dtype
    check(op, dtype, got, BINARY[op](a.astype(np.float64), b.astype(np.float64), **{**OPS[op]["attrs"], **attrs}))


@pytest.mark.parametrize("op,dtype,attrs", float_cases(TERNARY))
def test_ternary(op, dtype, attrs):
    rng = np.random.default_rng(2)
    args = [sample(op, i, s, DTYPES[dtype], rng) for i, s in enumerate([(4, 6), (6,), (4, 1)])]
    got = F._call(op, args, {**OPS[op]["attrs"], **attrs})
    f64 = [a.astype(np.float64) for a in args]
    check(op, dtype, got, TERNARY[op](*f64, **{**OPS[op]["attrs"], **attrs}))


@pytest.mark.parametrize("op,dtype", [(op, dt) for op in GATED for dt in DTYPES])
@pytest.mark.parametrize("dim", [-1, 0])
def test_gated(op, dtype, dim):
    x = sample(op, 0, (4, 6), DTYPES[dtype], np.random.default_rng(3))
    a, b = np.split(x.astype(np.float64), 2, axis=dim)
    got = getattr(F, op)(x, dim=dim)
    assert got.shape == a.shape
    check(op, dtype, got, GATED[op](a, b))


@pytest.mark.parametrize("op", sorted(COMPARE))
@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32, np.bool_])
def test_compare(op, dtype):
    rng = np.random.default_rng(4)
    a = rng.integers(-2, 3, (3, 4)).astype(dtype)
    b = rng.integers(-2, 3, (4,)).astype(dtype)
    got = getattr(F, op)(a, b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, COMPARE[op](a, b))


@pytest.mark.parametrize("op,ref", [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                                    ("maximum", np.maximum), ("minimum", np.minimum),
                                    ("floor_divide", np.floor_divide), ("fmod", np.fmod),
                                    ("remainder", np.remainder), ("bitwise_and", np.bitwise_and),
                                    ("bitwise_or", np.bitwise_or), ("bitwise_xor", np.bitwise_xor),
                                    ("bitwise_left_shift", np.left_shift),
                                    ("bitwise_right_shift", np.right_shift)])
def test_integer_binary(op, ref):
    rng = np.random.default_rng(5)
    a = rng.integers(-50, 50, (6, 5)).astype(np.int32)
    b = rng.integers(1, 9, (5,)).astype(np.int32) * (1 if "shift" in op else rng.choice([-1, 1], 5).astype(np.int32))
    np.testing.assert_array_equal(getattr(F, op)(a, b), ref(a, b))


def test_integer_unary_and_bool():
    x = np.arange(-5, 5, dtype=np.int32)
    np.testing.assert_array_equal(F.neg(x), -x)
    np.testing.assert_array_equal(F.abs(x), np.abs(x))
    np.testing.assert_array_equal(F.square(x), x * x)
    np.testing.assert_array_equal(F.bitwise_not(x), ~x)
    np.testing.assert_array_equal(F.clamp(x, -2, 3), np.clip(x, -2, 3))
    np.testing.assert_array_equal(F.clamp(x, max=1), np.minimum(x, 1))
    p = np.array([True, False, True])
    q = np.array([True, True, False])
    np.testing.assert_array_equal(F.bitwise_not(p), ~p)
    np.testing.assert_array_equal(F.bitwise_xor(p, q), p ^ q)
    np.testing.assert_array_equal(F.logical_not(x), x == 0)


def test_predicates():
    x = np.array([0.0, np.nan, np.inf, -np.inf, -1.5], np.float32)
    np.testing.assert_array_equal(F.isnan(x), np.isnan(x))
    np.testing.assert_array_equal(F.isinf(x), np.isinf(x))
    np.testing.assert_array_equal(F.isfinite(x), np.isfinite(x))


def test_nextafter_is_one_ulp():
    a = np.array([1.0, -2.0, 0.0], np.float32)
    b = np.array([2.0, -3.0, -1.0], np.float32)
    np.testing.assert_array_equal(F.nextafter(a, b), np.nextafter(a, b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
def test_where(dtype):
    rng = np.random.default_rng(6)
    c = rng.random((3, 1)) > 0.5
    a = rng.integers(0, 2, (3, 4)).astype(dtype)
    b = rng.integers(0, 2, (4,)).astype(dtype)
    np.testing.assert_array_equal(F.where(c, a, b), np.where(c, a, b))
    if dtype != np.bool_:
        np.testing.assert_array_equal(F.where(c, a, 7), np.where(c, a, dtype(7)))


@pytest.mark.parametrize("target", ["f32", "f64", "f16", "i8", "u8", "i16", "i32", "i64", "u32", "bool", "c64", "c128"])
def test_cast(target):
    x = np.random.default_rng(7).uniform(0, 100, (4, 5)).astype(np.float32)
    got = F.to(x, target)
    want = x.astype(baracuda._interop.numpy_dtype(target))
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_cast_spellings_and_saturation():
    x = np.array([np.nan, 1e10, -1e10, -2.7], np.float32)
    np.testing.assert_array_equal(F.to(x, np.int32), [0, 2**31 - 1, -2**31, -2])
    assert F.to(x, "float16").dtype == np.float16 and F.cast(x, np.float64).dtype == np.float64
    assert F.to(x, "half").dtype == np.float16
    np.testing.assert_array_equal(F.to(np.array([0, 3, -1], np.int32), "bool"), [False, True, True])


def test_fill_and_full():
    x = np.zeros((2, 3), np.float16)
    assert F.fill_(x, 1.5) is x and (x == 1.5).all()
    y = F.full_like(x, 3, dtype="i32")
    assert y.dtype == np.int32 and y.shape == (2, 3) and (y == 3).all()
    z = F.full((2, 2), 2.5)
    assert z.dtype == np.float32 and (z == 2.5).all()
    assert F.full(3, True).dtype == np.bool_ and F.full(3, 4).dtype == np.int64
    assert F.full((0, 4), 1.0).shape == (0, 4)


# ---------------------------------------------------------------- torch conventions

def test_torch_signatures():
    x = np.linspace(-3, 3, 13)
    np.testing.assert_allclose(F.gelu(x, approximate="tanh"), UNARY["gelu_tanh"](x), rtol=1e-12)
    np.testing.assert_allclose(F.gelu(x), _gelu(x), rtol=1e-12)
    with pytest.raises(ValueError, match="approximate"):
        F.gelu(x, approximate="fast")
    np.testing.assert_allclose(F.pow(np.abs(x) + 1, 2.5), (np.abs(x) + 1) ** 2.5, rtol=1e-12)
    np.testing.assert_allclose(F.pow(2.0, x), 2.0 ** x, rtol=1e-12)
    np.testing.assert_allclose(F.pow(np.abs(x) + 1, x), (np.abs(x) + 1) ** x, rtol=1e-12)
    np.testing.assert_allclose(F.add(x, x, alpha=2), 3 * x)
    np.testing.assert_allclose(F.sub(x, 1.0), x - 1)
    np.testing.assert_allclose(F.div(x, 2.0, rounding_mode="floor"), np.floor(x / 2))
    np.testing.assert_allclose(F.div(x, 2.0, rounding_mode="trunc"), np.trunc(x / 2))
    np.testing.assert_allclose(F.clamp(x, min=0), np.maximum(x, 0))
    np.testing.assert_allclose(F.clip(x, -1, np.full_like(x, 0.5)), np.clip(x, -1, 0.5))
    with pytest.raises(ValueError, match="at least one"):
        F.clamp(x)
    np.testing.assert_allclose(F.hardtanh(x, -0.5, 0.5), np.clip(x, -0.5, 0.5))
    np.testing.assert_allclose(F.threshold(x, 0.5, -1.0), np.where(x > 0.5, x, -1.0))
    np.testing.assert_allclose(F.leaky_relu(x, 0.2), np.where(x > 0, x, 0.2 * x))
    np.testing.assert_allclose(F.lerp(x, 2 * x, 0.25), 1.25 * x)
    np.testing.assert_allclose(F.addcmul(x, x, x, value=2), x + 2 * x * x)
    z = np.linspace(0.01, 0.99, 7)
    np.testing.assert_allclose(F.logit(z), np.log(z / (1 - z)), rtol=1e-12)
    np.testing.assert_allclose(F.logit(z, eps=0.1), UNARY["logit"](z, 0.1), rtol=1e-12)
    np.testing.assert_allclose(baracuda.special.expit(x), _sigmoid(x), rtol=1e-12)
    np.testing.assert_allclose(baracuda.special.gammaln(z), _lgamma(z), rtol=1e-12)


def test_prelu_channels():
    rng = np.random.default_rng(8)
    x = rng.normal(size=(2, 3, 4))
    w = np.array([0.1, 0.2, 0.3])
    np.testing.assert_allclose(F.prelu(x, w), np.where(x > 0, x, w[None, :, None] * x))
    np.testing.assert_allclose(F.prelu(x, np.array([0.25])), np.where(x > 0, x, 0.25 * x))
    with pytest.raises(ValueError, match="prelu"):
        F.prelu(x, np.ones(4))


# ---------------------------------------------------------------- layouts and out=

def test_out_and_inplace():
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    y = np.empty_like(x)
    assert F.exp(x, out=y) is y
    np.testing.assert_allclose(y, np.exp(x), rtol=2e-6)
    z = x.copy()
    assert F.relu(z, inplace=True) is z
    np.testing.assert_array_equal(z, np.maximum(x, 0))
    da, db = np.empty((3, 4)), np.empty((4,))
    got = F.mul_backward(np.ones((3, 4)), np.ones((3, 4)), np.ones(4), out=(da, db))
    assert got[0] is da and got[1] is db and (db == 3).all()
    with pytest.raises(ValueError, match="'out'"):
        F.exp(x, out=np.empty((4, 3), np.float32))
    with pytest.raises(ValueError, match="'out'.*dtype"):
        F.exp(x, out=np.empty((3, 4), np.float64))


@pytest.mark.parametrize("view", ["columns", "transpose", "reversed", "broadcast"])
def test_strided_inputs(view):
    base = np.random.default_rng(9).normal(size=(6, 10))
    x = {"columns": base[:, ::2], "transpose": base.T, "reversed": base[::-1, ::-3],
         "broadcast": np.broadcast_to(base[:1], (6, 10))}[view]
    np.testing.assert_allclose(F.tanh(x), np.tanh(x), rtol=1e-12)
    np.testing.assert_allclose(F.atan2(x, x + 1.5), np.arctan2(x, x + 1.5), rtol=1e-12)
    out = np.empty((x.shape[1], x.shape[0])).T  # a transposed output
    F.sin(x, out=out)
    np.testing.assert_allclose(out, np.sin(x), rtol=1e-12)


def test_empty_and_scalar_arrays():
    assert F.exp(np.empty((0, 3), np.float32)).shape == (0, 3)
    np.testing.assert_allclose(F.exp(np.array(1.0)), math.e)
    np.testing.assert_allclose(F.add(2.0, 3.0), 5.0)
    np.testing.assert_allclose(F.sin([0.0, 1.0]), np.sin([0.0, 1.0]))


# ---------------------------------------------------------------- errors

def test_errors_name_the_operand():
    a, b = np.ones((3, 4), np.float32), np.ones((5,), np.float32)
    with pytest.raises(ValueError, match="add: shapes do not broadcast.*'other'"):
        F.add(a, b)
    with pytest.raises(ValueError, match="'other' has dtype f64"):
        F.mul(a, np.ones(4))
    with pytest.raises(baracuda.UnsupportedError, match="i32"):
        F.sin(np.ones(3, np.int32))
    with pytest.raises(TypeError):  # UnsupportedError is a TypeError and a NotImplementedError
        F.sin(np.ones(3, np.int32))
    with pytest.raises(NotImplementedError):
        F.sin(np.ones(3, np.complex64))
    with pytest.raises(baracuda.UnsupportedError, match="uint16"):
        F.exp(np.ones(3, np.uint16))
    with pytest.raises(ValueError, match="must be even"):
        F.glu(np.ones((3, 5)))
    with pytest.raises(ValueError, match="rank 9"):
        F.exp(np.ones((1,) * 9))
    with pytest.raises(TypeError, match="unknown attribute 'alpha'"):
        baracuda.run("exp", [a], [a], {"alpha": 1})
    with pytest.raises(ValueError, match="unknown op"):
        baracuda.infer("no_such_op", [("f32", (3,))])
    with pytest.raises(TypeError, match="writable"):
        ro = np.empty((3, 4), np.float32)
        ro.flags.writeable = False
        F.exp(a, out=ro)
    with pytest.raises(ValueError, match="grad_output"):
        F.mul_backward(np.ones((2, 2)), np.ones((3, 4)), np.ones((3, 4)))


# ---------------------------------------------------------------- backward vs finite differences

def numeric_grads(f, inputs, grad, h=1e-6):
    """d sum(grad * f(*inputs)) / d input, by central differences, for each input."""
    grads = []
    for i, x in enumerate(inputs):
        g = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            plus = [a.copy() for a in inputs]
            minus = [a.copy() for a in inputs]
            plus[i][idx] += h
            minus[i][idx] -= h
            g[idx] = np.sum(grad * (f(*plus) - f(*minus))) / (2 * h)
        grads.append(g)
    return grads


BACKWARD_CASES = [
    ("gelu", [(3, 4)], {}), ("gelu", [(3, 4)], {"approximate": "tanh"}), ("silu", [(3, 4)], {}),
    ("mish", [(3, 4)], {}), ("softplus", [(3, 4)], {"beta": 2.0, "threshold": 3.0}), ("elu", [(5,)], {"alpha": 0.5}),
    ("tanh", [(3, 4)], {}), ("log1p", [(3, 4)], {}), ("lgamma", [(6,)], {}), ("digamma", [(6,)], {}),
    ("logit", [(6,)], {"eps": None}), ("atan", [(6,)], {}), ("erfc", [(6,)], {}),
    ("add", [(3, 4), (4,)], {"alpha": 2.5}), ("mul", [(3, 1), (1, 4)], {}), ("div", [(3, 4), (3, 1)], {}),
    ("pow", [(3, 4), (4,)], {}), ("atan2", [(2, 3), (3,)], {}), ("hypot", [(2, 3), (2, 1)], {}),
    ("addcdiv", [(2, 3), (3,), (2, 1)], {"value": 2.0}), ("lerp", [(2, 3), (2, 3), (3,)], {}),
    ("fma", [(2, 3), (3,), (2, 1)], {}), ("glu", [(2, 6)], {"dim": -1}), ("swiglu", [(4, 3)], {"dim": 0}),
    ("geglu", [(2, 4)], {}), ("reglu", [(2, 4)], {}),
]


@pytest.mark.parametrize("op,shapes,attrs", BACKWARD_CASES, ids=lambda v: str(v))
def test_backward_matches_finite_differences(op, shapes, attrs):
    rng = np.random.default_rng(10)
    raw = "gelu_tanh" if attrs.get("approximate") == "tanh" else op
    xs = [sample(raw, i, s, np.float64, rng) for i, s in enumerate(shapes)]
    fwd = getattr(F, op)
    y = fwd(*xs, **attrs)
    grad = rng.uniform(-1, 1, y.shape)
    got = getattr(F, op + "_backward")(grad, *xs, **attrs)
    got = got if isinstance(got, tuple) else (got,)
    want = numeric_grads(lambda *a: fwd(*a, **attrs), xs, grad)
    for g, w, x in zip(got, want, xs):
        assert g.shape == x.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=op)


def test_special_backward_signatures():
    rng = np.random.default_rng(11)
    x = rng.uniform(0.5, 2, (3, 4))
    g = rng.uniform(-1, 1, (3, 4))
    np.testing.assert_allclose(F.pow_backward(g, x, 3.0), g * 3 * x ** 2, rtol=1e-12)
    gx, gw = F.prelu_backward(g.reshape(1, 3, 4), -x.reshape(1, 3, 4), np.array([0.1, 0.2, 0.3]))
    assert gw.shape == (3,)
    np.testing.assert_allclose(gw, (g * -x).sum(axis=1), rtol=1e-12)
    c = rng.random((3, 1)) > 0.5
    ga, gb = F.where_backward(g, c, x, np.ones(4))
    assert ga.shape == (3, 4) and gb.shape == (4,)
    np.testing.assert_allclose(ga, np.where(c, g, 0))
    np.testing.assert_allclose(gb, np.where(c, 0, g).sum(axis=0))
    dx, dlo, dhi = F.clamp_backward(g, x, 0.8, np.full(4, 1.5))
    np.testing.assert_allclose(dx, np.where((x >= 0.8) & (x <= 1.5), g, 0))
    np.testing.assert_allclose(dhi, np.where(x > 1.5, g, 0).sum(axis=0))
    np.testing.assert_allclose(F.logit_backward(g, x / 3, eps=0.2), np.where((x / 3 >= 0.2) & (x / 3 <= 0.8),
                                                                              g / (x / 3 * (1 - x / 3)), 0))


# ---------------------------------------------------------------- registry

def test_registry_and_plan_info():
    names = set(OPS)
    for op in OPS.values():
        assert {"name", "family", "direction", "gradient", "input_names", "output_names", "variadic", "dtypes",
                "attrs"} <= set(op)
        if op["direction"] == "forward" and op["gradient"]:
            assert op["gradient"] in names
    assert OPS["grouped_gemm"]["variadic"] and not OPS["mm"]["variadic"]
    assert F.relu.__doc__ and "f32" in F.relu.__doc__
    info = baracuda.plan_info("add", [("f32", (3, 1)), ("f32", (4,))])
    assert info["backend"] == "host" and info["outputs"] == [("f32", [3, 4])]
    assert baracuda.infer("fill", [], {"value": 1}, outputs=[("f16", (2,))]) == [("f16", [2])]
    assert isinstance(baracuda.cuda_available(), bool)
    assert baracuda.dtypes[baracuda._C.dtype_code("bfloat16")] == "bf16"


def test_set_deterministic_reaches_every_plan():
    """F.set_deterministic(True) asks every plan chosen afterwards to give the same bits run to run: plan_info
    reports it, calls still run (the host backend is deterministic), and the flag is part of the plan caches'
    keys, so plans chosen before it are not reused after it."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    baracuda._C.clear_plan_cache()
    try:
        F.set_deterministic(True)
        assert baracuda._C.get_deterministic()
        assert baracuda.plan_info("sum", [("f32", (3, 4))], {"dims": 1})["deterministic"]
        np.testing.assert_allclose(F.sum(x, dim=1), x.sum(1))
        F.set_deterministic(False)
        assert not baracuda._C.get_deterministic()
        np.testing.assert_allclose(F.sum(x, dim=1), x.sum(1))
        assert baracuda._C.plan_cache_size() == 2  # one plan a setting
    finally:
        F.set_deterministic(False)
