"""ctc_loss through baracuda.functional: on numpy arrays (host backend) against
a numpy alpha/beta reference written here (itself checked against a brute-force
sum over every alignment), and on CUDA tensors against torch.nn.functional.ctc_loss
and torch.autograd (skipped without torch + CUDA)."""
import itertools

import numpy as np
import pytest

import baracuda.functional as F

RNG = np.random.default_rng(2)


def _log_softmax(z, axis=-1):
    m = z.max(axis, keepdims=True)
    return z - m - np.log(np.exp(z - m).sum(axis, keepdims=True))


def _lse(values):
    values = np.asarray(values, dtype=np.float64)
    m = values.max() if values.size else -np.inf
    return m if m == -np.inf else m + np.log(np.exp(values - m).sum())


def brute_force_nll(lp, target, blank=0):
    """-log of the sum over every path of len(lp) classes that collapses to `target`."""
    T, C = lp.shape
    total = []
    for path in itertools.product(range(C), repeat=T):
        collapsed = [c for t, c in enumerate(path) if c != blank and (t == 0 or c != path[t - 1])]
        if collapsed == list(target):
            total.append(sum(lp[t, c] for t, c in enumerate(path)))
    return -_lse(total)


def reference_nll_and_grad(lp, target, blank=0):
    """nll and torch's gradient (exp(lp) - occupancy) of one sample, lp [I, C], in float64."""
    I, C = lp.shape
    ext = [blank]
    for c in target:
        ext += [c, blank]
    L = len(ext)
    if I == 0:
        return (0.0 if len(target) == 0 else np.inf), np.zeros((0, C))
    alpha = np.full((I, L), -np.inf)
    beta = np.full((I, L), -np.inf)
    alpha[0, :2] = lp[0, ext[:2]]
    for t in range(1, I):
        for s in range(L):
            terms = [alpha[t - 1, s]] + ([alpha[t - 1, s - 1]] if s >= 1 else [])
            if s >= 2 and ext[s] != blank and ext[s] != ext[s - 2]:
                terms.append(alpha[t - 1, s - 2])
            alpha[t, s] = _lse(terms) + lp[t, ext[s]]
    beta[I - 1, L - 2 if L >= 2 else 0:] = lp[I - 1, ext[L - 2 if L >= 2 else 0:]]
    for t in range(I - 2, -1, -1):
        for s in range(L):
            terms = [beta[t + 1, s]] + ([beta[t + 1, s + 1]] if s + 1 < L else [])
            if s + 2 < L and ext[s] != blank and ext[s] != ext[s + 2]:
                terms.append(beta[t + 1, s + 2])
            beta[t, s] = _lse(terms) + lp[t, ext[s]]
    nll = -_lse(alpha[I - 1, max(L - 2, 0):])
    grad = np.exp(lp).copy()
    with np.errstate(invalid="ignore"):
        for c in set(ext):
            lcab = np.array([_lse([alpha[t, s] + beta[t, s] for s in range(L) if ext[s] == c]) for t in range(I)])
            grad[:, c] -= np.exp(lcab + nll - lp[:, c])
    return nll, grad


def reference(lp, targets, input_lengths, target_lengths, blank=0, reduction="mean", grad_output=None):
    """Batched loss (and gradient for grad_output) of padded or concatenated targets."""
    T, N, C = lp.shape
    offsets = np.concatenate([[0], np.cumsum(target_lengths)])
    losses, grad = np.zeros(N), np.zeros_like(lp)
    for b in range(N):
        tg = targets[b, :target_lengths[b]] if targets.ndim == 2 else targets[offsets[b]:offsets[b + 1]]
        losses[b], g = reference_nll_and_grad(lp[:input_lengths[b], b], tg, blank)
        if grad_output is not None:
            go = grad_output[b] if reduction == "none" else grad_output
            scale = go / max(target_lengths[b], 1) / N if reduction == "mean" else go
            grad[:input_lengths[b], b] = g * scale
    if reduction == "mean":
        loss = np.mean(losses / np.maximum(target_lengths, 1))
    else:
        loss = losses.sum() if reduction == "sum" else losses
    return loss, grad


# ---------------------------------------------------------------- host backend vs numpy

def test_reference_matches_brute_force():
    for target, I in (([1, 2], 4), ([1, 1], 4), ([2], 3), ([], 3), ([1, 2, 1], 5)):
        lp = _log_softmax(RNG.normal(size=(I, 3)))
        nll, _ = reference_nll_and_grad(lp, target)
        np.testing.assert_allclose(nll, brute_force_nll(lp, target), rtol=1e-12)
        got = F.ctc_loss(lp[:, None, :], np.array([target + [1] * (3 - len(target))]), [I], [len(target)],
                         reduction="none")
        np.testing.assert_allclose(got, [brute_force_nll(lp, target)], rtol=1e-12)


@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("layout", ["padded", "concatenated", "int32"])
def test_ctc_matches_numpy(reduction, layout):
    T, N, C, S = 12, 4, 6, 4
    lp = _log_softmax(RNG.normal(size=(T, N, C)))
    target_lengths = np.array([4, 0, 2, 3])
    input_lengths = np.array([12, 5, 9, 7])
    padded = RNG.integers(1, C, size=(N, S))
    padded[2, :2] = 3  # a repeat
    targets = padded
    if layout == "concatenated":
        targets = np.concatenate([padded[b, :target_lengths[b]] for b in range(N)])
    if layout == "int32":
        targets, input_lengths, target_lengths = (a.astype(np.int32) for a in (padded, input_lengths, target_lengths))
    go = RNG.normal(size=N) if reduction == "none" else np.array(0.7)
    want, want_grad = reference(lp, targets, input_lengths.astype(np.int64), target_lengths.astype(np.int64),
                                reduction=reduction, grad_output=go)
    np.testing.assert_allclose(F.ctc_loss(lp, targets, input_lengths, target_lengths, reduction=reduction), want,
                               rtol=1e-12)
    grad = F.ctc_loss_backward(go, lp, targets, input_lengths, target_lengths, reduction=reduction)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-10, atol=1e-12)


def test_ctc_lists_unbatched_blank_and_zero_infinity():
    T, C = 8, 5
    lp = _log_softmax(RNG.normal(size=(T, 2, C)))
    targets = np.array([[1, 2, 2], [3, 3, 3]])
    # tuples and lists for the lengths, blank 4; sample 1 (3 3 3 in 3 steps) is infeasible
    loss = F.ctc_loss(lp, targets, (8, 3), [3, 3], blank=4, reduction="none")
    want, _ = reference(lp, targets, np.array([8, 3]), np.array([3, 3]), blank=4, reduction="none")
    np.testing.assert_allclose(loss, want, rtol=1e-12)
    assert np.isinf(loss[1])
    zeroed = F.ctc_loss(lp, targets, (8, 3), [3, 3], blank=4, reduction="none", zero_infinity=True)
    np.testing.assert_allclose(zeroed, [want[0], 0.0], rtol=1e-12)
    grad = F.ctc_loss_backward(np.ones(2), lp, targets, (8, 3), [3, 3], blank=4, reduction="none", zero_infinity=True)
    assert np.all(grad[:, 1] == 0)
    g_mean = F.ctc_loss_backward(1.0, lp, targets, (8, 3), [3, 3], blank=4, zero_infinity=True)  # a Python scalar
    np.testing.assert_allclose(g_mean[:, 0], grad[:, 0] / 3 / 2, rtol=1e-12)
    single = F.ctc_loss(lp[:, 0], targets[0], 8, 3, blank=4, reduction="none")
    assert single.shape == ()
    np.testing.assert_allclose(single, want[0], rtol=1e-12)


def test_ctc_bad_input_is_named():
    lp = _log_softmax(RNG.normal(size=(4, 2, 3)))
    with pytest.raises(Exception, match="input_lengths"):
        F.ctc_loss(lp, np.array([[1, 2], [1, 1]]), [5, 4], [2, 1])
    with pytest.raises(Exception, match="label 3"):
        F.ctc_loss(lp, np.array([[1, 3], [1, 1]]), [4, 4], [2, 1])
    with pytest.raises(Exception, match="target_lengths"):
        F.ctc_loss(lp, np.array([[1, 2], [1, 1]]), [4, 4], [3, 1])
    with pytest.raises(ValueError, match="reduction"):
        F.ctc_loss(lp, np.array([[1, 2], [1, 1]]), [4, 4], [2, 1], reduction="batchmean")


# ---------------------------------------------------------------- CUDA vs torch

from torch_parity import DTYPES, close as _close, gpu, torch  # noqa: E402

if torch is not None:
    import torch.nn.functional as TF


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["none", "mean", "sum"])
@pytest.mark.parametrize("layout", ["padded", "concatenated"])
@pytest.mark.parametrize("zero_infinity", [False, True])
def test_ctc_matches_torch(dtype, reduction, layout, zero_infinity):
    dt = getattr(torch, dtype)
    T, N, C, S = 50, 16, 20, 12
    lp = torch.log_softmax(torch.randn(T, N, C, device="cuda", dtype=torch.float64), -1).to(dt)
    target_lengths = torch.randint(0, S + 1, (N,), device="cuda")
    input_lengths = torch.randint(S * 2 + 2, T + 1, (N,), device="cuda")
    input_lengths[0] = T
    input_lengths[1], target_lengths[1] = 3, S  # infeasible: inf (or 0 with zero_infinity)
    padded = torch.randint(1, C, (N, S), device="cuda")
    padded[2, :3] = 7  # repeats
    targets = padded if layout == "padded" else torch.cat([padded[b, :target_lengths[b]] for b in range(N)])
    lpd = lp.double().requires_grad_()
    want = TF.ctc_loss(lpd, targets, input_lengths, target_lengths, reduction=reduction, zero_infinity=zero_infinity)
    got = F.ctc_loss(lp, targets, input_lengths, target_lengths, reduction=reduction, zero_infinity=zero_infinity)
    _close(got, want.detach().to(dt), dt, 64, "ctc_loss")
    gy = torch.randn_like(want)
    (gx,) = torch.autograd.grad(want, lpd, gy)
    grad = F.ctc_loss_backward(gy.to(dt), lp, targets, input_lengths, target_lengths, reduction=reduction,
                               zero_infinity=zero_infinity)
    if not zero_infinity:  # the infinite sample's gradient is NaN in both: compare the others
        keep = torch.tensor([0] + list(range(2, N)), device="cuda")
        gx, grad = gx[:, keep], grad[:, keep]
        assert torch.isnan(F.ctc_loss_backward(gy.to(dt), lp, targets, input_lengths, target_lengths,
                                               reduction=reduction)[0, 1]).all()
    _close(grad, gx.to(dt), dt, 64, "ctc_loss_backward")


@gpu
def test_ctc_unbatched_and_cpu_lengths_match_torch():
    T, C = 30, 10
    lp = torch.log_softmax(torch.randn(T, C, device="cuda"), -1)
    tg = torch.tensor([1, 2, 2, 5], device="cuda")
    want = TF.ctc_loss(lp, tg, torch.tensor(T), torch.tensor(4), reduction="none")
    _close(F.ctc_loss(lp, tg, T, 4, reduction="none"), want, torch.float32, 16)
    lp3 = lp[:, None].expand(T, 3, C)
    want3 = TF.ctc_loss(lp3, tg.expand(3, 4), (30, 20, 12), (4, 3, 2), reduction="sum")
    got3 = F.ctc_loss(lp3, tg.expand(3, 4), torch.tensor([30, 20, 12]), torch.tensor([4, 3, 2]), reduction="sum")
    _close(got3, want3, torch.float32, 16)
