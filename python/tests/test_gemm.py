"""Matrix products through baracuda.functional: on numpy arrays (host
backend) against numpy in float64, and on CUDA tensors against torch
(skipped without torch + CUDA), forward and backward, every candidate."""
import numpy as np
import pytest

import baracuda
import baracuda.functional as F
from torch_parity import CUDA, DTYPES, close, gpu, torch

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.uniform(-2, 2, size=shape)


# ---------------------------------------------------------------- host backend vs numpy

@pytest.mark.parametrize("a_shape,b_shape", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((4,), (2, 4, 3)),
                                             ((2, 1, 3, 4), (5, 4, 2)), ((4,), (4,)), ((3, 4), (4,))])
def test_matmul_matches_numpy(a_shape, b_shape):
    a, b = _x(*a_shape), _x(*b_shape)
    np.testing.assert_allclose(F.matmul(a, b), np.matmul(a, b), rtol=1e-12, atol=1e-12)


def test_named_products_match_numpy():
    a, b, c, v = _x(3, 4), _x(4, 5), _x(5), _x(4)
    np.testing.assert_allclose(F.mm(a, b), a @ b, rtol=1e-12)
    np.testing.assert_allclose(F.mv(a, v), a @ v, rtol=1e-12)
    np.testing.assert_allclose(F.dot(v, v), v @ v, rtol=1e-12)
    np.testing.assert_allclose(F.bmm(_x(2, 3, 4)[:1], _x(1, 4, 5)).shape, (1, 3, 5))
    np.testing.assert_allclose(F.addmm(c, a, b, beta=0.5, alpha=2), 0.5 * c + 2 * (a @ b), rtol=1e-12)
    x, w, bias = _x(2, 3, 4), _x(6, 4), _x(6)
    np.testing.assert_allclose(F.linear(x, w, bias), x @ w.T + bias, rtol=1e-12)
    np.testing.assert_allclose(F.linear(x, w), x @ w.T, rtol=1e-12)
    np.testing.assert_allclose(F.linear(x, w, bias, activation="relu"), np.maximum(x @ w.T + bias, 0), rtol=1e-12)
    a3, g = _x(2, 3, 4), _x(2, 3, 5)
    ga, gb = F.matmul_backward(g, a3, b)
    np.testing.assert_allclose(ga, g @ b.T, rtol=1e-12)
    np.testing.assert_allclose(gb, np.einsum("bmk,bmn->kn", a3, g), rtol=1e-12)
    gi, gw, gbias = F.linear_backward(g[..., :4] @ np.eye(4, 6), x, w)
    np.testing.assert_allclose(gbias, (g[..., :4] @ np.eye(4, 6)).sum(axis=(0, 1)), rtol=1e-12)


def test_non_contiguous_views_fall_back_to_a_candidate_that_takes_them():
    a = _x(6, 8)[::-1, ::2]  # negative row stride, gaps
    b = _x(4, 3)
    np.testing.assert_allclose(F.mm(a, b), a @ b, rtol=1e-12)


# ---------------------------------------------------------------- CUDA vs torch

def _t(shape, dtype, scale=1.0):
    return (torch.rand(shape, device="cuda", dtype=torch.float64) * 4 - 2).mul(scale).to(getattr(torch, dtype))


def _run(op, inputs, outputs, attrs, backend):
    baracuda._baracuda.run(op, inputs, outputs, attrs, torch.cuda.current_stream().cuda_stream, None, backend, None)
    return outputs


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["cublaslt", "cuda"])
@pytest.mark.parametrize("a_shape,b_shape", [((64, 96), (96, 80)), ((3, 37, 45), (45, 29)), ((45,), (2, 45, 7)),
                                             ((2, 1, 5, 16), (3, 16, 8)), ((200,), (200,)), ((31, 200), (200,))])
def test_matmul_matches_torch_on_every_candidate(dtype, backend, a_shape, b_shape):
    a, b = _t(a_shape, dtype), _t(b_shape, dtype)
    ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    want = torch.matmul(ad, bd)
    got, = _run("matmul", [a, b], [torch.empty(want.shape, device="cuda", dtype=a.dtype)], {}, backend)
    close(got, want.detach(), dtype, scale=8, msg=f"{backend} {a_shape} @ {b_shape}")
    g = _t(want.shape, dtype)
    want.backward(g.double())
    ga, gb = _run("matmul_backward", [g, a, b], [torch.empty_like(a), torch.empty_like(b)], {"alpha": 1.0}, backend)
    close(ga, ad.grad, dtype, scale=8, msg=f"{backend} grad a {a_shape} @ {b_shape}")
    close(gb, bd.grad, dtype, scale=8, msg=f"{backend} grad b {a_shape} @ {b_shape}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu", "gelu_tanh", "silu"])
def test_linear_matches_torch(dtype, activation):
    x, w, bias = _t((4, 33, 96), dtype), _t((72, 96), dtype, 0.2), _t((72,), dtype)
    ref = torch.nn.functional.linear(x.double(), w.double(), bias.double())
    act = {None: lambda v: v, "relu": torch.relu, "gelu": torch.nn.functional.gelu,
           "gelu_tanh": lambda v: torch.nn.functional.gelu(v, approximate="tanh"), "silu": torch.nn.functional.silu}
    close(F.linear(x, w, bias, activation=activation), act[activation](ref), dtype, scale=8, msg=str(activation))
    g = _t(ref.shape, dtype)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, bias))
    torch.nn.functional.linear(xd, wd, bd).backward(g.double())
    gi, gw, gb = F.linear_backward(g, x, w)
    close(gi, xd.grad, dtype, scale=8)
    close(gw, wd.grad, dtype, scale=16)
    close(gb, bd.grad, dtype, scale=16)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_addmm_baddbmm_match_torch(dtype):
    for c_shape in [(40, 24), (24,), (40, 1)]:
        c, a, b = _t(c_shape, dtype), _t((40, 56), dtype), _t((56, 24), dtype)
        close(F.addmm(c, a, b, beta=0.5, alpha=-2),
              torch.addmm(c.double(), a.double(), b.double(), beta=0.5, alpha=-2), dtype, scale=8)
    c, a, b = _t((3, 1, 24), dtype), _t((3, 40, 56), dtype), _t((3, 56, 24), dtype)
    close(F.baddbmm(c, a, b, beta=2, alpha=1), torch.baddbmm(c.double(), a.double(), b.double(), beta=2), dtype, scale=8)


@gpu
def test_transposed_and_strided_torch_views():
    a, b = _t((128, 64), "bfloat16").t(), _t((128, 96), "bfloat16")  # a column-major: cuBLASLt takes it
    close(F.mm(a, b), torch.mm(a.double(), b.double()), "bfloat16", scale=8)
    odd, w = _t((64, 256), "float32")[:, ::2], _t((128, 32), "float32")  # no unit stride: the bespoke kernel
    close(F.mm(odd, w), torch.mm(odd.double(), w.double()), "float32", scale=8)


@gpu
def test_int8_products_are_exact():
    a = torch.randint(-100, 100, (64, 96), device="cuda", dtype=torch.int8)
    b = torch.randint(-100, 100, (96, 32), device="cuda", dtype=torch.int8)
    got = F.mm(a, b)
    assert got.dtype == torch.int32
    assert torch.equal(got.cpu(), a.cpu().int() @ b.cpu().int())


@gpu
def test_tf32_switch():
    a, b = _t((256, 256), "float32"), _t((256, 256), "float32")
    exact = F.mm(a, b)
    close(exact, torch.mm(a.double(), b.double()), "float32", scale=8)
    F.set_allow_tf32(True)
    try:
        fast = F.mm(a, b)
    finally:
        F.set_allow_tf32(False)
    err = (fast.double() - torch.mm(a.double(), b.double())).abs().max().item()
    assert err < 0.2  # TF32 rounds inputs to 10-bit mantissas


# ---------------------------------------------------------------- scaled_mm (fp8)

def test_scaled_mm_host_is_exact_on_small_integers():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = RNG.integers(-2, 3, (37, 19)).astype(ml_dtypes.float8_e4m3fn)
    b = RNG.integers(-2, 3, (19, 45)).astype(ml_dtypes.float8_e5m2)
    bias = RNG.integers(-2, 3, 45).astype(ml_dtypes.bfloat16)
    sa, sb = np.array(0.5, np.float32), np.array([0.25], np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64) * 0.125
    got = F.scaled_mm(a, b, sa, sb, out_dtype="f32")
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(F.scaled_mm(a, b, sa, sb, bias, out_dtype="f32"), want + bias.astype(np.float64))
    assert F.scaled_mm(a, b, sa, sb).dtype == ml_dtypes.float8_e4m3fn  # torch's default: a's dtype


def test_scaled_mm_host_rowwise_and_blockwise_scales():
    """Power-of-two scales keep the small-integer sums exact; K = 300 spans three 128-blocks."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    m, k, n = 5, 300, 150
    a = RNG.integers(-2, 3, (m, k)).astype(ml_dtypes.float8_e4m3fn)
    b = RNG.integers(-2, 3, (k, n)).astype(ml_dtypes.float8_e4m3fn)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    pow2 = lambda *shape: np.exp2(RNG.integers(-2, 2, shape)).astype(np.float32)
    sa, sb = pow2(m, 1), pow2(1, n)
    np.testing.assert_array_equal(F.scaled_mm(a, b, sa, sb, out_dtype="f32"), (a64 * sa) @ (b64 * sb))
    sa, sb = pow2(m, 3), pow2(3, 2)
    want = (a64 * np.repeat(sa, 128, axis=1)[:, :k]) @ (b64 * np.repeat(np.repeat(sb, 128, axis=0), 128, axis=1)[:k, :n])
    np.testing.assert_array_equal(F.scaled_mm(a, b, sa, sb, out_dtype="f32"), want)
    with pytest.raises(Exception, match="'scale_b' must be \\[3, 2\\] for block-wise 'scale_a' \\[5, 3\\]"):
        F.scaled_mm(a, b, sa, sb[:, :1], out_dtype="f32")


def test_scaled_mm_host_fp8_output_saturates():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.array([[8.0] * 16, [-8.0] * 16, [np.nan] + [1.0] * 15, [0.125] * 16]).astype(ml_dtypes.float8_e4m3fn)
    b = np.full((16, 4), 8.0).astype(ml_dtypes.float8_e4m3fn)
    one, half = np.array(1.0, np.float32), np.array(0.5, np.float32)
    got = F.scaled_mm(a, b, one, one, scale_result=half).astype(np.float64)  # e4m3 out, torch's default
    np.testing.assert_array_equal(got[[0, 1, 3]], [[448.0] * 4, [-448.0] * 4, [8.0] * 4])
    assert np.isnan(got[2]).all()
    got = F.scaled_mm(a, b, one, one, scale_result=np.array(64.0, np.float32), out_dtype="fp8_e5m2").astype(np.float64)
    np.testing.assert_array_equal(got[[0, 1, 3]], [[57344.0] * 4, [-57344.0] * 4, [1024.0] * 4])
    with pytest.raises(Exception, match="'scale_result' scales an fp8 output only"):
        F.scaled_mm(a, b, one, one, scale_result=half, out_dtype="bf16")


def _fp8(shape, dtype):
    return _t(shape, "float32").to(getattr(torch, dtype))


@gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("types", [("float8_e4m3fn", "float8_e4m3fn"), ("float8_e4m3fn", "float8_e5m2"),
                                   ("float8_e5m2", "float8_e4m3fn")])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("fast", [False, True])
def test_scaled_mm_matches_torch(out_dtype, types, with_bias, fast):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 GEMMs need sm_89 or newer")
    m, k, n = 64, 96, 80
    a, b = _fp8((m, k), types[0]), _fp8((n, k), types[1]).t()  # b column-major, as torch._scaled_mm wants
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor([1.5], device="cuda")
    od = getattr(torch, out_dtype)
    bias = _t((n,), "float32").to(torch.float16 if od == torch.float16 else torch.bfloat16) if with_bias else None
    got = F.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=od, use_fast_accum=fast)
    assert got.dtype == od and got.shape == (m, n)
    want = (a.double() @ b.double()) * 0.75 + (bias.double() if with_bias else 0)
    # Hopper's fp8 tensor cores add in less than f32 precision (H100, K = 96:
    # differences up to 5e-4 at |x| ~ 10, 3e-3 with fast accumulation): an f32
    # output is held to that, relative to the largest sum, not to f32 rounding.
    if out_dtype == "float32":
        tol = 1e-3 if fast else 2.5e-4
        top = want.abs().max().item()

        def check(x, ref, msg):
            torch.testing.assert_close(x.double(), ref.double(), rtol=tol, atol=tol * top, msg=msg)
    else:
        def check(x, ref, msg):
            close(x, ref, out_dtype, scale=8, msg=msg)
    check(got, want, "vs f64")
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=od, use_fast_accum=fast)
    except RuntimeError as e:  # a pair or bias this torch build does not take
        pytest.skip(f"torch._scaled_mm: {e}")
    check(got, theirs, "vs torch._scaled_mm")


@gpu
@pytest.mark.parametrize("backend", ["cublaslt", "cuda"])
def test_scaled_mm_every_candidate(backend):
    """cuBLASLt on its layout; the bespoke kernel also on awkward sizes, b row-major and e5m2 x e5m2."""
    cases = [((64, 96, 80), "float8_e4m3fn", "float8_e4m3fn", True)]
    if backend == "cuda":
        cases += [((37, 19, 45), "float8_e4m3fn", "float8_e5m2", False), ((33, 64, 17), "float8_e5m2", "float8_e5m2", True)]
    for (m, k, n), ta, tb, col_major in cases:
        a = _fp8((m, k), ta)
        b = _fp8((n, k), tb).t() if col_major else _fp8((k, n), tb)
        sa, sb = torch.tensor(2.0, device="cuda"), torch.tensor(0.25, device="cuda")
        bias = _t((n,), "bfloat16")
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        none = torch.empty(0, device="cuda")
        _run("scaled_mm", [a, b, sa, sb, bias, none], [out], {"out_dtype": baracuda._baracuda.dtype_code("bf16")}, backend)
        close(out, (a.double() @ b.double()) * 0.5 + bias.double(), "bfloat16", scale=8, msg=f"{backend} {m}x{k}x{n}")


def _torch_scaled_mm(*args, **kwargs):
    try:
        return torch._scaled_mm(*args, **kwargs)
    except (RuntimeError, ValueError) as e:  # a form this torch build or GPU does not take
        pytest.skip(f"torch._scaled_mm: {e}")


def _scaled_mm_plan(a, b, sa, sb, bias, out_dtype, backend=None):
    """plan_info of scaled_mm on these operands (select's choice, or `backend`'s)."""
    none = torch.empty(0, device="cuda")
    bias = bias if bias is not None else torch.empty(0, device="cuda", dtype=torch.bfloat16)
    specs = [F._spec(x) for x in (a, b, sa, sb, bias, none)]
    attrs = {"out_dtype": baracuda._baracuda.dtype_code(str(out_dtype).replace("torch.", "")), "use_fast_accum": 0}
    return baracuda.plan_info("scaled_mm", specs, attrs, device="cuda", backend=backend)


def _expect_cutlass(a, b, sa, sb, bias, out_dtype):
    """On sm_90 with the CUTLASS kernels built, select picks them for row-wise and block-wise scales."""
    if torch.cuda.get_device_capability() != (9, 0):
        return
    try:
        _scaled_mm_plan(a, b, sa, sb, bias, out_dtype, backend="cutlass")
    except Exception:  # a build without the CUTLASS headers: nothing to check
        return
    info = _scaled_mm_plan(a, b, sa, sb, bias, out_dtype)
    assert info["backend"] == "cutlass", info["sku"]


@gpu
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("m,k,n", [(64, 96, 80), (128, 512, 256), (200, 272, 264)])
def test_scaled_mm_rowwise_matches_torch(m, k, n, with_bias):
    """torch's row-wise form: scale_a [M, 1], scale_b [1, N], bf16 out (CUTLASS on sm_90)."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("row-wise fp8 scales need sm_90")
    a, b = _fp8((m, k), "float8_e4m3fn"), _fp8((n, k), "float8_e4m3fn").t()
    sa = torch.rand(m, 1, device="cuda") + 0.5
    sb = torch.rand(1, n, device="cuda") + 0.5
    bias = _t((n,), "bfloat16") if with_bias else None
    _expect_cutlass(a, b, sa, sb, bias, torch.bfloat16)
    got = F.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16)
    want = (a.double() * sa.double()) @ (b.double() * sb.double()) + (bias.double() if with_bias else 0)
    close(got, want, "bfloat16", scale=8, msg="vs f64")
    close(got, _torch_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16), "bfloat16", scale=8,
          msg="vs torch._scaled_mm")


@gpu
@pytest.mark.parametrize("out_dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("m,k,n", [(256, 512, 384), (200, 272, 264), (37, 144, 136)])
def test_scaled_mm_blockwise_matches_f64(m, k, n, out_dtype):
    """DeepSeek's block-wise form: scale_a [M, K/128] (M-major, torch's layout), scale_b [K/128, N/128]."""
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the CUTLASS block-wise kernel needs sm_90")
    kb, nb = (k + 127) // 128, (n + 127) // 128
    a, b = _fp8((m, k), "float8_e4m3fn"), _fp8((n, k), "float8_e4m3fn").t()
    sa = (torch.rand(kb, m, device="cuda") + 0.5).t()
    sb = torch.rand(kb, nb, device="cuda") + 0.5
    od = getattr(torch, out_dtype)
    _expect_cutlass(a, b, sa, sb, None, od)
    got = F.scaled_mm(a, b, sa, sb, out_dtype=od)
    sa_full = sa.double().repeat_interleave(128, dim=1)[:, :k]
    sb_full = sb.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:k, :n]
    want = (a.double() * sa_full) @ (b.double() * sb_full)
    if out_dtype == "float32":  # fp8 tensor cores add in less than f32 between promotions
        top = want.abs().max().item()
        torch.testing.assert_close(got.double(), want, rtol=1e-3, atol=1e-3 * top)
    else:
        close(got, want, out_dtype, scale=8, msg="vs f64")
    try:
        theirs = torch._scaled_mm(a, b, sa, sb, out_dtype=od)
    except (RuntimeError, ValueError):  # a form this torch build or GPU does not take
        return
    close(got, theirs, out_dtype, scale=8, msg="vs torch._scaled_mm")


@gpu
@pytest.mark.parametrize("out_dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("with_bias", [False, True])
def test_scaled_mm_fp8_output_matches_torch(out_dtype, with_bias):
    """fp8 out: scale_result * (product + bias), saturated; large sums saturate alike in both."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 GEMMs need sm_89 or newer")
    m, k, n = 64, 128, 96
    a, b = _fp8((m, k), "float8_e4m3fn"), _fp8((n, k), "float8_e4m3fn").t()
    sa, sb = torch.tensor(2.0, device="cuda"), torch.tensor(1.5, device="cuda")
    sr = torch.tensor(4.0 if out_dtype == "float8_e4m3fn" else 2048.0, device="cuda")  # some sums saturate
    od = getattr(torch, out_dtype)
    bias = _t((n,), "bfloat16") if with_bias else None
    got = F.scaled_mm(a, b, sa, sb, bias=bias, scale_result=sr, out_dtype=od)
    assert got.dtype == od
    top = torch.finfo(od).max
    want = (((a.double() @ b.double()) * 3 + (bias.double() if with_bias else 0)) * sr.double()).clamp(-top, top)
    _close_fp8(got, want, out_dtype, "vs f64")
    assert (got.double().abs() == top).any(), "no sum saturated: the test lost its point"
    # torch 2.11's _scaled_mm left scale_result out on the H100 (its outputs were ours / scale_result):
    # against torch, both without it.
    plain = F.scaled_mm(a, b, sa, sb, bias=bias, out_dtype=od)
    theirs = _torch_scaled_mm(a, b, sa, sb, bias=bias, out_dtype=od)
    _close_fp8(plain, theirs, out_dtype, "vs torch._scaled_mm")


def _close_fp8(got, want, dtype, msg):
    """Within one fp8 rounding (3 mantissa bits e4m3, 2 e5m2) of each other."""
    tol = 0.13 if dtype == "float8_e4m3fn" else 0.26
    torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=msg)


@gpu
def test_scaled_mm_blockwise_matches_torch():
    """DeepSeek's block-wise form (1 x 128 for a, 128 x 128 for b); torch where it takes it (sm_90, CUDA 12.9+)."""
    m, k, n = 96, 384, 256
    a, b = _fp8((m, k), "float8_e4m3fn"), _fp8((n, k), "float8_e4m3fn").t()
    sa = torch.rand(m, k // 128, device="cuda") + 0.5
    sb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
    want = (a.double() * sa.double().repeat_interleave(128, 1)) @ (
        b.double() * sb.double().repeat_interleave(128, 0).repeat_interleave(128, 1))
    got = F.scaled_mm(a, b, sa, sb, out_dtype=torch.bfloat16)  # cuBLASLt refuses block-wise: the bespoke kernel
    close(got, want, "bfloat16", scale=8, msg="vs f64")
    # torch wants a's scales M-major (the transpose of a contiguous [K/128, M]); the values are the same.
    sa_t = sa.t().contiguous().t()
    close(got, _torch_scaled_mm(a, b, sa_t, sb, out_dtype=torch.bfloat16), "bfloat16", scale=8,
          msg="vs torch._scaled_mm")
