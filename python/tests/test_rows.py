"""Reductions, softmax and normalization through baracuda.functional: on
numpy arrays (host backend) against numpy in float64, and on CUDA tensors
against torch (skipped without torch + CUDA)."""
import numpy as np
import pytest

import baracuda
import baracuda.functional as F

RNG = np.random.default_rng(0)


def _x(shape, dtype=np.float64, lo=-2, hi=2):
    return RNG.uniform(lo, hi, size=shape).astype(dtype)


# ---------------------------------------------------------------- host backend vs numpy

@pytest.mark.parametrize("dim", [None, 0, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_match_numpy(dim, keepdim):
    x = _x((3, 5, 7))
    axis = dim if not isinstance(dim, list) else tuple(dim)
    cases = {
        "sum": np.sum, "mean": np.mean, "prod": np.prod, "amax": np.max, "amin": np.min,
        "logsumexp": lambda a, axis, keepdims: np.log(np.sum(np.exp(a), axis=axis, keepdims=keepdims)),
    }
    for name, ref in cases.items():
        got = getattr(F, name)(x, dim, keepdim)
        np.testing.assert_allclose(got, ref(x, axis=axis, keepdims=keepdim), rtol=1e-12, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(F.var(x, dim, keepdim=keepdim), np.var(x, axis=axis, ddof=1, keepdims=keepdim), rtol=1e-12)
    np.testing.assert_allclose(F.std(x, dim, correction=0, keepdim=keepdim), np.std(x, axis=axis, keepdims=keepdim),
                               rtol=1e-12)
    np.testing.assert_allclose(F.vector_norm(x, 3, dim, keepdim),
                               np.sum(np.abs(x) ** 3, axis=axis, keepdims=keepdim) ** (1 / 3), rtol=1e-12)


def test_reduction_gradients_match_numpy():
    x, g = _x((3, 5)), _x((5,))
    np.testing.assert_allclose(F.sum_backward(g, x, dim=0), np.broadcast_to(g, x.shape))
    np.testing.assert_allclose(F.mean_backward(g, x, dim=0), np.broadcast_to(g / 3, x.shape))
    y = F.logsumexp(x, 0)
    np.testing.assert_allclose(F.logsumexp_backward(g, x, y, dim=0), g * np.exp(x - y), rtol=1e-13)
    v = F.var_backward(g, x, dim=0)
    np.testing.assert_allclose(v, g * 2 * (x - x.mean(0)) / 2, rtol=1e-12)
    n = F.vector_norm(x, 2, 0)
    np.testing.assert_allclose(F.vector_norm_backward(g, x, n, 2, 0), g * x / n, rtol=1e-13)


def test_arg_and_truth_reductions():
    x = np.array([[1.0, 5.0, 5.0], [7.0, -1.0, 0.0]])
    assert F.argmax(x).item() == 3
    np.testing.assert_array_equal(F.argmax(x, 1), [1, 0])  # ties: the first index
    np.testing.assert_array_equal(F.argmin(x, 0, keepdim=True), [[0, 1, 1]])
    np.testing.assert_array_equal(F.any(x == 0, 1), [False, True])
    np.testing.assert_array_equal(F.all(x != 0, 1), [True, False])
    assert F.count_nonzero(x).item() == 5
    assert F.sum(np.arange(10, dtype=np.int32)).dtype == np.int64
    np.testing.assert_array_equal(F.sum_to_size(x, (1, 3)), x.sum(0, keepdims=True))
    assert F.trace(x).item() == 1.0 + -1.0
    np.testing.assert_array_equal(F.trace_backward(np.array(2.5), x), [[2.5, 0, 0], [0, 2.5, 0]])


def test_scans_match_numpy():
    x = _x((3, 6))
    for dim in (0, 1, -1):
        np.testing.assert_allclose(F.cumsum(x, dim), np.cumsum(x, dim), rtol=1e-13)
        np.testing.assert_allclose(F.cumprod(x, dim), np.cumprod(x, dim), rtol=1e-13)
        np.testing.assert_allclose(F.logcumsumexp(x, dim), np.log(np.cumsum(np.exp(x), dim)), rtol=1e-12)
        values, indices = F.cummax(x, dim)
        np.testing.assert_allclose(values, np.maximum.accumulate(x, dim))
        assert indices.dtype == np.int64
        g = _x(x.shape)
        np.testing.assert_allclose(F.cumsum_backward(g, x, dim), np.flip(np.cumsum(np.flip(g, dim), dim), dim),
                                   rtol=1e-13)
    assert F.cumsum(np.arange(5, dtype=np.int32), 0).dtype == np.int64


def test_scan_gradients_match_numpy():
    rng = np.random.default_rng(3)
    for zeros in range(4):  # cumprod through zeros: sum_{j >= i} g_j prod_{k <= j, k != i} x_k
        x, g = _x((2, 7)), _x((2, 7))
        x[0, rng.choice(7, zeros, replace=False)] = 0
        x[1, :zeros] = 0
        for dim in (0, 1):
            got = F.cumprod_backward(g, x, dim, F.cumprod(x, dim))
            xm, gm = np.moveaxis(x, dim, -1), np.moveaxis(g, dim, -1)
            want = np.zeros_like(xm)
            n = xm.shape[-1]
            for i in range(n):
                for j in range(i, n):
                    want[..., i] += gm[..., j] * np.prod(np.delete(xm[..., :j + 1], i, -1), -1)
            np.testing.assert_allclose(got, np.moveaxis(want, -1, dim), rtol=1e-12, atol=1e-14)
    x, g = _x((3, 6), lo=-40, hi=40) + 700, _x((3, 6))  # exp(x) alone overflows
    for dim in (0, 1):
        y = F.logcumsumexp(x, dim)
        xm, gm, ym = (np.moveaxis(a, dim, -1) for a in (x, g, y))
        want = np.stack([(gm[..., i:] * np.exp(xm[..., i:i + 1] - ym[..., i:])).sum(-1) for i in range(xm.shape[-1])], -1)
        np.testing.assert_allclose(F.logcumsumexp_backward(g, x, y, dim), np.moveaxis(want, -1, dim), rtol=1e-12)
    x = np.array([[1.0, 3, 3, 2, 3], [2, 2, 0, 0, 1]])  # ties: the later index keeps the gradient
    g = np.array([[1.0, 10, 100, 1000, 10000]] * 2)
    for name in ("cummax", "cummin"):
        _, idx = getattr(F, name)(x, 1)
        want = np.zeros_like(g)
        for r in range(2):
            np.add.at(want[r], idx[r], g[r])
        np.testing.assert_array_equal(getattr(F, name + "_backward")(g, x, idx, 1), want)
    with pytest.raises(ValueError, match="indices"):
        F.cummax_backward(g, x, np.array([[0, 1, 0, 0, 0]] * 2), 1)


def test_softmax_family_matches_numpy():
    x = _x((4, 9), lo=-6, hi=6)
    for dim in (-1, 0):
        e = np.exp(x - x.max(dim, keepdims=True))
        sm = e / e.sum(dim, keepdims=True)
        np.testing.assert_allclose(F.softmax(x, dim), sm, rtol=1e-13)
        np.testing.assert_allclose(F.log_softmax(x, dim), np.log(sm), rtol=1e-12, atol=1e-13)
        g = _x(x.shape)
        np.testing.assert_allclose(F.softmax_backward(g, sm, dim), sm * (g - (g * sm).sum(dim, keepdims=True)),
                                   rtol=1e-12, atol=1e-14)


def test_norms_match_numpy():
    x, w, b = _x((6, 16)), _x(16), _x(16)
    mean = x.mean(-1, keepdims=True)
    rstd = 1 / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(F.layer_norm(x, (16,), w, b), (x - mean) * rstd * w + b, rtol=1e-12, atol=1e-12)
    out, m, r = F.native_layer_norm(x, 16, w, b)
    np.testing.assert_allclose(m, mean[:, 0], rtol=1e-13)
    np.testing.assert_allclose(r, rstd[:, 0], rtol=1e-12)
    rr = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6)
    np.testing.assert_allclose(F.rms_norm(x, (16,), w, eps=1e-6), x * rr * w, rtol=1e-12)
    y, res, _ = F.add_rms_norm(x, x, w, eps=1e-6)
    np.testing.assert_allclose(res, 2 * x)
    np.testing.assert_allclose(y, F.rms_norm(2 * x, (16,), w, eps=1e-6), rtol=1e-13)
    with pytest.raises(ValueError, match="trailing dims"):
        F.layer_norm(x, (8,), None, None)


def test_residual_norm_backward_matches_numpy():
    """add_*_norm_backward: the norm's backward over residual_out plus grad_residual_out (None: zero)."""
    x, r, w, b, g, gr = _x((6, 16)), _x((6, 16)), _x(16), _x(16), _x((6, 16)), _x((6, 16))
    out, h, rstd = F.add_rms_norm(x, r, w, eps=1e-6)
    dx, dw = F.rms_norm_backward(g, h, rstd, w)
    gi, gw = F.add_rms_norm_backward(g, gr, h, rstd, w)
    np.testing.assert_allclose(gi, dx + gr, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gw, dw, rtol=1e-13)
    np.testing.assert_allclose(F.add_rms_norm_backward(g, None, h, rstd, w)[0], dx, rtol=1e-13)
    out, h, mean, rstd = F.add_layer_norm(x, r, w, b)
    dx, dw, db = F.layer_norm_backward(g, h, mean, rstd, w)
    gi, gw, gb = F.add_layer_norm_backward(g, gr, h, mean, rstd, w)
    np.testing.assert_allclose(gi, dx + gr, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(gw, dw, rtol=1e-13)
    np.testing.assert_allclose(gb, db, rtol=1e-13)


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import CUDA, DTYPES, TOL as _TOL, close as _close, gpu, torch  # noqa: E402,F401


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((64, 1000), 0), ((3, 7, 129), (0, 2)), ((1 << 20,), None)])
def test_reductions_match_torch(dtype, shape, dim):
    dtype = getattr(torch, dtype)
    x = torch.empty(shape, device="cuda", dtype=dtype).uniform_(-2, 2)
    xd = x.double()
    n = xd.numel() if dim is None else int(np.prod([shape[d] for d in ((dim,) if isinstance(dim, int) else dim)]))
    for name, ref in [("sum", lambda t: t.sum(dim) if dim is not None else t.sum()),
                      ("mean", lambda t: t.mean(dim) if dim is not None else t.mean()),
                      ("amax", lambda t: t.amax(dim) if dim is not None else t.amax()),
                      ("logsumexp", lambda t: torch.logsumexp(t, dim if dim is not None else tuple(range(t.ndim))))]:
        got = getattr(F, name)(x, dim)
        want = ref(xd)
        scale = 4 * max(1.0, float(np.sqrt(n)) / 64) if name == "sum" else 4
        _close(got, want.to(dtype), dtype, scale, name)
    got = F.var(x, dim)
    want = xd.var(dim) if dim is not None else xd.var()
    _close(got, want.to(dtype), dtype, 8, "var")
    # Gradients against torch.autograd (float64 on the same inputs).
    xg = xd.clone().requires_grad_()
    for name, fwd in [("sum", lambda t: t.sum(dim) if dim is not None else t.sum()),
                      ("mean", lambda t: t.mean(dim) if dim is not None else t.mean()),
                      ("var", lambda t: t.var(dim) if dim is not None else t.var())]:
        yd = fwd(xg)
        gy = torch.randn_like(yd)
        (gx,) = torch.autograd.grad(yd, xg, gy)
        got = getattr(F, name + "_backward")(gy.to(dtype), x, dim=dim)
        _close(got, gx.to(dtype), dtype, 8, name + "_backward")
    if isinstance(dim, int) or dim is None:
        assert torch.equal(F.argmax(x, dim), torch.argmax(x, dim)), "argmax"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((64, 1000), 0), ((3, 7, 129), (0, 2))])
def test_extreme_and_prod_gradients_match_torch(dtype, shape, dim):
    """amax/amin/norm(+-inf) split the gradient among ties, prod handles zeros: small whole numbers make both common."""
    dtype = getattr(torch, dtype)
    x = torch.randint(-3, 4, shape, device="cuda").to(dtype)
    # prod: +-1 with about one zero per reduced group, so groups with no, one and several zeros all occur.
    n = int(np.prod([shape[d] for d in ((dim,) if isinstance(dim, int) else dim)]))
    signs = torch.where(torch.rand(shape, device="cuda") < 0.5, -1.0, 1.0)
    x_prod = torch.where(torch.rand(shape, device="cuda") < 1.0 / n, 0.0, signs).to(dtype)
    for name, fwd in [("amax", lambda t: t.amax(dim)), ("amin", lambda t: t.amin(dim)),
                      ("prod", lambda t: t.prod(dim) if isinstance(dim, int) else t.prod(2).prod(0))]:
        x = x_prod if name == "prod" else x
        xg = x.double().requires_grad_()
        yd = fwd(xg)
        gy = torch.randn_like(yd)
        (gx,) = torch.autograd.grad(yd, xg, gy)
        got = getattr(F, name + "_backward")(gy.to(dtype), x, yd.detach().to(dtype), dim=dim)
        _close(got, gx.to(dtype), dtype, 8, name + "_backward")
    x = torch.randint(-3, 4, shape, device="cuda").to(dtype)
    xg = x.double().requires_grad_()
    for p in (float("inf"), float("-inf")):
        yd = torch.linalg.vector_norm(xg, p, dim)
        gy = torch.randn_like(yd)
        (gx,) = torch.autograd.grad(yd, xg, gy)
        got = F.vector_norm_backward(gy.to(dtype), x, yd.detach().to(dtype), p, dim)
        _close(got, gx.to(dtype), dtype, 8, f"norm {p} backward")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((8, 100), -1), ((32, 4096), -1), ((4, 70000), -1), ((300, 5), 0),
                                       ((2, 3, 2000), 1)])
def test_softmax_matches_torch(dtype, shape, dim):
    dtype = getattr(torch, dtype)
    x = torch.randn(shape, device="cuda", dtype=dtype) * 3
    for name in ("softmax", "log_softmax", "softmin"):
        y = getattr(F, name)(x, dim)
        want = getattr(torch.nn.functional, name)(x.double(), dim)
        _close(y, want.to(dtype), dtype, 2, name)
        g = torch.randn_like(x)
        xd = x.double().requires_grad_()
        yd = getattr(torch.nn.functional, name)(xd, dim)
        (gx,) = torch.autograd.grad(yd, xd, g.double())
        got = getattr(F, name + "_backward")(g, yd.detach().to(dtype), dim)
        _close(got, gx.to(dtype), dtype, 8, name + "_backward")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
# (4, 20000) and (600, 12000) take the clustered backward on sm_90 (2-5 blocks a row; 600 rows: 10-28 a split).
@pytest.mark.parametrize("shape", [(8, 64), (33, 4096), (4, 20000), (600, 12000), (2, 3, 768)])
def test_norms_match_torch(dtype, shape):
    dtype = getattr(torch, dtype)
    n = shape[-1]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(n, device="cuda", dtype=dtype)
    b = torch.randn(n, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    yd = torch.nn.functional.layer_norm(xd, (n,), wd, bd)
    out, mean, rstd = F.native_layer_norm(x, (n,), w, b)
    _close(out, yd.detach().to(dtype), dtype, 4, "layer_norm")
    gx, gw, gb = torch.autograd.grad(yd, (xd, wd, bd), g.double())
    dx, dw, db = F.layer_norm_backward(g, x, mean, rstd, w)
    _close(dx, gx.to(dtype), dtype, 8, "layer_norm dx")
    rows = x.numel() // n
    _close(dw, gw.to(dtype), dtype, 8 * max(1.0, rows ** 0.5 / 8), "layer_norm dw")
    _close(db, gb.to(dtype), dtype, 8 * max(1.0, rows ** 0.5 / 8), "layer_norm db")
    yr = torch.nn.functional.rms_norm(xd, (n,), wd, eps=1e-6)
    out, rstd = F.native_rms_norm(x, (n,), w, eps=1e-6)
    _close(out, yr.detach().to(dtype), dtype, 4, "rms_norm")
    gx, gw = torch.autograd.grad(yr, (xd, wd), g.double())
    dx, dw = F.rms_norm_backward(g, x, rstd, w)
    _close(dx, gx.to(dtype), dtype, 8, "rms_norm dx")
    _close(dw, gw.to(dtype), dtype, 8 * max(1.0, rows ** 0.5 / 8), "rms_norm dw")
    # The fused residual forms: input + residual through torch's norm, both outputs' gradients.
    r = torch.randn_like(x)
    gr = torch.randn_like(x)
    rd = r.double().requires_grad_()
    for name in ("add_rms_norm", "add_layer_norm"):
        xd2 = x.double().requires_grad_()
        hd = xd2 + rd
        yd = (torch.nn.functional.rms_norm(hd, (n,), wd, eps=1e-6) if name == "add_rms_norm"
              else torch.nn.functional.layer_norm(hd, (n,), wd, bd))
        want = torch.autograd.grad((yd, hd), (xd2, rd, wd), (g.double(), gr.double()))
        if name == "add_rms_norm":
            _, h, rstd = F.add_rms_norm(x, r, w, eps=1e-6)
            gi, gw = F.add_rms_norm_backward(g, gr, h, rstd, w)
        else:
            _, h, mean, rstd = F.add_layer_norm(x, r, w, b)
            gi, gw, _ = F.add_layer_norm_backward(g, gr, h, mean, rstd, w)
        _close(gi, want[0].to(dtype), dtype, 8, f"{name} grad_input")
        _close(gi, want[1].to(dtype), dtype, 8, f"{name} grad_residual")
        _close(gw, want[2].to(dtype), dtype, 8 * max(1.0, rows ** 0.5 / 8), f"{name} grad_weight")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((1000, 64), 0), ((3, 200000), 1), ((1 << 20,), 0)])
def test_scans_match_torch(dtype, shape, dim):
    dtype = getattr(torch, dtype)
    x = torch.empty(shape, device="cuda", dtype=dtype).uniform_(-1, 1)
    xd = x.double()
    n = shape[dim]
    _close(F.cumsum(x, dim), torch.cumsum(xd, dim).to(dtype), dtype, 4 * max(1.0, n ** 0.5 / 16), "cumsum")
    _close(F.logcumsumexp(x, dim), torch.logcumsumexp(xd, dim).to(dtype), dtype, 8, "logcumsumexp")
    values, indices = F.cummax(x, dim)
    want_v, want_i = torch.cummax(x, dim)
    assert torch.equal(values, want_v) and torch.equal(indices, want_i), "cummax"
    values, indices = F.cummin(x, dim)
    want_v, want_i = torch.cummin(x, dim)
    assert torch.equal(values, want_v) and torch.equal(indices, want_i), "cummin"
    g = torch.randn_like(x)
    _close(F.cumsum_backward(g, x, dim), g.double().flip(dim).cumsum(dim).flip(dim).to(dtype), dtype,
           4 * max(1.0, n ** 0.5 / 16), "cumsum_backward")
    if n <= 1000:
        p = torch.empty(shape, device="cuda", dtype=dtype).uniform_(0.9, 1.1)
        _close(F.cumprod(p, dim), torch.cumprod(p.double(), dim).to(dtype), dtype, 16, "cumprod")
    ints = torch.randint(-5, 5, shape, device="cuda", dtype=torch.int32)
    assert torch.equal(F.cumsum(ints, dim), torch.cumsum(ints, dim)), "cumsum int32 -> int64"


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,view", [((1 << 26) + 3, "contiguous"), (1000003, "step2"), (1000003, "column"),
                                    (1 << 26, "contiguous"), ((1 << 21) + 5, "offset1")])
def test_long_scans_single_pass(dtype, n, view):
    """Rows cut across blocks (the single-pass scan): awkward lengths and non-contiguous views, every forward op
    and a gradient against torch, and the same scan twice bitwise equal."""
    dtype = getattr(torch, dtype)
    if view == "contiguous":
        x = torch.empty(n, device="cuda", dtype=dtype).uniform_(-1, 1)
        dim = 0
    elif view == "offset1":  # unit stride, the row starting 1 element past a 16-byte boundary (skewed copies)
        x = torch.empty(n + 1, device="cuda", dtype=dtype).uniform_(-1, 1)[1:]
        dim = 0
    elif view == "step2":
        x = torch.empty(2 * n, device="cuda", dtype=dtype).uniform_(-1, 1)[::2]
        dim = 0
    else:  # rows of a transposed matrix: stride 3 along the scanned dim
        x = torch.empty(n, 3, device="cuda", dtype=dtype).uniform_(-1, 1).t()
        dim = 1
    xd = x.double()
    scale = 4 * max(1.0, x.shape[dim] ** 0.5 / 16)
    _close_to_largest(F.cumsum(x, dim), torch.cumsum(xd, dim).to(dtype), dtype, scale, "cumsum")
    _close(F.logcumsumexp(x, dim), torch.logcumsumexp(xd, dim).to(dtype), dtype, 8, "logcumsumexp")
    for name in ("cummax", "cummin"):
        values, indices = getattr(F, name)(x, dim)
        want_v, want_i = getattr(torch, name)(x, dim)
        assert torch.equal(values, want_v) and torch.equal(indices, want_i), name
    g = torch.randn_like(x)
    _close_to_largest(F.cumsum_backward(g, x, dim), g.double().flip(dim).cumsum(dim).flip(dim).to(dtype), dtype,
                      scale, "cumsum_backward")
    # Products of 2 and 0.5 are exact in every dtype: one every ~1009 elements, alternating, so the running
    # exponent stays in {0, 1} and most tiles' aggregates are 2 or 0.5 -- a tile combined wrongly shows exactly.
    p = torch.ones_like(x)
    events = torch.arange(0, x.shape[dim] - 1009, 1009, device="cuda")
    events = events + torch.randint(0, 1009, events.shape, device="cuda")
    factors = torch.where(torch.arange(events.numel(), device="cuda") % 2 == 0, 2.0, 0.5).to(dtype)
    (p if p.dim() == 1 else p[0]).index_copy_(0, events, factors)  # the column view: its first row
    assert torch.equal(F.cumprod(p, dim), torch.cumprod(p.double(), dim).to(dtype)), "cumprod of powers of two"
    # Rounded products near 1: tiled f32 products drift several percent over 2^26 elements (so do torch's; a
    # sequential f64 product is the reference), so ours must stay within a few times torch's own error.
    p = torch.empty_like(x).uniform_(0.9999, 1.0001)
    want = torch.cumprod(p.double(), dim)
    err = lambda y: ((y.double() - want).abs().max() / want.abs().max()).item()  # noqa: E731
    tol = max(_TOL[str(dtype).replace("torch.", "")] * scale, 3 * err(torch.cumprod(p, dim)))
    assert err(F.cumprod(p, dim)) <= tol, f"cumprod: {err(F.cumprod(p, dim)):.3g} > {tol:.3g}"
    for fn in (lambda: F.cumsum(x, dim), lambda: F.logcumsumexp(x, dim), lambda: F.cumprod(p, dim),
               lambda: F.cummax(x, dim)[0], lambda: F.cumsum_backward(g, x, dim)):
        bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}
        first, again = (t.contiguous().view(bits[t.element_size()]) for t in (fn(), fn()))
        assert torch.equal(first, again), "run to run"
    ints = torch.randint(-5, 5, (n,), device="cuda", dtype=torch.int32)
    assert torch.equal(F.cumsum(ints, 0), torch.cumsum(ints, 0)), "cumsum int32 -> int64"


def _close_to_largest(got, want, dtype, scale, msg):
    """got ~ want within the dtype's tolerance times `scale` of the largest |want| (long running sums cancel)."""
    tol = _TOL[str(dtype).replace("torch.", "")] * scale
    torch.testing.assert_close(got.double(), want.double(), rtol=tol,
                               atol=tol * max(1.0, want.double().abs().max().item()), msg=msg)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((64, 1000), -1), ((1000, 64), 0), ((3, 200000), 1), ((300, 7), 1)])
def test_scan_gradients_match_torch(dtype, shape, dim):
    """Our backward ops against torch.autograd in float64 on the same (rounded) inputs; saved
    operands from float64 forwards rounded to dtype."""
    dtype = getattr(torch, dtype)
    n = shape[dim]
    scale = 8 * max(1.0, n ** 0.5 / 16)
    g = torch.randn(shape, device="cuda", dtype=dtype)

    def torch_grad(fn, x):
        xd = x.double().requires_grad_()
        (gx,) = torch.autograd.grad(fn(xd), xd, g.double())
        return gx

    # cumprod: magnitudes near 1 keep long products in range; zeros, one and several per row.
    xp = (torch.empty(shape, device="cuda").uniform_(-0.01, 0.01).exp() *
          torch.randint(0, 2, shape, device="cuda").mul(2).sub(1)).to(dtype)
    xm = xp.movedim(dim, -1)
    xm[0::3, n // 3] = 0
    xm[1::3, n // 4] = 0
    xm[1::3, n // 2] = 0
    xm[1::3, n - 1] = 0
    want_p = torch_grad(lambda t: torch.cumprod(t, dim), xp)
    _close_to_largest(F.cumprod_backward(g, xp, dim, torch.cumprod(xp.double(), dim).to(dtype)), want_p, dtype, scale, "cumprod_backward")
    # logcumsumexp: every third row far from 0, where exp(x) overflows; f32/f64 only (a saved
    # output rounded to f16/bf16 near 200 is off by up to 1/16 or 1/2: exp of that fits no tolerance).
    x = torch.empty(shape, device="cuda").uniform_(-3, 3)
    if dtype in (torch.float32, torch.float64):
        x.movedim(dim, -1)[0::3] += 200
    x = x.to(dtype)
    got = F.logcumsumexp_backward(g, x, torch.logcumsumexp(x.double(), dim).to(dtype), dim)
    _close_to_largest(got, torch_grad(lambda t: torch.logcumsumexp(t, dim), x), dtype, scale, "logcumsumexp_backward")
    # cummax/cummin: small integers, many ties.
    x = torch.randint(-3, 4, shape, device="cuda").to(dtype)
    for name in ("cummax", "cummin"):
        _, idx = getattr(torch, name)(x.double(), dim)
        got = getattr(F, name + "_backward")(g, x, idx, dim)
        _close_to_largest(got, torch_grad(lambda t: getattr(torch, name)(t, dim)[0], x), dtype, scale, name + "_backward")
    # Strided operands: a transposed view of the grad.
    if len(shape) == 2:
        gt = g.t().contiguous().t()
        _, idx = torch.cummax(x.double(), dim)
        _close_to_largest(F.cummax_backward(gt, x, idx, dim), F.cummax_backward(g, x, idx, dim), dtype, 1, "strided")
        y = torch.cumprod(xp.double(), dim).to(dtype).t().contiguous().t()
        _close_to_largest(F.cumprod_backward(gt, xp, dim, y), want_p, dtype, scale, "cumprod_backward strided")


@gpu
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
@pytest.mark.parametrize("shape", [(33, 4096), (7, 200), (4, 20000), (300, 24)])
def test_fp8_forwards_match_torch(dtype, shape):
    """fp8 storage, f32 arithmetic: layer_norm, rms_norm and the scans against
    torch in f64 on the same fp8 values, rounded to fp8 once. The f32
    arithmetic may land one fp8 step away (a relative eps), no more."""
    dtype = getattr(torch, dtype)
    eps = torch.finfo(dtype).eps
    n = shape[-1]

    def check(got, want, what, scale=1.0):
        assert got.dtype == dtype, what
        want8 = want.to(dtype).double()
        torch.testing.assert_close(got.double(), want8, rtol=eps * scale, atol=eps * scale * 2 ** -6, msg=what)

    x = torch.randn(shape, device="cuda").to(dtype)
    w = torch.randn(n, device="cuda").to(dtype)
    b = torch.randn(n, device="cuda").to(dtype)
    xd, wd, bd = x.double(), w.double(), b.double()
    out, mean, rstd = F.native_layer_norm(x, (n,), w, b)
    assert mean.dtype == torch.float32 and rstd.dtype == torch.float32
    check(out, torch.nn.functional.layer_norm(xd, (n,), wd, bd), "layer_norm")
    torch.testing.assert_close(mean.double(), xd.mean(-1), rtol=1e-5, atol=1e-5, msg="layer_norm mean")
    check(F.rms_norm(x, (n,), w, eps=1e-6), torch.nn.functional.rms_norm(xd, (n,), wd, eps=1e-6), "rms_norm")
    check(F.layer_norm(x, (n,)), torch.nn.functional.layer_norm(xd, (n,)), "layer_norm without affine")
    r = torch.randn(shape, device="cuda").to(dtype)
    out, res = F.add_rms_norm(x, r, w, eps=1e-6)[:2]
    check(res, xd + r.double(), "add_rms_norm residual_out")
    check(out, torch.nn.functional.rms_norm(xd + r.double(), (n,), wd, eps=1e-6), "add_rms_norm")  # the f32 sum, unrounded
    # Scans along the rows: sums of up to 20000 fp8 values stay within e5m2's range (and e4m3's 448 at
    # 200 values); the longer e4m3 rows take values a tenth as large.
    xs = (torch.randn(shape, device="cuda") * (0.1 if dtype == torch.float8_e4m3fn and n > 1000 else 1)).to(dtype)
    check(F.cumsum(xs, -1), torch.cumsum(xs.double(), -1), "cumsum", scale=2)
    vals, idx = F.cummax(xs, -1)
    want_v, want_i = torch.cummax(xs.double(), -1)
    check(vals, want_v, "cummax")
    assert torch.equal(idx.cpu(), want_i.cpu()) or torch.equal(vals.double(), torch.gather(xs.double(), -1, idx)), "cummax indices"
    check(F.logcumsumexp(xs, -1), torch.logcumsumexp(xs.double(), -1), "logcumsumexp", scale=2)


# ---------------------------------------------------------------- torch's dtype= (the input cast first)

def _dtype_cases(torch):
    TF = torch.nn.functional
    f32, f64, i32 = torch.float32, torch.float64, torch.int32
    return [  # (name, ours, torch's, input kind)
        ("softmax", lambda x: F.softmax(x, 1, dtype=f32), lambda x: TF.softmax(x, 1, dtype=f32), "float"),
        ("log_softmax", lambda x: F.log_softmax(x, 0, dtype=f64), lambda x: TF.log_softmax(x, 0, dtype=f64), "float"),
        ("softmin", lambda x: F.softmin(x, -1, dtype=f32), lambda x: TF.softmin(x, -1, dtype=f32), "float"),
        ("sum", lambda x: F.sum(x, 1, dtype=f32), lambda x: torch.sum(x, 1, dtype=f32), "float"),
        ("sum keepdim", lambda x: F.sum(x, (0, 1), True, dtype=f64), lambda x: torch.sum(x, (0, 1), True, dtype=f64),
         "float"),
        ("mean", lambda x: F.mean(x, 0, dtype=f32), lambda x: torch.mean(x, 0, dtype=f32), "float"),
        ("prod", lambda x: F.prod(x, 1, dtype=f64), lambda x: torch.prod(x, 1, dtype=f64), "float"),
        ("cumsum", lambda x: F.cumsum(x, 1, dtype=f32), lambda x: torch.cumsum(x, 1, dtype=f32), "float"),
        ("cumprod", lambda x: F.cumprod(x, 0, dtype=f64), lambda x: torch.cumprod(x, 0, dtype=f64), "float"),
        ("norm", lambda x: F.norm(x, 2, 1, dtype=f32), lambda x: torch.norm(x, 2, 1, dtype=f32), "float"),
        ("vector_norm", lambda x: F.vector_norm(x, 3, (0,), dtype=f64),
         lambda x: torch.linalg.vector_norm(x, 3, (0,), dtype=f64), "float"),
        # Integer sums and scans give i64 unless dtype says otherwise; an integer input cast to a float.
        ("sum i32", lambda x: F.sum(x, 1, dtype=i32), lambda x: torch.sum(x, 1, dtype=i32), "int"),
        ("cumsum i32", lambda x: F.cumsum(x, 1, dtype=i32), lambda x: torch.cumsum(x, 1, dtype=i32), "int"),
        ("mean of ints", lambda x: F.mean(x, 0, dtype=f32), lambda x: torch.mean(x, 0, dtype=f32), "int"),
    ]


@pytest.mark.skipif(torch is None, reason="needs torch")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=gpu)])
def test_dtype_argument_matches_torch(device):
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(37, 29, generator=gen, dtype=torch.float64) * 4 - 2).to(torch.bfloat16).to(device)
    xi = torch.randint(-3, 4, (37, 29), generator=gen, dtype=torch.int32).to(device)
    for name, ours, theirs, kind in _dtype_cases(torch):
        arg = x if kind == "float" else xi
        got, want = ours(arg), theirs(arg)
        assert got.dtype == want.dtype and got.device == want.device, name
        tol = 0 if want.dtype == torch.int32 else 1e-5 if want.dtype == torch.float32 else 1e-12
        torch.testing.assert_close(got.double(), want.double(), rtol=tol, atol=tol, msg=name)
    # out= in the requested dtype; a dtype torch does not take is refused as before.
    out = torch.empty(37, dtype=torch.int32, device=device)
    assert F.sum(xi, 1, dtype=torch.int32, out=out) is out
    torch.testing.assert_close(out, torch.sum(xi, 1, dtype=torch.int32), rtol=0, atol=0)
    out = torch.empty(37, 29, dtype=torch.float32, device=device)
    F.softmax(x, 1, dtype=torch.float32, out=out)
    torch.testing.assert_close(out, torch.softmax(x, 1, dtype=torch.float32), rtol=1e-6, atol=1e-6)
    with pytest.raises(TypeError, match="dtype"):
        F.amax(x, 1, dtype=torch.float32)


def test_dtype_argument_on_numpy():
    a = np.arange(12, dtype=np.int8).reshape(3, 4)
    got = F.sum(a, 1, dtype=np.float64)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [6, 22, 38])
    scan = F.cumsum(a, 1, dtype=np.int32)
    assert scan.dtype == np.int32
    np.testing.assert_array_equal(scan, np.cumsum(a, 1))
    e = np.exp(a.astype(np.float64))
    np.testing.assert_allclose(F.softmax(a, 1, dtype=np.float32), e / e.sum(1, keepdims=True), rtol=1e-6)
