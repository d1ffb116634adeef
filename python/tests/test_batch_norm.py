"""batch_norm through baracuda.functional: on numpy arrays (host backend)
against numpy in float64, and on CUDA tensors against torch (forward,
backward through autograd, the in-place running-stat update; skipped
without torch + CUDA)."""
import numpy as np
import pytest

import baracuda.functional as F

RNG = np.random.default_rng(3)


def _x(shape, lo=-2, hi=2):
    return RNG.uniform(lo, hi, size=shape)


def _reference(x, w, b, eps):
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(axes), x.var(axes)
    invstd = 1 / np.sqrt(var + eps)
    out = (x - mean.reshape(shape)) * (invstd * w).reshape(shape) + b.reshape(shape)
    return out, mean, var, invstd


# ---------------------------------------------------------------- host backend vs numpy

@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5), (2, 4, 3, 5)])
def test_training_matches_numpy_and_updates_running_stats(shape):
    c = shape[1]
    x, w, b = _x(shape), _x(c), _x(c)
    rm, rv = _x(c, -0.5, 0.5), _x(c, 0.5, 2)
    rm0, rv0 = rm.copy(), rv.copy()
    out, mean, var, invstd = _reference(x, w, b, 1e-5)
    got = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.2)
    np.testing.assert_allclose(got, out, rtol=1e-12, atol=1e-12)
    n = x.size // c
    np.testing.assert_allclose(rm, 0.8 * rm0 + 0.2 * mean, rtol=1e-13)
    np.testing.assert_allclose(rv, 0.8 * rv0 + 0.2 * var * n / (n - 1), rtol=1e-13)
    y, sm, si = F.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    np.testing.assert_allclose(sm, mean, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(si, invstd, rtol=1e-12)
    np.testing.assert_allclose(y, out, rtol=1e-12, atol=1e-12)


def test_half_input_with_f32_parameters_and_no_running_stats():
    """torch's mixed batch norm: f16 input, f32 weight and bias, no running stats (their absent outputs are f32)."""
    x = _x((8, 3, 5)).astype(np.float16)
    w, b = _x(3).astype(np.float32), _x(3).astype(np.float32)
    out, _, _, _ = _reference(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64), 1e-5)
    got = F.batch_norm(x, None, None, w, b, training=True)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float64), out, rtol=4e-3, atol=4e-3)


def test_eval_uses_running_stats():
    x, w, b = _x((5, 4, 7)), _x(4), _x(4)
    rm, rv = _x(4, -0.5, 0.5), _x(4, 0.5, 2)
    rm0, rv0 = rm.copy(), rv.copy()
    got = F.batch_norm(x, rm, rv, w, b, training=False, eps=1e-3)
    want = (x - rm[:, None]) / np.sqrt(rv[:, None] + 1e-3) * w[:, None] + b[:, None]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(rm, rm0)
    np.testing.assert_array_equal(rv, rv0)
    g = _x(x.shape)
    gi, gw, gb = F.native_batch_norm_backward(g, x, w, rm, rv, None, None, False, 1e-3)
    invstd = 1 / np.sqrt(rv + 1e-3)
    np.testing.assert_allclose(gi, g * (w * invstd)[:, None], rtol=1e-12)
    np.testing.assert_allclose(gb, g.sum((0, 2)), rtol=1e-12)
    np.testing.assert_allclose(gw, (g * (x - rm[:, None]) * invstd[:, None]).sum((0, 2)), rtol=1e-12)


def test_training_backward_matches_numpy():
    x, w, b, g = _x((3, 4, 6)), _x(4), _x(4), _x((3, 4, 6))
    _, sm, si = F.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
    gi, gw, gb = F.batch_norm_backward(g, x, sm, si, w)
    xhat = (x - sm[:, None]) * si[:, None]
    mg, mgx = g.mean((0, 2), keepdims=True), (g * xhat).mean((0, 2), keepdims=True)
    np.testing.assert_allclose(gi, (w * si)[:, None] * (g - mg - xhat * mgx), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gw, (g * xhat).sum((0, 2)), rtol=1e-12)
    np.testing.assert_allclose(gb, g.sum((0, 2)), rtol=1e-12)
    masked = F.native_batch_norm_backward(g, x, w, None, None, sm, si, True, 1e-5, (True, False, True))
    assert masked[1] is None


def test_channels_last_input_keeps_its_layout():
    x = np.ascontiguousarray(_x((2, 5, 4, 3)).transpose(0, 2, 3, 1)).transpose(0, 3, 1, 2)  # NHWC memory
    out, _, _ = F.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5)
    assert out.strides == x.strides
    np.testing.assert_allclose(out, _reference(x, np.ones(5), np.zeros(5), 1e-5)[0], rtol=1e-12, atol=1e-12)


def test_bad_inputs_raise():
    x = _x((4, 3, 2))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        F.batch_norm(_x((1, 3)), None, None, training=True)
    with pytest.raises(ValueError, match="'weight' shape"):
        F.batch_norm(x, None, None, _x(5), training=True)
    with pytest.raises(ValueError, match="needs 'running_mean'"):
        F.batch_norm(x, None, None)


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import DTYPES, close as _close, gpu, torch  # noqa: E402


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,channels_last", [((8, 16), False), ((4, 32, 9, 11), False), ((8, 64, 28, 28), False),
                                                 ((8, 64, 28, 28), True), ((2, 3, 1000), False), ((5000, 7), False)])
@pytest.mark.parametrize("mixed", [False, True])
def test_batch_norm_matches_torch(dtype, shape, channels_last, mixed):
    dtype = getattr(torch, dtype)
    if mixed and dtype not in (torch.float16, torch.bfloat16):
        pytest.skip("f32 parameters with f16/bf16 input only")
    pdtype = torch.float32 if mixed else dtype
    c = shape[1]
    x = torch.randn(shape, device="cuda", dtype=dtype) + 1.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    w, b = (torch.randn(c, device="cuda", dtype=pdtype) for _ in range(2))
    rm, rv = torch.randn(c, device="cuda", dtype=pdtype) * 0.1, torch.rand(c, device="cuda", dtype=pdtype) + 0.5
    g = torch.randn_like(x)
    xd, wd, bd = (t.double().requires_grad_() for t in (x, w, b))
    for training in (True, False):
        rmd, rvd = rm.double(), rv.double()
        yd = torch.nn.functional.batch_norm(xd, rmd, rvd, wd, bd, training=training, momentum=0.2, eps=1e-5)
        out, save_mean, save_invstd = F.native_batch_norm(x, w, b, rm, rv, training, 0.2, 1e-5)
        _close(out, yd.detach().to(dtype), dtype, 4, f"batch_norm training={training}")
        _close(rm, rmd.to(pdtype), pdtype, 4, "running_mean")
        _close(rv, rvd.to(pdtype), pdtype, 4, "running_var")
        gx, gw, gb = torch.autograd.grad(yd, (xd, wd, bd), g.double())
        dx, dw, db = F.native_batch_norm_backward(g, x, w, rm if not training else None,
                                                  rv if not training else None, save_mean, save_invstd, training, 1e-5)
        count = x.numel() // c
        _close(dx, gx.to(dtype), dtype, 8, f"batch_norm dx training={training}")
        _close(dw, gw.to(pdtype), dtype, 8 * max(1.0, count ** 0.5 / 8), "batch_norm dw")
        _close(db, gb.to(pdtype), dtype, 8 * max(1.0, count ** 0.5 / 8), "batch_norm db")
        # Eval runs next on the stats the training step left.
        rm.copy_(rmd), rv.copy_(rvd)
