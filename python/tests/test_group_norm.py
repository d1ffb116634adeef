"""group_norm and instance_norm through baracuda.functional: on numpy arrays
(host backend) against numpy in float64, and on CUDA tensors against torch
(forward, running statistics, and backward against torch.autograd; skipped
without torch + CUDA)."""
import numpy as np
import pytest

import baracuda.functional as F

RNG = np.random.default_rng(7)


def _x(shape, lo=-2, hi=2):
    return RNG.uniform(lo, hi, size=shape)


def _group_ref(x, groups, w=None, b=None, eps=1e-5):
    n, c = x.shape[:2]
    xg = x.reshape(n, groups, -1)
    mean = xg.mean(-1)
    rstd = 1 / np.sqrt(xg.var(-1) + eps)
    y = ((xg - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    view = (1, c) + (1,) * (x.ndim - 2)
    if w is not None:
        y = y * w.reshape(view)
    if b is not None:
        y = y + b.reshape(view)
    return y, mean, rstd


# ---------------------------------------------------------------- host backend vs numpy

@pytest.mark.parametrize("shape,groups", [((2, 6, 5), 3), ((3, 4, 2, 3), 2), ((4, 8), 4), ((2, 3, 7), 1)])
def test_group_norm_matches_numpy(shape, groups):
    x, w, b = _x(shape), _x(shape[1]), _x(shape[1])
    want, mean, rstd = _group_ref(x, groups, w, b)
    np.testing.assert_allclose(F.group_norm(x, groups, w, b), want, rtol=1e-12, atol=1e-12)
    out, m, r = F.native_group_norm(x, w, b, shape[0], shape[1], int(np.prod(shape[2:])), groups, 1e-5)
    np.testing.assert_allclose(m, mean, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(r, rstd, rtol=1e-12)
    np.testing.assert_allclose(F.group_norm(x, groups), _group_ref(x, groups)[0], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.group_norm(x, groups, w), _group_ref(x, groups, w)[0], rtol=1e-12, atol=1e-12)


def test_group_norm_backward_matches_finite_differences():
    shape, groups = (2, 4, 3), 2
    x, w, b, g = _x(shape), _x(4), _x(4), _x(shape)
    _, mean, rstd = F.native_group_norm(x, w, b, 2, 4, 3, groups, 1e-5)
    dx, dw, db = F.group_norm_backward(g, x, mean, rstd, w)
    loss = lambda xv, wv, bv: float((g * F.group_norm(xv, groups, wv, bv)).sum())  # noqa: E731
    h = 1e-6
    for arr, grad in ((x, dx), (w, dw), (b, db)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            keep = arr[i]
            arr[i] = keep + h
            up = loss(x, w, b)
            arr[i] = keep - h
            num[i] = (up - loss(x, w, b)) / (2 * h)
            arr[i] = keep
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6)
    assert F.group_norm_backward(g, x, mean, rstd).shape == shape


def test_instance_norm_matches_numpy_and_updates_running_stats():
    x, w, b = _x((3, 4, 5)), _x(4), _x(4)
    want, mean, _ = _group_ref(x, 4, w, b)
    rm, rv = _x(4), _x(4, 0.5, 2)
    rm0, rv0 = rm.copy(), rv.copy()
    out = F.instance_norm(x, rm, rv, w, b, momentum=0.3)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(rm, 0.7 * rm0 + 0.3 * mean.mean(0), rtol=1e-12)
    np.testing.assert_allclose(rv, 0.7 * rv0 + 0.3 * x.var(-1, ddof=1).mean(0), rtol=1e-9)
    # use_input_stats=False: the running statistics normalise.
    ev = F.instance_norm(x, rm, rv, w, b, use_input_stats=False)
    view = (1, 4, 1)
    np.testing.assert_allclose(ev, (x - rm.reshape(view)) / np.sqrt(rv.reshape(view) + 1e-5) * w.reshape(view)
                               + b.reshape(view), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(F.instance_norm(x), _group_ref(x, 4)[0], rtol=1e-12, atol=1e-12)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="must divide the channels"):
        F.group_norm(_x((2, 6, 3)), 4)
    with pytest.raises(ValueError, match="one per channel"):
        F.group_norm(_x((2, 6, 3)), 2, _x(5))
    with pytest.raises(ValueError, match="more than 1 spatial element"):
        F.instance_norm(_x((2, 6, 1)))
    with pytest.raises(ValueError, match="rank >= 3"):
        F.instance_norm(_x((2, 6)))


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import CUDA, DTYPES, close as _close, gpu, torch  # noqa: E402,F401


def _grad_scale(n):
    return 8 * max(1.0, n ** 0.5 / 8)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,groups", [((4, 64, 8, 8), 8), ((2, 32, 33), 32), ((3, 12, 5, 7, 3), 3), ((8, 16), 4),
                                          ((2, 512, 64, 64), 32), ((1, 8, 70000), 1)])
def test_group_norm_matches_torch(dtype, shape, groups):
    dtype = getattr(torch, dtype)
    c = shape[1]
    x = torch.randn(shape, device="cuda", dtype=dtype) * 2 + 0.5
    w = torch.randn(c, device="cuda", dtype=dtype)
    b = torch.randn(c, device="cuda", dtype=dtype)
    g = torch.randn_like(x)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    yd = torch.nn.functional.group_norm(xd, groups, wd, bd)
    n, hw = shape[0], x.numel() // (shape[0] * c)
    out, mean, rstd = F.native_group_norm(x, w, b, n, c, hw, groups, 1e-5)
    _close(out, yd.detach().to(dtype), dtype, 4, "group_norm")
    _, tmean, trstd = torch.native_group_norm(xd.detach(), wd.detach(), bd.detach(), n, c, hw, groups, 1e-5)
    _close(mean, tmean.to(mean.dtype), dtype, 4, "mean")
    _close(rstd, trstd.to(rstd.dtype), dtype, 4, "rstd")
    gx, gw, gb = torch.autograd.grad(yd, (xd, wd, bd), g.double())
    dx, dw, db = F.group_norm_backward(g, x, mean, rstd, w)
    _close(dx, gx.to(dtype), dtype, 8, "dx")
    _close(dw, gw.to(dtype), dtype, _grad_scale(x.numel() / c), "dw")
    _close(db, gb.to(dtype), dtype, _grad_scale(x.numel() / c), "db")
    # Channels-last input: the strided path.
    if x.dim() == 4:
        xc = x.to(memory_format=torch.channels_last)
        _close(F.group_norm(xc, groups, w, b), yd.detach().to(dtype), dtype, 4, "group_norm channels_last")
        _close(F.group_norm_backward(g, xc, mean, rstd, w)[0], gx.to(dtype), dtype, 8, "dx channels_last")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 16, 32, 32), (2, 3, 100), (3, 5, 2, 2, 2)])
def test_instance_norm_matches_torch(dtype, shape):
    dtype = getattr(torch, dtype)
    c = shape[1]
    x = torch.randn(shape, device="cuda", dtype=dtype)
    w = torch.randn(c, device="cuda", dtype=dtype)
    b = torch.randn(c, device="cuda", dtype=dtype)
    rm = torch.randn(c, device="cuda", dtype=dtype)
    rv = torch.rand(c, device="cuda", dtype=dtype) + 0.5
    trm, trv = rm.double(), rv.double()
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    yd = torch.nn.functional.instance_norm(xd, trm, trv, wd, bd, use_input_stats=True, momentum=0.2)
    y = F.instance_norm(x, rm, rv, w, b, use_input_stats=True, momentum=0.2)
    _close(y, yd.detach().to(dtype), dtype, 4, "instance_norm")
    _close(rm, trm.to(dtype), dtype, 4, "running_mean")
    _close(rv, trv.to(dtype), dtype, 4, "running_var")
    ev = F.instance_norm(x, rm, rv, w, b, use_input_stats=False)
    want = torch.nn.functional.instance_norm(x.double(), rm.double(), rv.double(), w.double(), b.double(),
                                             use_input_stats=False)
    _close(ev, want.to(dtype), dtype, 4, "instance_norm eval")
    g = torch.randn_like(x)
    _, mean, rstd = F.native_instance_norm(x, w, b)
    gx, gw, gb = torch.autograd.grad(yd, (xd, wd, bd), g.double())
    dx, dw, db = F.instance_norm_backward(g, x, mean, rstd, w)
    _close(dx, gx.to(dtype), dtype, 8, "dx")
    _close(dw, gw.to(dtype), dtype, _grad_scale(x.numel() / c), "dw")
    _close(db, gb.to(dtype), dtype, _grad_scale(x.numel() / c), "db")


@gpu
def test_group_norm_is_deterministic():
    x = torch.randn(8, 64, 40, 40, device="cuda")
    w, b = torch.randn(64, device="cuda"), torch.randn(64, device="cuda")
    g = torch.randn_like(x)
    _, mean, rstd = F.native_group_norm(x, w, b, 8, 64, 1600, 16, 1e-5)
    first = F.group_norm_backward(g, x, mean, rstd, w)
    for _ in range(3):
        again = F.group_norm_backward(g, x, mean, rstd, w)
        assert all(torch.equal(a, b) for a, b in zip(first, again))


@gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_group_norm_f32_params_with_half_input(dtype):
    dtype = getattr(torch, dtype)
    x = torch.randn(4, 32, 16, 16, device="cuda", dtype=dtype)
    w, b = torch.randn(32, device="cuda"), torch.randn(32, device="cuda")
    g = torch.randn_like(x)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    yd = torch.nn.functional.group_norm(xd, 8, wd, bd)
    out, mean, rstd = F.native_group_norm(x, w, b, 4, 32, 256, 8, 1e-5)
    assert out.dtype == dtype
    _close(out, yd.detach().to(dtype), dtype, 4, "group_norm f32 params")
    gx, gw, gb = torch.autograd.grad(yd, (xd, wd, bd), g.double())
    dx, dw, db = F.group_norm_backward(g, x, mean, rstd, w)
    assert dw.dtype == torch.float32 and db.dtype == torch.float32
    _close(dx, gx.to(dtype), dtype, 8, "dx")
    _close(dw, gw.float(), dtype, _grad_scale(1024), "dw")
    _close(db, gb.float(), dtype, _grad_scale(1024), "db")
