"""Losses through baracuda.functional: on numpy arrays (host backend) against
formulas in float64, and on CUDA tensors against torch.nn.functional and
torch.autograd (skipped without torch + CUDA)."""
import numpy as np
import pytest

import baracuda
import baracuda.functional as F

RNG = np.random.default_rng(1)


def _u(shape, lo=-2, hi=2):
    return RNG.uniform(lo, hi, size=shape)


def _log_softmax(z, axis):
    m = z.max(axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis, keepdims=True))


# ---------------------------------------------------------------- host backend vs numpy

def test_pointwise_losses_match_numpy():
    x, y = _u((4, 6)), _u((4, 6))
    np.testing.assert_allclose(F.mse_loss(x, y), np.mean((x - y) ** 2), rtol=1e-13)
    np.testing.assert_allclose(F.l1_loss(x, y, reduction="sum"), np.sum(np.abs(x - y)), rtol=1e-13)
    d = np.abs(x - y)
    np.testing.assert_allclose(F.smooth_l1_loss(x, y, reduction="none", beta=0.5),
                               np.where(d < 0.5, 0.5 * d * d / 0.5, d - 0.25), rtol=1e-13)
    np.testing.assert_allclose(F.huber_loss(x, y, delta=0.7), np.mean(np.where(d < 0.7, 0.5 * d * d, 0.7 * (d - 0.35))),
                               rtol=1e-13)
    p, t = _u((4, 6), 0.05, 0.95), _u((4, 6), 0, 1)
    np.testing.assert_allclose(F.binary_cross_entropy(p, t), np.mean(-(t * np.log(p) + (1 - t) * np.log(1 - p))),
                               rtol=1e-13)
    sig = 1 / (1 + np.exp(-x))
    np.testing.assert_allclose(F.binary_cross_entropy_with_logits(x, t),
                               np.mean(-(t * np.log(sig) + (1 - t) * np.log(1 - sig))), rtol=1e-12)
    lx = _log_softmax(x, 1)
    np.testing.assert_allclose(F.kl_div(lx, np.exp(_log_softmax(y, 1)), reduction="batchmean"),
                               np.sum(np.exp(_log_softmax(y, 1)) * (_log_softmax(y, 1) - lx)) / 4, rtol=1e-12)
    gi, gt = F.mse_loss_backward(np.array(1.0), x, y)
    np.testing.assert_allclose(gi, 2 * (x - y) / x.size, rtol=1e-13)
    np.testing.assert_allclose(gt, -2 * (x - y) / x.size, rtol=1e-13)
    v = _u((4,), 0.5, 2)
    np.testing.assert_allclose(F.gaussian_nll_loss(x, y, v),
                               np.mean(0.5 * (np.log(v[:, None]) + (x - y) ** 2 / v[:, None])), rtol=1e-13)
    gv = F.gaussian_nll_loss_backward(np.array(1.0), x, y, v)[2]
    assert gv.shape == (4,)


def test_cross_entropy_matches_numpy():
    z, t = _u((5, 7)), np.array([0, 6, -100, 3, 3])
    lp = _log_softmax(z, 1)
    keep = t != -100
    want = -lp[np.arange(5)[keep], t[keep]].mean()
    np.testing.assert_allclose(F.cross_entropy(z, t), want, rtol=1e-13)
    np.testing.assert_allclose(F.nll_loss(lp, t), want, rtol=1e-13)
    loss, lse = F.cross_entropy_forward(z, t, reduction="sum")
    np.testing.assert_allclose(lse, np.log(np.exp(z).sum(1)), rtol=1e-13)
    g = F.cross_entropy_backward(np.array(1.0), z, t, lse, reduction="sum")
    onehot = np.zeros_like(z)
    onehot[np.arange(5)[keep], t[keep]] = 1
    np.testing.assert_allclose(g, (np.exp(lp) - onehot) * keep[:, None], rtol=1e-12, atol=1e-15)
    fused_loss, fused_grad = F.cross_entropy_fused(z, t, reduction="sum")
    np.testing.assert_allclose(fused_loss, loss, rtol=1e-15)
    np.testing.assert_allclose(fused_grad, g, rtol=1e-15)
    with pytest.raises(ValueError, match="class index 9"):
        F.cross_entropy(z, np.array([0, 9, 1, 1, 1]))


def _np_cosine(x1, x2, y, margin=0.0):
    cos = (x1 * x2).sum(-1) / np.sqrt(((x1 * x1).sum(-1) + 1e-12) * ((x2 * x2).sum(-1) + 1e-12))
    return np.where(y == 1, 1 - cos, np.where(y == -1, np.maximum(cos - margin, 0), 0))


def _np_triplet(a, p, n, margin=1.0, pn=2, eps=1e-6, swap=False):
    def dist(x, y):
        return (np.abs(x - y + eps) ** pn).sum(-1) ** (1 / pn)
    neg = np.minimum(dist(a, n), dist(p, n)) if swap else dist(a, n)
    return np.maximum(margin + dist(a, p) - neg, 0)


def _np_multi_margin(x, y, p=1, margin=1.0, w=None):
    out = np.zeros(x.shape[0])
    for r, t in enumerate(y):
        z = np.maximum(margin - x[r, t] + x[r], 0) ** p
        z[t] = 0
        out[r] = (1 if w is None else w[t]) * z.sum() / x.shape[1]
    return out


def _np_multilabel(x, y):
    out = np.zeros(x.shape[0])
    for r in range(x.shape[0]):
        listed = []
        for t in y[r]:
            if t < 0:
                break
            listed.append(t)
        others = [c for c in range(x.shape[1]) if c not in listed]
        out[r] = sum(max(0, 1 - x[r, j] + x[r, c]) for j in listed for c in others) / x.shape[1]
    return out


def _reduce(v, reduction):
    return v if reduction == "none" else v.mean() if reduction == "mean" else v.sum()


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
def test_row_losses_match_numpy(reduction):
    x1, x2, x3 = _u((6, 9)), _u((6, 9)), _u((6, 9))
    y = np.array([1.0, -1, 1, -1, -1, 0])
    np.testing.assert_allclose(F.cosine_embedding_loss(x1, x2, y, margin=0.2, reduction=reduction),
                               _reduce(_np_cosine(x1, x2, y, 0.2), reduction), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(F.cosine_embedding_loss(x1[0], x2[0], np.array(-1), reduction=reduction),
                               _np_cosine(x1[0], x2[0], -1), rtol=1e-12, atol=1e-15)
    for kw in ({}, {"p": 1, "swap": True}, {"p": 3, "margin": 2.0, "eps": 0.1}):
        want = _np_triplet(x1, x2, x3, **{"pn" if k == "p" else k: v for k, v in kw.items()})
        np.testing.assert_allclose(F.triplet_margin_loss(x1, x2, x3, reduction=reduction, **kw),
                                   _reduce(want, reduction), rtol=1e-12, atol=1e-15)
    t = np.array([0, 8, 3, 3, 5, 1])
    w = _u((9,), 0.5, 2)
    for p, margin, weight in ((1, 1.0, None), (2, 0.6, w)):
        np.testing.assert_allclose(F.multi_margin_loss(x1, t, p=p, margin=margin, weight=weight, reduction=reduction),
                                   _reduce(_np_multi_margin(x1, t, p, margin, weight), reduction), rtol=1e-12)
    np.testing.assert_allclose(F.multi_margin_loss(x1[1], t[1:2], reduction=reduction),  # [C] input, [1] target
                               _np_multi_margin(x1[1:2], t[1:2])[0], rtol=1e-12)
    lists = np.full((6, 9), -1)
    for r in range(6):
        lists[r, : r + 1] = RNG.choice(9, r + 1, replace=False)
    lists[5, 3] = lists[5, 0]  # a class listed twice counts twice
    lists[2, 4] = 7  # after the first -1: not a target
    np.testing.assert_allclose(F.multilabel_margin_loss(x1, lists, reduction=reduction),
                               _reduce(_np_multilabel(x1, lists), reduction), rtol=1e-12)


def test_row_loss_gradients_match_finite_differences():
    x1, x2, x3 = _u((3, 5)), _u((3, 5)), _u((3, 5))
    y, t = np.array([1.0, -1, -1]), np.array([4, 0, 2])
    lists = np.array([[1, 3, -1, 0, 0], [2, -1, 0, 0, 0], [0, 4, 4, -1, -1]])
    cases = [
        (lambda a, b: F.cosine_embedding_loss(a, b, y, margin=-0.5, reduction="sum"),
         F.cosine_embedding_loss_backward(np.array(1.0), x1, x2, y, margin=-0.5, reduction="sum"), (x1, x2)),
        (lambda a, b, c: F.triplet_margin_loss(a, b, c, p=1.5, swap=True, margin=3.0, reduction="sum"),
         F.triplet_margin_loss_backward(np.array(1.0), x1, x2, x3, p=1.5, swap=True, margin=3.0, reduction="sum"),
         (x1, x2, x3)),
        (lambda a: F.multi_margin_loss(a, t, p=2, reduction="sum"),
         (F.multi_margin_loss_backward(np.array(1.0), x1, t, p=2, reduction="sum"),), (x1,)),
        (lambda a: F.multilabel_margin_loss(a, lists, reduction="sum"),
         (F.multilabel_margin_loss_backward(np.array(1.0), x1, lists, reduction="sum"),), (x1,)),
    ]
    h = 1e-6
    for f, grads, xs in cases:
        for k, g in enumerate(grads):
            num = np.zeros_like(xs[k])
            for i in np.ndindex(xs[k].shape):
                plus, minus = [x.copy() for x in xs], [x.copy() for x in xs]
                plus[k][i] += h
                minus[k][i] -= h
                num[i] = (f(*plus) - f(*minus)) / (2 * h)
            np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-7)


def test_row_loss_bad_input():
    x = _u((2, 3))
    with pytest.raises(ValueError, match="class index 3"):
        F.multi_margin_loss(x, np.array([0, 3]))
    with pytest.raises(ValueError, match="'p' must be 1 or 2"):
        F.multi_margin_loss(x, np.array([0, 1]), p=3)
    with pytest.raises(ValueError, match="outside \\[-1, 3\\)"):
        F.multilabel_margin_loss(x, np.array([[0, -2, -1], [0, 1, 2]]))
    with pytest.raises(ValueError, match="'input2' must be"):
        F.cosine_embedding_loss(x, x[:, :2], np.ones(2))
    with pytest.raises(ValueError, match="'negative' must be"):
        F.triplet_margin_loss(x, x, x[0])


def test_linear_cross_entropy_matches_numpy():
    x, w, b = _u((6, 5)), _u((9, 5), -1, 1), _u((9,))
    t = np.array([0, 8, -100, 3, 3, 1])
    z = x @ w.T + b
    lp = _log_softmax(z, 1)
    keep = t != -100
    rows = np.arange(6)[keep]
    e = 0.1
    per_row = np.zeros(6)
    per_row[keep] = -(1 - e) * lp[rows, t[keep]] - e / 9 * lp[rows].sum(1)
    np.testing.assert_allclose(F.linear_cross_entropy(x, w, t, b, label_smoothing=e), per_row.sum() / keep.sum(), rtol=1e-12)
    np.testing.assert_allclose(F.linear_cross_entropy(x, w, t, b, label_smoothing=e, reduction="none"), per_row,
                               rtol=1e-12, atol=1e-15)
    # Gradients: dlogits = (softmax - smoothed one-hot) / rows kept, 0 on ignored rows.
    onehot = np.zeros_like(z)
    onehot[rows, t[keep]] = 1
    dz = (np.exp(lp) - (1 - e) * onehot - e / 9) * keep[:, None] / keep.sum()
    loss, gi, gw, gb = F.linear_cross_entropy_fused(x, w, t, b, label_smoothing=e, chunk_rows=4)
    np.testing.assert_allclose(gi, dz @ w, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gw, dz.T @ x, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gb, dz.sum(0), rtol=1e-11, atol=1e-14)
    gi2, gw2, gb2 = F.linear_cross_entropy_backward(np.array(2.0), x, w, t, b, label_smoothing=e)
    np.testing.assert_allclose(gw2, 2 * dz.T @ x, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gb2, 2 * dz.sum(0), rtol=1e-11, atol=1e-14)
    assert F.linear_cross_entropy_fused(x, w, t)[3] is None  # no bias, no grad_bias
    np.testing.assert_allclose(F.linear_cross_entropy(x, w, t.astype(np.int32), b, label_smoothing=e, reduction="sum"),
                               per_row.sum(), rtol=1e-12)  # i32 targets
    with pytest.raises(ValueError, match="'weight' must be"):
        F.linear_cross_entropy(x, w[:, :4], t)
    with pytest.raises(ValueError, match="'target' must hold class indices"):
        F.linear_cross_entropy(x, w, t.astype(np.float64))


def test_linear_cross_entropy_class_weights_match_numpy():
    """torch's cross_entropy weights: row r counts c[t] nll + e / V sum_k c[k] (-log p_k); mean divides by sum c[t]."""
    x, w, b, c = _u((6, 5)), _u((9, 5), -1, 1), _u((9,)), _u((9,), 0.5, 2)
    t = np.array([0, 8, -100, 3, 3, 1])
    lp = _log_softmax(x @ w.T + b, 1)
    keep = t != -100
    rows = np.arange(6)[keep]
    e = 0.1
    per_row = np.zeros(6)
    per_row[keep] = -(1 - e) * c[t[keep]] * lp[rows, t[keep]] - e / 9 * (c * lp[rows]).sum(1)
    denom = c[t[keep]].sum()
    kw = dict(label_smoothing=e, class_weight=c)
    np.testing.assert_allclose(F.linear_cross_entropy(x, w, t, b, **kw), per_row.sum() / denom, rtol=1e-12)
    np.testing.assert_allclose(F.linear_cross_entropy(x, w, t, b, reduction="none", **kw), per_row, rtol=1e-12,
                               atol=1e-15)
    # dlogits = (c[t] (softmax - one-hot) (1 - e) + e / V (sum(c) softmax - c)) / denom, 0 on ignored rows.
    onehot = np.zeros((6, 9))
    onehot[rows, t[keep]] = 1
    p = np.exp(lp)
    ct = np.where(keep, c[np.where(keep, t, 0)], 0.0)[:, None]
    dz = ((1 - e) * ct * (p - onehot) + e / 9 * (c.sum() * p - c)) * keep[:, None] / denom
    loss, gi, gw, gb = F.linear_cross_entropy_fused(x, w, t, b, chunk_rows=4, **kw)
    np.testing.assert_allclose(loss, per_row.sum() / denom, rtol=1e-12)
    np.testing.assert_allclose(gi, dz @ w, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gw, dz.T @ x, rtol=1e-11, atol=1e-14)
    np.testing.assert_allclose(gb, dz.sum(0), rtol=1e-11, atol=1e-14)
    with pytest.raises(ValueError, match="'class_weight' must be"):
        F.linear_cross_entropy(x, w, t, b, class_weight=c[:4])


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import CUDA, DTYPES, close as _close, gpu, torch  # noqa: E402,F401

if torch is not None:
    import torch.nn.functional as TF


# (name, operand ranges, kwargs); the first operands (by grads) are differentiable.
POINTWISE = [
    ("mse_loss", [(-2, 2), (-2, 2)], {}, 2),
    ("l1_loss", [(-2, 2), (-2, 2)], {}, 2),
    ("huber_loss", [(-2, 2), (-2, 2)], {"delta": 0.7}, 2),
    ("smooth_l1_loss", [(-2, 2), (-2, 2)], {"beta": 0.5}, 2),
    ("binary_cross_entropy", [(0.05, 0.95), (0, 1)], {}, 1),
    ("binary_cross_entropy_with_logits", [(-4, 4), (0, 1)], {}, 2),
    ("kl_div", [(-3, -0.1), (0.01, 1)], {}, 2),
    ("poisson_nll_loss", [(-1, 1.5), (0, 4)], {}, 2),
    ("soft_margin_loss", [(-3, 3), (-1, 1)], {}, 1),
    ("hinge_embedding_loss", [(-2, 2), (-1, 1)], {"margin": 0.5}, 1),
    ("multilabel_soft_margin_loss", [(-3, 3), (0, 1)], {}, 1),
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("case", POINTWISE, ids=[c[0] for c in POINTWISE])
def test_pointwise_losses_match_torch(dtype, reduction, case):
    name, ranges, kwargs, grads = case
    dt = getattr(torch, dtype)
    ops = [torch.empty(37, 129, device="cuda", dtype=dt).uniform_(lo, hi) for lo, hi in ranges]
    if name == "hinge_embedding_loss":
        ops[1] = torch.where(ops[1] > 0, 1.0, -1.0).to(dt)
    got = getattr(F, name)(*ops, reduction=reduction, **kwargs)
    ds = [o.double().requires_grad_(i < grads) for i, o in enumerate(ops)]
    want = getattr(TF, name)(*ds, reduction=reduction, **kwargs)
    scale = 8 if reduction == "none" else 64
    _close(got, want.detach().to(dt), dt, scale, name)
    gy = torch.randn_like(want)
    gx = torch.autograd.grad(want, ds[:grads], gy)
    back = getattr(F, name + "_backward")(gy.to(dt), *ops, reduction=reduction, **kwargs)
    back = back if isinstance(back, tuple) else (back,)
    for k in range(grads):
        _close(back[k], gx[k].to(dt), dt, 16, f"{name}_backward {k}")


@gpu
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_empty_batch_matches_torch(reduction):
    """A batch of no rows on CUDA: mean is 0 / 0 (nan) and sum 0, as torch; both the pointwise and the class losses."""
    x = torch.empty(0, 5, device="cuda")
    t = torch.empty(0, dtype=torch.long, device="cuda")
    cases = [("mse_loss", (x, x)), ("l1_loss", (x, x)), ("binary_cross_entropy_with_logits", (x, x)),
             ("cross_entropy", (x, t)), ("nll_loss", (x, t)), ("cross_entropy", (x, x.softmax(-1))),
             ("multilabel_soft_margin_loss", (x, x))]
    for name, args in cases:
        got = getattr(F, name)(*args, reduction=reduction)
        want = getattr(TF, name)(*args, reduction=reduction)
        assert torch.equal(torch.isnan(got), torch.isnan(want)), (name, got, want)
        if not torch.isnan(want):
            assert got.item() == want.item(), (name, got, want)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_margin_and_gaussian_losses_match_torch(dtype):
    dt = getattr(torch, dtype)
    a, b = (torch.randn(64, 33, device="cuda", dtype=dt) for _ in range(2))
    y = torch.where(torch.rand(64, 33, device="cuda") > 0.5, 1.0, -1.0).to(dt)
    _close(F.margin_ranking_loss(a, b, y, margin=0.3), TF.margin_ranking_loss(a.double(), b.double(), y.double(),
                                                                              margin=0.3).to(dt), dt, 16)
    var = torch.rand(64, device="cuda", dtype=dt) + 0.2
    ad, bd, vd = (t.double().requires_grad_() for t in (a, b, var))
    want = TF.gaussian_nll_loss(ad, bd, vd, full=True)
    _close(F.gaussian_nll_loss(a, b, var, full=True), want.detach().to(dt), dt, 16, "gaussian_nll_loss")
    gx = torch.autograd.grad(want, (ad, bd, vd))
    got = F.gaussian_nll_loss_backward(torch.ones((), device="cuda", dtype=dt), a, b, var, full=True)
    for k in range(3):
        _close(got[k], gx[k].to(dt), dt, 32, f"gaussian_nll_loss_backward {k}")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 10), (33, 1000), (8, 50257), (5, 128256), (4, 5, 3, 7)])
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("weighted,smoothing", [(False, 0.0), (True, 0.0), (False, 0.1), (True, 0.2)])
def test_cross_entropy_matches_torch(dtype, shape, reduction, weighted, smoothing):
    dt = getattr(torch, dtype)
    C = shape[1]
    z = torch.randn(shape, device="cuda", dtype=dt) * 2
    t = torch.randint(0, C, (shape[0],) + shape[2:], device="cuda")
    t[0] = -100
    w = torch.rand(C, device="cuda", dtype=dt) + 0.5 if weighted else None
    zd = z.double().requires_grad_()
    want = TF.cross_entropy(zd, t, None if w is None else w.double(), reduction=reduction, label_smoothing=smoothing)
    loss, lse = F.cross_entropy_forward(z, t, w, reduction=reduction, label_smoothing=smoothing)
    _close(loss, want.detach().to(dt), dt, 16, "cross_entropy")
    gy = torch.randn_like(want)
    (gx,) = torch.autograd.grad(want, zd, gy, retain_graph=True)
    got = F.cross_entropy_backward(gy.to(dt), z, t, lse, w, reduction=reduction, label_smoothing=smoothing)
    _close(got, gx.to(dt), dt, 16, "cross_entropy_backward")
    if reduction != "none":
        (g1,) = torch.autograd.grad(want, zd)
        fl, fg = F.cross_entropy_fused(z, t, w, reduction=reduction, label_smoothing=smoothing)
        _close(fl, want.detach().to(dt), dt, 16, "cross_entropy_fused loss")
        _close(fg, g1.to(dt), dt, 16, "cross_entropy_fused grad")
    lp = torch.log_softmax(z.double(), 1).to(dt)
    _close(F.nll_loss(lp, t, w, reduction=reduction),
           TF.nll_loss(lp.double(), t, None if w is None else w.double(), reduction=reduction).to(dt), dt, 16, "nll_loss")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cross_entropy_probabilities_match_torch(dtype):
    dt = getattr(torch, dtype)
    z = torch.randn(16, 300, device="cuda", dtype=dt)
    p = torch.softmax(torch.randn(16, 300, device="cuda"), 1).to(dt)
    zd = z.double().requires_grad_()
    want = TF.cross_entropy(zd, p.double(), label_smoothing=0.1)
    loss, lse = F.cross_entropy_forward(z, p, label_smoothing=0.1)
    _close(loss, want.detach().to(dt), dt, 16)
    (gx,) = torch.autograd.grad(want, zd)
    _close(F.cross_entropy_backward(torch.ones((), device="cuda", dtype=dt), z, p, lse, label_smoothing=0.1),
           gx.to(dt), dt, 16)


@gpu
@pytest.mark.parametrize("classes", [5000, 50257, 128256])
def test_cross_entropy_masked_logits_match_torch(classes):
    # -inf logits (masked classes) where a thread's first elements are all masked.
    z = torch.randn(16, classes, device="cuda")
    z[:, : classes // 2] = float("-inf")
    t = torch.randint(classes // 2, classes, (16,), device="cuda")
    zd = z.double().requires_grad_()
    want = TF.cross_entropy(zd, t)
    _close(F.cross_entropy(z, t), want.detach().float(), torch.float32, 16, "masked cross_entropy")
    (gx,) = torch.autograd.grad(want, zd)
    _close(F.cross_entropy_fused(z, t)[1], gx.float(), torch.float32, 16, "masked cross_entropy_fused grad")


def _dev(shape, dt, lo=-2, hi=2):
    return torch.empty(shape, device="cuda", dtype=dt).uniform_(lo, hi)


def _parity(name, ours, ours_backward, theirs, ops, grads, dt, scale=16):
    """Forward vs torch in float64, and the backward vs torch.autograd for a random grad_output."""
    ds = [o.double().requires_grad_(i < grads) if o.is_floating_point() else o for i, o in enumerate(ops)]
    want = theirs(*ds)
    _close(ours(*ops), want.detach().to(dt), dt, scale, name)
    gy = torch.randn_like(want)
    gx = torch.autograd.grad(want, ds[:grads], gy)
    back = ours_backward(gy.to(dt), *ops)
    back = back if isinstance(back, tuple) else (back,)
    for k in range(grads):
        _close(back[k], gx[k].to(dt), dt, scale, f"{name}_backward {k}")


ROW_SHAPES = [(64, 10), (33, 1000), (8, 5000), (17,), (256, 512)]  # (256, 512): the bench rows (a warp each, 16-byte loads)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_cosine_embedding_loss_matches_torch(dtype, reduction, shape):
    dt = getattr(torch, dtype)
    x1, x2 = _dev(shape, dt), _dev(shape, dt)
    x2[: shape[0] // 2] += x1[: shape[0] // 2]  # some pairs close
    y = torch.where(torch.rand(shape[:-1], device="cuda") > 0.5, 1.0, -1.0).to(dt)
    for margin, target in ((0.0, y), (0.2, y.long()), (-0.3, y)):
        kw = {"margin": margin, "reduction": reduction}
        _parity("cosine_embedding_loss", lambda a, b, t: F.cosine_embedding_loss(a, b, t, **kw),
                lambda g, a, b, t: F.cosine_embedding_loss_backward(g, a, b, t, **kw),
                lambda a, b, t: TF.cosine_embedding_loss(a, b, t if t.dtype == torch.long else t.double(), **kw),
                [x1, x2, target], 2, dt)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", ROW_SHAPES + [(4, 6, 33)])
@pytest.mark.parametrize("kw", [{}, {"p": 1, "swap": True}, {"p": 3, "margin": 0.5, "eps": 1e-3}],
                         ids=["p2", "p1swap", "p3"])
def test_triplet_margin_loss_matches_torch(dtype, reduction, shape, kw):
    dt = getattr(torch, dtype)
    a, p, n = _dev(shape, dt), _dev(shape, dt), _dev(shape, dt)
    p[..., ::2] = a[..., ::2]  # positives nearer: some rows in the hinge, some out
    kw = dict(kw, reduction=reduction)
    _parity("triplet_margin_loss", lambda *x: F.triplet_margin_loss(*x, **kw),
            lambda g, *x: F.triplet_margin_loss_backward(g, *x, **kw),
            lambda *x: TF.triplet_margin_loss(*x, **kw), [a, p, n], 3, dt, 32)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("p,margin,weighted", [(1, 1.0, False), (2, 0.7, True), (1, 0.3, True)])
def test_multi_margin_loss_matches_torch(dtype, reduction, shape, p, margin, weighted):
    dt = getattr(torch, dtype)
    x = _dev(shape, dt, -1, 1)
    t = torch.randint(0, shape[-1], shape[:-1], device="cuda")
    w = torch.rand(shape[-1], device="cuda", dtype=dt) + 0.5 if weighted else None
    wd = None if w is None else w.double()
    kw = {"p": p, "margin": margin, "reduction": reduction}
    _parity("multi_margin_loss", lambda x_, t_: F.multi_margin_loss(x_, t_, weight=w, **kw),
            lambda g, x_, t_: F.multi_margin_loss_backward(g, x_, t_, weight=w, **kw),
            lambda x_, t_: TF.multi_margin_loss(x_, t_, weight=wd, **kw), [x, t], 1, dt)
    _close(F.multi_margin_loss(x, t.int(), weight=w, **kw), F.multi_margin_loss(x, t, weight=w, **kw), dt, 0,
           "int32 targets")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("shape", [(64, 10), (33, 300), (4, 3000), (3, 20000), (17,), (256, 512)])
def test_multilabel_margin_loss_matches_torch(dtype, reduction, shape):
    dt = getattr(torch, dtype)
    x = _dev(shape, dt, -1, 1)
    C = shape[-1]
    rows = x.reshape(-1, C).shape[0]
    t = torch.full((rows, C), -1, dtype=torch.long)
    for r in range(rows):  # 0 .. C/2 listed classes (duplicates included), then -1 up to the end (torch's contract)
        k = r % (C // 2 + 1)
        t[r, :k] = torch.randint(0, C, (k,))
    t = t.reshape(shape).cuda()
    # The reference runs on the CPU: torch's CUDA backward scales the gradient by grad_output in a loop
    # that no barrier orders after the write of the last listed class's gradient (thread 0, after the
    # block reduction), so that class's gradient is racy there (seen on rows of a few hundred classes,
    # in every dtype; pytorch/pytorch#84202). Both torch backends count duplicated targets twice in the
    # loss and the gradient, as ours.
    _parity("multilabel_margin_loss", lambda x_, t_: F.multilabel_margin_loss(x_, t_, reduction=reduction),
            lambda g, x_, t_: F.multilabel_margin_loss_backward(g, x_, t_, reduction=reduction),
            lambda x_, t_: TF.multilabel_margin_loss(x_.cpu(), t_.cpu(), reduction=reduction).to(x_.device),
            [x, t], 1, dt)
    _close(F.multilabel_margin_loss(x, t.int(), reduction=reduction), F.multilabel_margin_loss(x, t, reduction=reduction),
           dt, 0, "int32 targets")


@gpu
def test_row_losses_strided_and_bad_targets_on_cuda():
    x = torch.randn(40, 64, device="cuda").t()  # [64, 40], column-major
    t = torch.randint(0, 40, (64,), device="cuda")
    _close(F.multi_margin_loss(x, t), TF.multi_margin_loss(x.double(), t).float(), torch.float32, 16)
    a, p, n = (torch.randn(64, 40, device="cuda")[:, ::2] for _ in range(3))
    _close(F.triplet_margin_loss(a, p, n, reduction="none"), TF.triplet_margin_loss(a, p, n, reduction="none"),
           torch.float32, 16)
    # An out-of-range class on CUDA: NaN for its row (no device-side assert), as cross_entropy here.
    bad = F.multi_margin_loss(x, torch.full((64,), 40, device="cuda"), reduction="none")
    assert torch.isnan(bad).all()


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("biased,smoothing,chunk_rows,weighted", [(True, 0.0, 0, False), (False, 0.1, 0, False),
                                                                  (True, 0.2, 7, False), (True, 0.0, 0, True),
                                                                  (False, 0.2, 7, True)])
def test_linear_cross_entropy_matches_torch(dtype, reduction, biased, smoothing, chunk_rows, weighted):
    dt = getattr(torch, dtype)
    N, H, V = 37, 64, 1000
    x = torch.randn(N, H, device="cuda", dtype=dt)
    w = (torch.randn(V, H, device="cuda") / 8).to(dt)
    b = torch.randn(V, device="cuda", dtype=dt) if biased else None
    c = (torch.rand(V, device="cuda") * 1.5 + 0.5).to(dt) if weighted else None
    t = torch.randint(0, V, (N,), device="cuda")
    t[3] = -100
    ds = [a.detach().double().requires_grad_() for a in (x, w)] + ([b.detach().double().requires_grad_()] if biased else [])
    want = TF.cross_entropy(TF.linear(ds[0], ds[1], ds[2] if biased else None), t, reduction=reduction,
                            label_smoothing=smoothing, weight=c.double() if weighted else None)
    kw = dict(reduction=reduction, label_smoothing=smoothing, chunk_rows=chunk_rows, class_weight=c)
    _close(F.linear_cross_entropy(x, w, t, b, **kw), want.detach().to(dt), dt, 16, "linear_cross_entropy")
    gy = torch.randn_like(want)
    grads = torch.autograd.grad(want, ds, gy, retain_graph=True)
    got = F.linear_cross_entropy_backward(gy.to(dt), x, w, t, b, **kw)
    for k, g in enumerate(grads):
        _close(got[k], g.to(dt), dt, 32, f"linear_cross_entropy_backward {k}")
    # Through torch.autograd (mean/sum: the fused op in the forward).
    leaves = [a.clone().requires_grad_() for a in (x, w)] + ([b.clone().requires_grad_()] if biased else [])
    loss = F.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2] if biased else None, **kw)
    loss.backward(gy.to(dt))
    for k, g in enumerate(grads):
        _close(leaves[k].grad, g.to(dt), dt, 32, f"autograd {k}")
    if reduction != "none":
        fl, gi, gw, gb = F.linear_cross_entropy_fused(x, w, t, b, **kw)
        g1 = torch.autograd.grad(want, ds)
        _close(fl, want.detach().to(dt), dt, 16, "fused loss")
        for k, g in enumerate((gi, gw, gb)[:len(ds)]):
            _close(g, g1[k].to(dt), dt, 32, f"fused grad {k}")


@gpu
def test_linear_cross_entropy_long_rows_strided_int32():
    """A vocabulary row above the cached-row threshold, i32 targets, a transposed weight, several chunks."""
    dt = torch.bfloat16
    N, H, V = 300, 128, 50257
    x = torch.randn(N, H, device="cuda", dtype=dt)
    w = (torch.randn(H, V, device="cuda") / 11).to(dt).t()  # [V, H] with strides (1, V)
    t = torch.randint(0, V, (N,), device="cuda", dtype=torch.int32)
    t[::7] = -100
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    want = TF.cross_entropy(xd @ wd.t(), t.long())
    fl, gi, gw, _ = F.linear_cross_entropy_fused(x, w, t, chunk_rows=128)
    _close(fl, want.detach().to(dt), dt, 16, "loss")
    g = torch.autograd.grad(want, (xd, wd))
    _close(gi, g[0].to(dt), dt, 32, "grad_input")
    _close(gw, g[1].to(dt), dt, 32, "grad_weight")


@gpu
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_losses_match_torch(dtype):
    """fp8 storage, f32 arithmetic: the losses against torch in f64 on the same
    fp8 values, rounded to fp8 once; the f32 arithmetic may land one fp8 step
    away (a relative eps). fp8 losses have no gradient ops."""
    dtype = getattr(torch, dtype)
    eps = torch.finfo(dtype).eps

    def check(got, want, what):
        assert got.dtype == dtype, what
        torch.testing.assert_close(got.double(), want.to(dtype).double(), rtol=eps, atol=eps * 2 ** -6, msg=what)

    # Sums within e4m3's range (448; past it the fp8 result is NaN, as torch's cast gives).
    x, y = ((torch.randn(16, 40, device="cuda") * 0.25).to(dtype) for _ in range(2))
    xd, yd = x.double(), y.double()
    for red in ("none", "mean", "sum"):
        check(F.mse_loss(x, y, reduction=red), TF.mse_loss(xd, yd, reduction=red), "mse_loss " + red)
        check(F.l1_loss(x, y, reduction=red), TF.l1_loss(xd, yd, reduction=red), "l1_loss " + red)
        check(F.smooth_l1_loss(x, y, reduction=red, beta=0.5), TF.smooth_l1_loss(xd, yd, reduction=red, beta=0.5),
              "smooth_l1_loss " + red)
    t = (torch.rand(16, 40, device="cuda") > 0.5).to(dtype)
    check(F.binary_cross_entropy_with_logits(x, t), TF.binary_cross_entropy_with_logits(xd, t.double()), "bce_with_logits")
    classes = torch.randint(0, 40, (16,), device="cuda")
    classes[::7] = -100
    for red in ("none", "mean", "sum"):
        check(F.cross_entropy(x, classes, reduction=red, label_smoothing=0.1),
              TF.cross_entropy(xd, classes, reduction=red, label_smoothing=0.1), "cross_entropy " + red)
        lp = torch.log_softmax(xd, 1).to(dtype)
        check(F.nll_loss(lp, classes, reduction=red), TF.nll_loss(lp.double(), classes, reduction=red), "nll_loss " + red)
    sign = (torch.randint(0, 2, (16,), device="cuda") * 2 - 1)
    check(F.cosine_embedding_loss(x, y, sign, margin=0.2), TF.cosine_embedding_loss(xd, yd, sign, margin=0.2),
          "cosine_embedding_loss")
    with pytest.raises(Exception, match="fp8 forwards have no gradient"):
        F.mse_loss_backward(torch.ones((), device="cuda").to(dtype), x, y)
    # ctc_loss (per-sample sums stay below 448) and linear_cross_entropy (f32 logits, H 32: cuBLASLt's fp8 product).
    T, N, C = 30, 3, 10
    lp = torch.log_softmax(torch.randn(T, N, C, device="cuda", dtype=torch.float64), -1).to(dtype)
    tg = torch.randint(1, C, (N, 6), device="cuda")
    il, tl = torch.tensor([30, 25, 20], device="cuda"), torch.tensor([6, 4, 2], device="cuda")
    for red in ("none", "mean", "sum"):
        check(F.ctc_loss(lp, tg, il, tl, reduction=red), TF.ctc_loss(lp.double(), tg, il, tl, reduction=red),
              "ctc_loss " + red)
    w = (torch.randn(40, 32, device="cuda") * 0.25).to(dtype)
    b = torch.randn(40, device="cuda").to(dtype)
    x32 = (torch.randn(16, 32, device="cuda") * 0.5).to(dtype)
    for red in ("none", "mean", "sum"):
        check(F.linear_cross_entropy(x32, w, classes, b, reduction=red, label_smoothing=0.1, chunk_rows=5),
              TF.cross_entropy(TF.linear(x32.double(), w.double(), b.double()), classes, reduction=red,
                               label_smoothing=0.1), "linear_cross_entropy " + red)
    with pytest.raises(Exception, match="fp8 forwards have no gradient"):
        F.ctc_loss_backward(torch.ones((), device="cuda").to(dtype), lp, tg, il, tl)
    with pytest.raises(Exception, match="fp8 forwards have no gradient"):
        F.linear_cross_entropy_backward(torch.ones((), device="cuda").to(dtype), x32, w, classes, b)


def test_linear_cross_entropy_autograd_on_cpu_tensors():
    """linear_cross_entropy's torch.autograd.Function on CPU tensors (the host backend), each reduction,
    against torch's cross_entropy(linear(...)) autograd in float64."""
    torch = pytest.importorskip("torch")
    x = torch.randn(6, 5, dtype=torch.float64)
    w = torch.randn(7, 5, dtype=torch.float64)
    b = torch.randn(7, dtype=torch.float64)
    t = torch.tensor([0, 3, 6, -100, 2, 2])
    for reduction in ("mean", "sum", "none"):
        ours = [v.clone().requires_grad_() for v in (x, w, b)]
        theirs = [v.clone().requires_grad_() for v in (x, w, b)]
        got = F.linear_cross_entropy(*ours[:2], t, ours[2], label_smoothing=0.1, reduction=reduction)
        want = torch.nn.functional.cross_entropy(theirs[0] @ theirs[1].T + theirs[2], t, label_smoothing=0.1,
                                                 reduction=reduction)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        g = torch.linspace(0.5, 2, want.numel(), dtype=torch.float64).reshape(want.shape)
        got.backward(g)
        want.backward(g)
        for o, r, name in zip(ours, theirs, ("input", "weight", "bias")):
            torch.testing.assert_close(o.grad, r.grad, rtol=1e-12, atol=1e-12, msg=f"{reduction} {name}")
