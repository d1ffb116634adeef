"""gumbel_softmax and sparsemax through baracuda.functional: on numpy arrays
(host backend) against numpy in float64 (sparsemax exactly; gumbel_softmax:
reproducibility, sample statistics, the one-hot, the straight-through
gradient), and on CUDA tensors against torch and the host sample (skipped
without torch + CUDA)."""
import numpy as np
import pytest

import baracuda.functional as F

RNG = np.random.default_rng(1)


def _sparsemax(z, axis=-1):
    """The sort-based projection (Martins & Astudillo 2016, algorithm 1) in numpy."""
    z = np.moveaxis(np.asarray(z, dtype=np.float64), axis, -1)
    s = -np.sort(-z, axis=-1)
    cs = np.cumsum(s, axis=-1)
    k = np.arange(1, z.shape[-1] + 1)
    support = (1 + k * s > cs).sum(-1, keepdims=True)
    tau = (np.take_along_axis(cs, support - 1, -1) - 1) / support
    return np.moveaxis(np.maximum(z - tau, 0), -1, axis)


def _softmax(z, axis=-1):
    e = np.exp(z - z.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


# ---------------------------------------------------------------- host backend vs numpy

def test_sparsemax_closed_forms_and_numpy():
    np.testing.assert_array_equal(F.sparsemax(np.array([1, 0.5, -1])), [0.75, 0.25, 0])
    np.testing.assert_array_equal(F.sparsemax(np.array([[3.0, 1, 0], [0, 0, 0]]))[0], [1, 0, 0])
    for shape, dim in [((5, 17), -1), ((5, 17), 0), ((3, 4, 300), 1), ((2, 5000), -1)]:
        x = RNG.normal(size=shape) * 2
        y = F.sparsemax(x, dim)
        np.testing.assert_allclose(y, _sparsemax(x, dim), rtol=0, atol=1e-15)
        np.testing.assert_allclose(y.sum(dim), 1, rtol=1e-13)
        np.testing.assert_allclose(F.sparsemax(x.T, dim), _sparsemax(x.T, dim), rtol=0, atol=1e-15)  # a strided view


def test_sparsemax_backward_matches_numpy_and_finite_differences():
    x, g = RNG.normal(size=(4, 9)), RNG.normal(size=(4, 9))
    for dim in (-1, 0):
        y = F.sparsemax(x, dim)
        s = y > 0
        want = np.where(s, g - (g * s).sum(dim, keepdims=True) / s.sum(dim, keepdims=True), 0)
        got = F.sparsemax_backward(g, y, dim)
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)
        h = 1e-7
        for i in [(0, 0), (1, 3), (3, 8)]:
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            fd = ((g * F.sparsemax(xp, dim)).sum() - (g * F.sparsemax(xm, dim)).sum()) / (2 * h)
            np.testing.assert_allclose(got[i], fd, atol=1e-6)


def test_gumbel_softmax_is_reproducible_and_a_distribution():
    x = RNG.normal(size=(64, 33))
    a = F.gumbel_softmax(x, seed=3, offset=7)
    np.testing.assert_array_equal(a, F.gumbel_softmax(x, seed=3, offset=7))
    np.testing.assert_array_equal(a, F.gumbel_softmax(x, 1, False, 1e-20, -1, seed=3, offset=7))  # eps is ignored
    assert not np.array_equal(a, F.gumbel_softmax(x, seed=4, offset=7))
    assert not np.array_equal(a, F.gumbel_softmax(x, seed=3, offset=8))
    np.testing.assert_allclose(a.sum(-1), 1, rtol=1e-13)
    # Rows 1.. with offset + 1 draw the noise rows 1.. drew: offset counts rows.
    np.testing.assert_array_equal(F.gumbel_softmax(x[1:], seed=3, offset=8), a[1:])
    # The noise of (row, col) does not depend on the memory layout: dim 0 of the transpose.
    np.testing.assert_allclose(F.gumbel_softmax(np.ascontiguousarray(x.T), dim=0, seed=3, offset=7), a.T, rtol=1e-14)
    # softmax((x + g) / tau): log-ratios scale by 1 / tau for the same noise.
    b = F.gumbel_softmax(x, tau=0.5, seed=3, offset=7)
    la, lb = np.log(a), np.log(b)
    np.testing.assert_allclose(lb - lb[:, :1], 2 * (la - la[:, :1]), rtol=1e-9, atol=1e-9)


def test_gumbel_softmax_hard_is_the_one_hot_of_the_soft_argmax():
    x = RNG.normal(size=(50, 20))
    y, soft = F.gumbel_softmax(x, tau=0.7, hard=True, seed=11, return_soft=True)
    np.testing.assert_array_equal(soft, F.gumbel_softmax(x, tau=0.7, seed=11))
    np.testing.assert_array_equal(y, np.eye(20)[soft.argmax(-1)])


def test_gumbel_softmax_argmax_frequencies_follow_softmax():
    """argmax(logits + g) ~ Categorical(softmax(logits)); each frequency over N
    samples within 5 standard deviations sqrt(p (1 - p) / N)."""
    logits = np.array([1.5, 0.0, -1.0, 0.5, 0.2, -2.0])
    n = 40000
    y = F.gumbel_softmax(np.tile(logits, (n, 1)), tau=0.5, hard=True, seed=123)
    freq, p = y.mean(0), _softmax(logits)
    np.testing.assert_array_less(np.abs(freq - p), 5 * np.sqrt(p * (1 - p) / n))
    assert set(np.unique(y)) <= {0.0, 1.0} and np.all(y.sum(-1) == 1)


def test_gumbel_softmax_straight_through_gradient():
    x, g = RNG.normal(size=(6, 7)), RNG.normal(size=(6, 7))
    tau = 0.8
    for dim in (-1, 0):
        y, soft = F.gumbel_softmax(x, tau=tau, hard=True, dim=dim, seed=5, return_soft=True)
        got = F.gumbel_softmax_backward(g, soft, tau, dim)
        np.testing.assert_allclose(got, soft * (g - (g * soft).sum(dim, keepdims=True)) / tau, rtol=1e-12, atol=1e-15)
        h = 1e-6
        for i in [(0, 0), (2, 5), (5, 6)]:
            xp, xm = x.copy(), x.copy()
            xp[i] += h
            xm[i] -= h
            loss = lambda z: (g * F.gumbel_softmax(z, tau=tau, dim=dim, seed=5)).sum()  # noqa: E731
            np.testing.assert_allclose(got[i], (loss(xp) - loss(xm)) / (2 * h), atol=1e-7)


def test_bad_arguments_are_named():
    x = np.zeros((2, 3))
    with pytest.raises(ValueError, match="'tau' must be finite and > 0"):
        F.gumbel_softmax(x, tau=0)
    with pytest.raises(ValueError, match="'seed' must be a whole number"):
        F.gumbel_softmax(x, seed=-1)
    with pytest.raises(ValueError, match="dim 2 is out of range for rank 2"):
        F.sparsemax(x, 2)


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import DTYPES, close as _close, gpu, torch  # noqa: E402


def _torch_sparsemax(z, dim=-1):
    """Sparsemax with sort + cumsum in torch (float64)."""
    z = z.double().movedim(dim, -1)
    s = z.sort(-1, descending=True).values
    cs = s.cumsum(-1)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    support = (1 + k * s > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / support
    return (z - tau).clamp_min(0).movedim(-1, dim)


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((8, 100), -1), ((33, 4096), -1), ((2, 70000), -1), ((2, 300000), -1),
                                       ((300, 5), 0), ((2, 3, 2000), 1)])
def test_sparsemax_matches_torch(dtype, shape, dim):
    dtype = getattr(torch, dtype)
    x = (torch.randn(shape, device="cuda") * 2).to(dtype)
    y = F.sparsemax(x, dim)
    want = _torch_sparsemax(x, dim)
    _close(y, want.to(dtype), dtype, 4, "sparsemax")
    g = torch.randn_like(x)
    yq = want.to(dtype)  # the saved output, in the storage dtype; its support decides
    s, gd = yq > 0, g.double()
    gx = torch.where(s, gd - (gd * s).sum(dim, keepdim=True) / s.sum(dim, keepdim=True), 0)
    _close(F.sparsemax_backward(g, yq, dim), gx.to(dtype), dtype, 4, "sparsemax_backward")
    # A strided view: the transpose.
    if x.ndim == 2:
        xt = x.t()
        _close(F.sparsemax(xt, 1 - (dim % 2)), _torch_sparsemax(xt, 1 - (dim % 2)).to(dtype), dtype, 4, "transposed")


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim,hard", [((64, 1000), -1, False), ((64, 1000), -1, True), ((16, 50000), -1, True),
                                            ((300, 7), 0, True), ((2, 3, 513), 1, False)])
def test_gumbel_softmax_gpu_sample_is_the_host_sample(dtype, shape, dim, hard):
    dtype = getattr(torch, dtype)
    x = (torch.randn(shape, device="cuda") * 2).to(dtype)
    tau = 0.7
    y, soft = F.gumbel_softmax(x, tau, hard, dim=dim, seed=77, offset=1234, return_soft=True)
    host_y, host_soft = F.gumbel_softmax(x.double().cpu().numpy(), tau, hard, dim=dim, seed=77, offset=1234,
                                         return_soft=True)
    _close(soft, torch.from_numpy(host_soft).cuda().to(dtype), dtype, 4, "soft")
    if hard:
        assert torch.equal(y.double().cpu(), torch.from_numpy(host_y)), "the one-hot differs from the host's"
    # Backward: softmax's gradient of the same soft sample over tau (torch's formula in float64).
    g = torch.randn_like(x)
    sd = soft.double()
    gx = sd * (g.double() - (g.double() * sd).sum(dim, keepdim=True)) / tau
    _close(F.gumbel_softmax_backward(g, soft, tau, dim), gx.to(dtype), dtype, 8, "gumbel_softmax_backward")
    assert torch.equal(F.gumbel_softmax(x, tau, hard, dim=dim, seed=77, offset=1234), y)
