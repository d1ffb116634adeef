"""Attention through baracuda.functional: on numpy arrays (host backend)
against a naive numpy softmax, and on CUDA tensors against torch's
scaled_dot_product_attention and its autograd on every CUDA candidate
(skipped without torch + CUDA), forward and backward."""
import numpy as np
import pytest

import baracuda
import baracuda.functional as F
from torch_parity import close, gpu, torch

RNG = np.random.default_rng(1)


def _naive(q, k, v, mask=None, causal=False, scale=None):
    """softmax(scale q k^T + mask) v in float64 with GQA by repeating key heads."""
    group = q.shape[-3] // k.shape[-3]
    k, v = np.repeat(k, group, axis=-3), np.repeat(v, group, axis=-3)
    s = q @ np.swapaxes(k, -1, -2) * (scale or 1 / np.sqrt(q.shape[-1]))
    if mask is not None:
        s = np.where(mask, s, -np.inf) if mask.dtype == bool else s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def test_host_matches_numpy():
    q, k, v = RNG.uniform(-1, 1, (2, 4, 5, 8)), RNG.uniform(-1, 1, (2, 2, 7, 8)), RNG.uniform(-1, 1, (2, 2, 7, 6))
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, enable_gqa=True), _naive(q, k, v), atol=1e-12)
    mask = RNG.uniform(0, 1, (5, 7)) > 0.3
    mask[:, 0] = True
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True), _naive(q, k, v, mask),
                               atol=1e-12)
    q2, k2 = RNG.uniform(-1, 1, (3, 6, 8)), RNG.uniform(-1, 1, (3, 6, 8))
    v2 = RNG.uniform(-1, 1, (3, 6, 8))
    out, lse = F.scaled_dot_product_attention(q2, k2, v2, is_causal=True, scale=0.7, return_lse=True)
    np.testing.assert_allclose(out, _naive(q2, k2, v2, causal=True, scale=0.7), atol=1e-12)
    assert lse.shape == (3, 6)
    with pytest.raises(ValueError, match="enable_gqa"):
        F.scaled_dot_product_attention(q, k, v)


def test_out_takes_the_output_alone_or_with_lse():
    q, k, v = (RNG.uniform(-1, 1, (1, 2, 5, 8)) for _ in range(3))
    want, want_lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    o = np.full_like(want, np.nan)
    assert F.scaled_dot_product_attention(q, k, v, out=o) is o
    np.testing.assert_array_equal(o, want)
    o, lse = np.full_like(want, np.nan), np.full_like(want_lse, np.nan)
    got, got_lse = F.scaled_dot_product_attention(q, k, v, out=(o, lse), return_lse=True)
    assert got is o and got_lse is lse
    np.testing.assert_array_equal(o, want)
    np.testing.assert_array_equal(lse, want_lse)
    o = np.full_like(want, np.nan)
    got, got_lse = F.scaled_dot_product_attention(q, k, v, out=(o, None), return_lse=True)
    assert got is o
    np.testing.assert_array_equal(got_lse, want_lse)
    # f32 queries after f64 ones: the absent mask and slopes are kept per dtype (f32 ones here)
    q32, k32, v32 = (x.astype(np.float32) for x in (q, k, v))
    out32, lse32 = F.scaled_dot_product_attention(q32, k32, v32, return_lse=True)
    assert out32.dtype == np.float32 and lse32.dtype == np.float32
    np.testing.assert_allclose(out32, want, atol=1e-5)


def test_host_backward_is_consistent_with_the_forward():
    q, k, v = RNG.uniform(-1, 1, (1, 2, 4, 4)), RNG.uniform(-1, 1, (1, 2, 6, 4)), RNG.uniform(-1, 1, (1, 2, 6, 4))
    g = RNG.uniform(-1, 1, (1, 2, 4, 4))
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True)
    dq, dk, dv = F.scaled_dot_product_attention_backward(g, q, k, v, out, lse)
    eps = 1e-6
    for x, grad in ((q, dq), (k, dk), (v, dv)):
        idx = (0, 1, 2, 3)
        x[idx] += eps
        plus = (F.scaled_dot_product_attention(q, k, v) * g).sum()
        x[idx] -= 2 * eps
        minus = (F.scaled_dot_product_attention(q, k, v) * g).sum()
        x[idx] += eps
        assert abs((plus - minus) / (2 * eps) - grad[idx]) < 1e-7


def test_varlen_host_matches_dense():
    lens = [3, 5, 1]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    q, k, v = (RNG.uniform(-1, 1, (int(cu[-1]), 2, 8)) for _ in range(3))
    out = F.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b, n in enumerate(lens):
        s = slice(cu[b], cu[b + 1])
        dense = _naive(*(np.swapaxes(x[s], 0, 1) for x in (q, k, v)), causal=True)
        np.testing.assert_allclose(np.swapaxes(out[s], 0, 1), dense, atol=1e-12)


# ---------------------------------------------------------------- CUDA vs torch

def _t(shape, dtype):
    return (torch.rand(shape, device="cuda", dtype=torch.float64) * 2 - 1).to(getattr(torch, dtype))


def _run(op, inputs, outputs, attrs, backend):
    try:
        baracuda._baracuda.run(op, inputs, outputs, attrs, torch.cuda.current_stream().cuda_stream, None, backend,
                               None)
    except baracuda.UnsupportedError as e:  # a build configured without the cuDNN frontend headers has no engine
        if backend == "cudnn" and "built without cuDNN" in str(e):
            pytest.skip(f"no cuDNN engine in this build: {e}")
        raise
    return outputs


ATTRS = dict(scale=0.0, causal=0, bottom_right=0, window_left=-1, window_right=-1, softcap=0.0, dropout_p=0.0,
             seed=0, offset=0)

CASES = [  # (B, Hq, Hkv, Sq, Skv, D, mask kind, causal)
    (2, 4, 4, 64, 64, 64, None, False),
    (1, 8, 2, 100, 100, 128, None, True),
    (2, 4, 1, 33, 77, 64, "bool", False),
    (1, 2, 2, 128, 96, 128, "float", False),
    (2, 8, 2, 257, 190, 64, "bool", False),  # several 64-row tiles of the tensor-core backward, GQA 4:1
]


def _backward_matches(backend, attrs, want, leaves, inputs, atol, what):
    """The backward of `inputs` (q, k, v, out, lse, mask, slopes) on `backend` against autograd of the float64
    forward `want` over `leaves`, for a random grad_output: within atol times each gradient's largest magnitude."""
    q, k, v = inputs[:3]
    g = _t(want.shape, str(q.dtype).replace("torch.", ""))
    want.backward(g.double())
    grads = [torch.empty_like(x) for x in (q, k, v)]
    _run("scaled_dot_product_attention_backward", [g] + inputs, grads, attrs, backend)
    for name, got, leaf in zip("qkv", grads, leaves):
        torch.testing.assert_close(got.double(), leaf.grad, rtol=0, atol=atol * max(leaf.grad.abs().max().item(), 1),
                                   msg=f"{what} grad {name}")


@gpu
@pytest.mark.parametrize("backend", ["cudnn", "cuda"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("case", CASES)
def test_sdpa_matches_torch_on_every_candidate(backend, dtype, case):
    b, hq, hkv, sq, skv, d, mask_kind, causal = case
    if backend == "cudnn" and dtype == "float32":
        pytest.skip("cuDNN's fused attention takes f16 and bf16")
    q, k, v = _t((b, hq, sq, d), dtype), _t((b, hkv, skv, d), dtype), _t((b, hkv, skv, d), dtype)
    mask = None
    if mask_kind == "bool":
        mask = torch.rand((b, 1, sq, skv), device="cuda") > 0.3
        mask[..., 0] = True
    elif mask_kind == "float":
        mask = _t((1, hq, sq, skv), dtype)
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, mask if mask is None or mask.dtype == torch.bool else mask.double(),
                                                            is_causal=causal, enable_gqa=True)
    attrs = dict(ATTRS, causal=int(causal))
    m = mask if mask is not None else torch.empty(0, device="cuda", dtype=q.dtype)
    slopes = torch.empty(0, device="cuda", dtype=torch.float32)
    out = torch.empty((b, hq, sq, d), device="cuda", dtype=q.dtype)
    lse = torch.empty((b, hq, sq), device="cuda", dtype=torch.float64 if dtype == "float64" else torch.float32)
    try:
        _run("scaled_dot_product_attention", [q, k, v, m, slopes], [out, lse], attrs, backend)
    except baracuda.UnsupportedError as e:  # cuDNN may refuse a case in select; it must say why
        if backend == "cudnn":
            pytest.skip(f"cuDNN refused: {e}")
        raise
    close(out, want.detach(), dtype, scale=4, msg=f"{backend} forward")
    _backward_matches(backend, attrs, want, (qd, kd, vd), [q, k, v, out, lse, m, slopes],
                      {"float32": 2e-4, "float16": 1e-2, "bfloat16": 5e-2}[dtype], backend)


@gpu
def test_functional_sdpa_default_candidate_with_torch_views():
    # [B, S, H, D] memory seen as [B, H, S, D], as attention layers produce it.
    q = _t((2, 128, 8, 64), "bfloat16").transpose(1, 2)
    k = _t((2, 128, 2, 64), "bfloat16").transpose(1, 2)
    v = _t((2, 128, 2, 64), "bfloat16").transpose(1, 2)
    got = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True,
                                                            enable_gqa=True)
    close(got, want, "bfloat16", scale=4)


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_functional_bespoke_forward_over_many_key_tiles(dtype, d, causal):
    # A boolean mask: cuDNN refuses it, so the default candidate is the bespoke
    # kernel (on sm_90 the warpgroup-MMA one); lengths off its 128-row and
    # 128-key tiles, five key tiles (its K/V ring wraps), GQA 4:1.
    b, hq, hkv, sq, skv = 2, 8, 2, 300, 520
    q, k, v = _t((b, hq, sq, d), dtype), _t((b, hkv, skv, d), dtype), _t((b, hkv, skv, d), dtype)
    mask = torch.rand((b, 1, sq, skv), device="cuda") > 0.2
    mask[..., 0] = True
    got = F.scaled_dot_product_attention(q, k, v, mask, is_causal=causal, enable_gqa=True)
    full = mask & torch.ones(sq, skv, device="cuda", dtype=torch.bool).tril() if causal else mask
    want = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), full, enable_gqa=True)
    close(got, want, dtype, scale=4)


def _softcap_reference(q, k, v, cap, mask=None):
    """softmax(cap tanh(scale q k^T / cap) + mask) v in float64 autograd, GQA by repeating key heads."""
    group = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    s = cap * torch.tanh(s / cap)
    if mask is not None:
        s = s + mask
    return torch.softmax(s, -1) @ v


@gpu
@pytest.mark.parametrize("backend", ["cudnn", "cuda"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", [(2, 8, 2, 96, 128, 64, False), (1, 4, 4, 70, 256, 128, True)])
def test_softcap_matches_torch_on_every_candidate(backend, dtype, case):
    # cuDNN takes the softcap as a score modifier (no causal band); scores of
    # about +-2 against caps of 1.5: the tanh bends them.
    b, hq, hkv, sq, skv, d, masked = case
    q, k, v = (_t((b, h, s, d), dtype) * 2 for h, s in ((hq, sq), (hkv, skv), (hkv, skv)))
    mask = _t((1, 1, sq, skv), dtype) if masked else None
    cap = 1.5
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    want = _softcap_reference(qd, kd, vd, cap, None if mask is None else mask.double())
    attrs = dict(ATTRS, softcap=cap)
    m = mask if mask is not None else torch.empty(0, device="cuda", dtype=q.dtype)
    slopes = torch.empty(0, device="cuda", dtype=torch.float32)
    out, lse = torch.empty_like(q), torch.empty((b, hq, sq), device="cuda")
    _run("scaled_dot_product_attention", [q, k, v, m, slopes], [out, lse], attrs, backend)
    close(out, want.detach(), dtype, scale=4, msg=f"{backend} softcap forward")
    _backward_matches(backend, attrs, want, (qd, kd, vd), [q, k, v, out, lse, m, slopes], 5e-2, f"{backend} softcap")
    # The default candidate (cuDNN where it serves) gives the same forward.
    close(F.scaled_dot_product_attention(q, k, v, m if masked else None, softcap=cap, enable_gqa=True), want.detach(),
          dtype, scale=4, msg="default softcap forward")


@gpu
@pytest.mark.parametrize("backend", ["cudnn", "cuda"])
@pytest.mark.parametrize("bottom_right", [False, True])
def test_causal_softcap_on_every_candidate(backend, bottom_right):
    # cuDNN takes a causal softcap with the causal mask inside its score modifier.
    b, hq, hkv, sq, skv, d, cap = 2, 8, 2, 96, 128, 64, 1.5
    q, k, v = (_t((b, h, s, d), "bfloat16") * 2 for h, s in ((hq, sq), (hkv, skv), (hkv, skv)))
    shift = skv - sq if bottom_right else 0
    seen = torch.arange(skv, device="cuda")[None, :] <= torch.arange(sq, device="cuda")[:, None] + shift
    hidden = torch.zeros((sq, skv), device="cuda", dtype=torch.float64).masked_fill(~seen, float("-inf"))
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    want = _softcap_reference(qd, kd, vd, cap, hidden)
    attrs = dict(ATTRS, softcap=cap, causal=1, bottom_right=int(bottom_right))
    m, slopes = torch.empty(0, device="cuda", dtype=q.dtype), torch.empty(0, device="cuda", dtype=torch.float32)
    out, lse = torch.empty_like(q), torch.empty((b, hq, sq), device="cuda")
    _run("scaled_dot_product_attention", [q, k, v, m, slopes], [out, lse], attrs, backend)
    close(out, want.detach(), "bfloat16", scale=4, msg=f"{backend} causal softcap forward")
    _backward_matches(backend, attrs, want, (qd, kd, vd), [q, k, v, out, lse, m, slopes], 5e-2,
                      f"{backend} causal softcap")


@gpu
def test_dropout_is_reproducible_on_the_gpu():
    q, k, v = (_t((1, 2, 64, 32), "float16") for _ in range(3))
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=5, offset=2)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=5, offset=2)
    c = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=5, offset=3)
    assert torch.equal(a, b) and not torch.equal(a, c)


@gpu
def test_backward_is_reproducible_when_asked():
    """By default the bespoke backward may sum dQ by atomics (on Hopper: one pass) and its plan says so; after
    F.set_deterministic(True) its plan promises the same bits every run, and two runs give them. Both match torch."""
    b, h, s, d = 1, 8, 300, 128
    q, k, v, g = (_t((b, h, s, d), "bfloat16") for _ in range(4))
    m, slopes = torch.empty(0, device="cuda", dtype=q.dtype), torch.empty(0, device="cuda")
    out, lse = torch.empty_like(q), torch.empty((b, h, s), device="cuda")
    _run("scaled_dot_product_attention", [q, k, v, m, slopes], [out, lse], ATTRS, "cuda")
    specs = [("bf16", list(x.shape)) for x in (g, q, k, v, out)] + [("f32", [b, h, s]), ("bf16", [0]), ("f32", [0])]
    qd, kd, vd = (x.double().requires_grad_() for x in (q, k, v))
    torch.nn.functional.scaled_dot_product_attention(qd, kd, vd).backward(g.double())
    hopper = torch.cuda.get_device_capability() == (9, 0)
    try:
        for reproducible in (False, True):
            F.set_deterministic(reproducible)
            info = baracuda.plan_info("scaled_dot_product_attention_backward", specs, {}, None, "cuda", "cuda")
            if hopper:
                assert ("wgmma_one_pass" in info["sku"]) != reproducible, info["sku"]
            if reproducible:
                assert info["deterministic"], info
            runs = []
            for _ in range(2):
                grads = [torch.empty_like(x) for x in (q, k, v)]
                runs.append(_run("scaled_dot_product_attention_backward", [g, q, k, v, out, lse, m, slopes], grads,
                                 ATTRS, "cuda"))
            for name, got, leaf in zip("qkv", runs[0], (qd, kd, vd)):
                torch.testing.assert_close(got.double(), leaf.grad, rtol=0, atol=5e-2 * leaf.grad.abs().max().item(),
                                           msg=f"grad {name}, reproducible={reproducible}")
            if reproducible:
                assert all(torch.equal(x, y) for x, y in zip(*runs))
    finally:
        F.set_deterministic(False)


@gpu
@pytest.mark.parametrize("backend", ["cudnn", "cuda"])
@pytest.mark.parametrize("bottom_right", [False, True])
@pytest.mark.parametrize("window", [-1, 12])
def test_varlen_forward_backward_on_every_candidate(backend, bottom_right, window):
    # GQA 8/2, causal (and a left window); an empty sequence, one with one token; with
    # bottom-right alignment sequence 3's first 50 queries sit before every key (out 0, lse -inf).
    lens_q, lens_kv = [17, 64, 0, 90, 1], [17, 64, 5, 40, 3]
    cq = torch.tensor([0] + list(np.cumsum(lens_q)), device="cuda", dtype=torch.int32)
    ck = torch.tensor([0] + list(np.cumsum(lens_kv)), device="cuda", dtype=torch.int32)
    tq, tk, hq, hkv, d = int(cq[-1]), int(ck[-1]), 8, 2, 64
    q, k, v, g = _t((tq, hq, d), "bfloat16"), _t((tk, hkv, d), "bfloat16"), _t((tk, hkv, d), "bfloat16"), \
        _t((tq, hq, d), "bfloat16")
    attrs = dict(ATTRS, causal=1, bottom_right=int(bottom_right), window_left=window, max_seqlen_q=max(lens_q),
                 max_seqlen_kv=max(lens_kv))
    slopes = torch.empty(0, device="cuda")
    out, lse = torch.full_like(q, float("nan")), torch.full((hq, tq), float("nan"), device="cuda")
    _run("varlen_attention", [q, k, v, cq, ck, slopes], [out, lse], attrs, backend)
    grads = [torch.full_like(x, float("nan")) for x in (q, k, v)]
    _run("varlen_attention_backward", [g, q, k, v, out, lse, cq, ck, slopes], grads, attrs, backend)
    for b in range(len(lens_q)):
        sq, sk = slice(int(cq[b]), int(cq[b + 1])), slice(int(ck[b]), int(ck[b + 1]))
        if lens_q[b] == 0:  # keys nobody attends to: zero gradients
            assert torch.all(grads[1][sk] == 0) and torch.all(grads[2][sk] == 0), f"{backend} sequence {b}"
            continue
        qd, kd, vd = (x.transpose(0, 1).double().requires_grad_() for x in (q[sq], k[sk], v[sk]))
        # Keys pos - window <= j <= pos, pos = i (+ Lk - Lq bottom-right); a query that sees none gets
        # out = 0 (torch would give NaN).
        shift = lens_kv[b] - lens_q[b] if bottom_right else 0
        rows, keys = torch.arange(lens_q[b], device="cuda"), torch.arange(lens_kv[b], device="cuda")
        pos = rows[:, None] + shift
        seen = (keys[None, :] <= pos) & ((keys[None, :] >= pos - window) if window >= 0 else True)
        scores = (qd @ kd.repeat_interleave(hq // hkv, 0).transpose(1, 2)) / d ** 0.5
        empty = ~seen.any(-1, keepdim=True)  # rows kept finite through the softmax, then zeroed
        weights = torch.softmax(scores.masked_fill(~seen, float("-inf")).masked_fill(empty, 0.0), -1)
        weights = weights.masked_fill(empty, 0.0)
        want = weights @ vd.repeat_interleave(hq // hkv, 0)
        close(out[sq].transpose(0, 1), want.detach(), "bfloat16", scale=4, msg=f"{backend} sequence {b} out")
        want_lse = torch.logsumexp(scores.masked_fill(~seen, float("-inf")), -1)
        torch.testing.assert_close(lse[:, sq].double(), want_lse.detach(), rtol=0, atol=1e-2,
                                   msg=f"{backend} sequence {b} lse")
        want.backward(g[sq].transpose(0, 1).double())
        for name, got, leaf, rows in zip("qkv", grads, (qd, kd, vd), (sq, sk, sk)):
            torch.testing.assert_close(got[rows].transpose(0, 1).double(), leaf.grad, rtol=0,
                                       atol=5e-2 * max(leaf.grad.abs().max().item(), 1),
                                       msg=f"{backend} sequence {b} grad {name}")


@gpu
def test_varlen_matches_torch_per_sequence():
    lens = [17, 64, 3, 90]
    cu = torch.tensor([0] + list(np.cumsum(lens)), device="cuda", dtype=torch.int32)
    q, k, v = (_t((int(cu[-1]), 4, 64), "bfloat16") for _ in range(3))
    out = F.varlen_attention(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    for b in range(len(lens)):
        s = slice(int(cu[b]), int(cu[b + 1]))
        want = torch.nn.functional.scaled_dot_product_attention(*(x[s].transpose(0, 1).double() for x in (q, k, v)),
                                                                is_causal=True)
        close(out[s].transpose(0, 1), want, "bfloat16", scale=4, msg=f"sequence {b}")
