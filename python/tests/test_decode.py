"""decode_attention through baracuda.functional: the host backend against a
numpy softmax over gathered pages, and CUDA against torch's
scaled_dot_product_attention on the gathered keys (skipped without CUDA)."""
import numpy as np
import pytest

import baracuda.functional as F
from torch_parity import close, gpu, torch

RNG = np.random.default_rng(0)


def _paged(lens, hkv, d, dv, block_size, rng):
    """Caches with each sequence's blocks shuffled over the pool; unused table entries out of range."""
    need = [(n + block_size - 1) // block_size for n in lens]
    max_blocks, num_blocks = max(need) + 1, sum(need) + 2
    perm = rng.permutation(num_blocks)
    table = np.full((len(lens), max_blocks), 1 << 30, dtype=np.int32)
    used = 0
    for b, n in enumerate(need):
        table[b, :n] = perm[used:used + n]
        used += n
    k = rng.uniform(-2, 2, (num_blocks, block_size, hkv, d))
    v = rng.uniform(-2, 2, (num_blocks, block_size, hkv, dv))
    return k, v, table


def _gather(cache, table, b, n, block_size):
    """Keys 0..n-1 of sequence b as [n, Hkv, D]."""
    j = np.arange(n)
    return cache[table[b, j // block_size], j % block_size]


def _reference(q, keys, values, scale=None, softcap=0.0, window_left=-1):
    """keys[b], values[b]: [n, Hkv, D] per sequence; returns (out, lse) in float64."""
    bsz, hq, d = q.shape
    out = np.zeros((bsz, hq, values[0].shape[-1]))
    lse = np.full((bsz, hq), -np.inf)
    scale = 1 / np.sqrt(d) if scale is None else scale
    for b in range(bsz):
        n = keys[b].shape[0]
        lo = max(0, n - 1 - window_left) if window_left >= 0 else 0
        if n - lo == 0:
            continue
        group = hq // keys[b].shape[1]
        k = np.repeat(keys[b][lo:], group, axis=1)    # [n, Hq, D]
        v = np.repeat(values[b][lo:], group, axis=1)
        s = np.einsum("hd,nhd->hn", q[b], k) * scale
        if softcap > 0:
            s = softcap * np.tanh(s / softcap)
        top = s.max(axis=1, keepdims=True)
        w = np.exp(s - top)
        out[b] = np.einsum("hn,nhd->hd", w, v) / w.sum(axis=1)[:, None]
        lse[b] = top[:, 0] + np.log(w.sum(axis=1))
    return out, lse


# ---------------------------------------------------------------- host backend vs numpy

@pytest.mark.parametrize("hq,hkv,d,dv,block_size,lens", [
    (4, 1, 40, 40, 16, [1, 0, 37]), (8, 8, 64, 64, 1, [5, 16, 33]), (8, 2, 16, 24, 3, [29, 2]),
    (8, 1, 128, 128, 16, [70])])
@pytest.mark.parametrize("opts", [{}, {"softcap": 3.0}, {"window_left": 4}, {"scale": 0.5}])
def test_paged_matches_numpy(hq, hkv, d, dv, block_size, lens, opts):
    k, v, table = _paged(lens, hkv, d, dv, block_size, RNG)
    q = RNG.uniform(-2, 2, (len(lens), hq, d))
    seq_lens = np.array(lens, dtype=np.int32)
    out, lse = F.decode_attention(q, k, v, seq_lens, table, **opts)
    keys = [_gather(k, table, b, n, block_size) for b, n in enumerate(lens)]
    values = [_gather(v, table, b, n, block_size) for b, n in enumerate(lens)]
    want_out, want_lse = _reference(q, keys, values, **opts)
    np.testing.assert_allclose(out, want_out, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-11, atol=1e-11)
    for b, n in enumerate(lens):
        if n == 0:
            assert np.all(out[b] == 0) and np.all(np.isneginf(lse[b]))


def test_contiguous_caches_as_permuted_views():
    lens, hkv, s_max = [9, 1, 30], 2, 32
    k = RNG.uniform(-2, 2, (3, hkv, s_max, 64)).astype(np.float32)  # torch's [B, Hkv, S, D]
    v = RNG.uniform(-2, 2, (3, hkv, s_max, 64)).astype(np.float32)
    q = RNG.uniform(-2, 2, (3, 8, 64)).astype(np.float32)
    out, lse = F.decode_attention(q, k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3), np.array(lens, np.int32))
    assert out.dtype == np.float32 and lse.dtype == np.float32
    want_out, want_lse = _reference(q.astype(np.float64), [k[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lens)],
                                    [v[b, :, :n].transpose(1, 0, 2) for b, n in enumerate(lens)])
    np.testing.assert_allclose(out, want_out, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(lse, want_lse, rtol=2e-5, atol=2e-5)


def test_bad_input_is_named():
    q = np.zeros((2, 6, 16))
    k = np.zeros((4, 8, 4, 16))
    table = np.zeros((2, 2), np.int32)
    with pytest.raises(Exception, match="Hq = 6.*Hkv = 4"):
        F.decode_attention(q, k, k, np.array([1, 1], np.int32), table)
    with pytest.raises(Exception, match="'block_table' dtype i64"):
        F.decode_attention(np.zeros((2, 4, 16)), k, k, np.array([1, 1], np.int32), table.astype(np.int64))
    with pytest.raises(Exception, match=r"block_table\[1, 0\] = 7 is out of range"):
        F.decode_attention(np.zeros((2, 4, 16)), k, k, np.array([1, 1], np.int32), np.array([[0, 0], [7, 0]], np.int32))


# ---------------------------------------------------------------- CUDA vs torch SDPA

def _raw_dtype(x):
    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32", torch.int32: "i32",
            torch.uint8: "u8"}[x.dtype]


def _raw(x):
    """A CUDA tensor as the raw view an engine passes: (pointer, dtype, shape, strides, device type 2, device)."""
    return (x.data_ptr(), _raw_dtype(x), tuple(x.shape), x.stride(), 2, x.get_device())


def _sdpa_reference(q, keys, values, scale=None):
    """torch SDPA per sequence on gathered [1, Hkv, n, D] keys with GQA; empty sequences give 0."""
    outs = []
    for b, (kb, vb) in enumerate(zip(keys, values)):
        if kb.shape[0] == 0:
            outs.append(torch.zeros(q.shape[1], vb.shape[-1], dtype=q.dtype, device=q.device))
            continue
        o = torch.nn.functional.scaled_dot_product_attention(
            q[b:b + 1, :, None], kb.transpose(0, 1)[None], vb.transpose(0, 1)[None], scale=scale, enable_gqa=True)
        outs.append(o[0, :, 0])
    return torch.stack(outs)


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("hq,hkv,d,block_size,lens", [
    (32, 8, 128, 16, [1000, 1, 0, 4097]), (8, 1, 64, 1, [33, 7]), (4, 4, 40, 16, [100, 3]),
    (16, 2, 256, 64, [2000])])
def test_cuda_matches_torch_sdpa(dtype, hq, hkv, d, block_size, lens):
    dt = getattr(torch, dtype)
    k, v, table = _paged(lens, hkv, d, d, block_size, RNG)
    kt, vt = torch.tensor(k, dtype=dt, device="cuda"), torch.tensor(v, dtype=dt, device="cuda")
    tt = torch.tensor(table, device="cuda")
    q = (torch.rand(len(lens), hq, d, device="cuda", dtype=torch.float64) * 4 - 2).to(dt)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    out = torch.full((len(lens), hq, d), float("nan"), dtype=dt, device="cuda")
    lse = torch.full((len(lens), hq), float("nan"), dtype=torch.float32, device="cuda")
    F.decode_attention(q, kt, vt, seq_lens, tt, out=(out, lse))
    idx = [torch.arange(n, device="cuda") for n in lens]
    keys = [kt[tt[b, i // block_size].long(), i % block_size] for b, i in enumerate(idx)]
    values = [vt[tt[b, i // block_size].long(), i % block_size] for b, i in enumerate(idx)]
    close(out, _sdpa_reference(q, keys, values), dt, scale=4 if dtype == "float32" else 2, msg=f"{dtype} {hq}/{hkv} D {d} bs {block_size}")
    for b, kb in enumerate(keys):
        kk = kb.double().repeat_interleave(hq // hkv, dim=1)  # [n, Hq, D]
        s = torch.einsum("hd,nhd->hn", q[b].double(), kk) / d ** 0.5
        want = torch.logsumexp(s, dim=1) if kb.shape[0] else torch.full((hq,), -float("inf"), device="cuda",
                                                                         dtype=torch.float64)
        torch.testing.assert_close(lse[b].double(), want, rtol=2e-5, atol=2e-5)
    again = F.decode_attention(q, kt, vt, seq_lens, tt)
    assert torch.equal(again[0], out) and torch.equal(again[1], lse), "two runs differ"


@gpu
def test_cuda_contiguous_torch_layout_and_options():
    dt = torch.bfloat16
    b, hq, hkv, s, d = 2, 32, 8, 3000, 128
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    q = torch.randn(b, hq, d, device="cuda", dtype=dt)
    seq_lens = torch.tensor([s, 1234], dtype=torch.int32, device="cuda")
    out, _ = F.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), seq_lens)
    keys = [k[i, :, :n].transpose(0, 1) for i, n in enumerate(seq_lens.tolist())]
    values = [v[i, :, :n].transpose(0, 1) for i, n in enumerate(seq_lens.tolist())]
    close(out, _sdpa_reference(q, keys, values), dt, scale=2)
    # softcap and window against the numpy reference in float64.
    out, lse = F.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), seq_lens, softcap=20.0, window_left=500)
    want_out, want_lse = _reference(q.double().cpu().numpy(), [x.double().cpu().numpy() for x in keys],
                                    [x.double().cpu().numpy() for x in values], softcap=20.0, window_left=500)
    close(out, torch.tensor(want_out, device="cuda"), dt, scale=2)
    torch.testing.assert_close(lse.double(), torch.tensor(want_lse, device="cuda"), rtol=2e-5, atol=2e-5)


@gpu
def test_cuda_chained_calls_read_the_previous_output():
    """Each call's query is the previous call's output, the calls queued back to back into outputs
    poisoned with NaN first: the split kernel launches overlapped with the kernel before it (the previous
    call's combine) and must wait for it before it reads the query."""
    dt = torch.bfloat16
    b, hq, hkv, s, d, calls = 2, 32, 8, 8192, 128, 6
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=dt) + 1  # outputs near 1: later queries stay informative
    seq_lens = torch.tensor([s, 5000], dtype=torch.int32, device="cuda")
    outs = [torch.full((b, hq, d), float("nan"), dtype=dt, device="cuda") for _ in range(calls)]
    lses = [torch.full((b, hq), float("nan"), dtype=torch.float32, device="cuda") for _ in range(calls)]
    queries = [torch.randn(b, hq, d, device="cuda", dtype=dt)] + outs[:-1]
    for q, out, lse in zip(queries, outs, lses):
        F.decode_attention(q, k.transpose(1, 2), v.transpose(1, 2), seq_lens, out=(out, lse))
    keys = [k[i, :, :n].transpose(0, 1) for i, n in enumerate(seq_lens.tolist())]
    values = [v[i, :, :n].transpose(0, 1) for i, n in enumerate(seq_lens.tolist())]
    for i, (q, out) in enumerate(zip(queries, outs)):
        assert torch.isfinite(out.float()).all(), f"call {i} read a query its predecessor had not written"
        close(out, _sdpa_reference(q, keys, values), dt, scale=2, msg=f"call {i}")


@gpu
def test_cuda_bad_entries_do_not_fault():
    k, v, table = _paged([64, 64], 2, 64, 64, 16, RNG)
    kt = torch.tensor(k, dtype=torch.bfloat16, device="cuda")
    vt = torch.tensor(v, dtype=torch.bfloat16, device="cuda")
    table[0, 1] = 1 << 20
    table[1, 0] = -3
    seq_lens = torch.tensor([64, 10 ** 6], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 4, 64, device="cuda", dtype=torch.bfloat16)
    out, lse = F.decode_attention(q, kt, vt, seq_lens, torch.tensor(table, device="cuda"))
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all()


@gpu
def test_cuda_raw_views_and_raw_workspace():
    """An engine's call: operands, outputs and the plan's workspace as raw views (pointer, dtype, shape,
    strides, device), no DLPack; equal to the functional call, and a short raw workspace is refused."""
    import baracuda._baracuda as B
    dt = torch.bfloat16
    b, hq, hkv, s, d = 2, 32, 8, 5000, 128
    k = torch.randn(b, s, hkv, d, device="cuda", dtype=dt)
    v = torch.randn(b, s, hkv, d, device="cuda", dtype=dt)
    q = torch.randn(b, hq, d, device="cuda", dtype=dt)
    table = torch.empty(0, dtype=torch.int32, device="cuda")
    seq_lens = torch.tensor([s, 777], dtype=torch.int32, device="cuda")
    want = F.decode_attention(q, k, v, seq_lens)
    inputs = [q, k, v, table, seq_lens]
    info = B.plan_info("decode_attention", [(_raw_dtype(x), list(x.shape)) for x in inputs], {}, None, "cuda")
    assert info["workspace_size"] > 0  # split: the partials live in the workspace
    ws = torch.empty(info["workspace_size"], dtype=torch.uint8, device="cuda")
    out = torch.full_like(want[0], float("nan"))
    lse = torch.full_like(want[1], float("nan"))
    stream = torch.cuda.current_stream().cuda_stream
    B.run("decode_attention", [_raw(x) for x in inputs], [_raw(out), _raw(lse)], {}, stream, None, None, _raw(ws))
    assert torch.equal(out, want[0]) and torch.equal(lse, want[1])
    short = ws[:-1]
    with pytest.raises(Exception, match="workspace has"):
        B.run("decode_attention", [_raw(x) for x in inputs], [_raw(out), _raw(lse)], {}, stream, None, None,
              _raw(short))


@gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_cuda_cudnn_backend_matches_torch_sdpa(dtype):
    """cuDNN's fused attention asked for by name (Note [Decode on cuDNN]): contiguous caches in torch's
    [B, Hkv, S, D] layout, mixed lengths with an empty sequence (out 0, lse -inf) and one past the capacity
    (clamped), NaN in every cache row past a length. Its lse is not bitwise reproducible at such lengths: each
    of two runs is checked."""
    import baracuda._baracuda as B
    dt = getattr(torch, dtype)
    b, hq, hkv, s, d = 4, 32, 8, 3000, 128
    lens = [s, 1234, 0, s + 500]
    k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    v = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
    for i, n in enumerate(lens):
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    q = torch.randn(b, hq, d, device="cuda", dtype=dt)
    seq_lens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    table = torch.empty(0, dtype=torch.int32, device="cuda")
    inputs = [q, k.transpose(1, 2), v.transpose(1, 2), table, seq_lens]
    info = B.plan_info("decode_attention", [(_raw_dtype(x), list(x.shape)) for x in inputs], {}, None, "cuda",
                       "cudnn")
    assert info["backend"] == "cudnn"
    ws = torch.full((info["workspace_size"],), 255, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    results = []
    for _ in range(2):
        out = torch.full((b, hq, d), float("nan"), dtype=dt, device="cuda")
        lse = torch.full((b, hq), float("nan"), dtype=torch.float32, device="cuda")
        B.run("decode_attention", [_raw(x) for x in inputs], [_raw(out), _raw(lse)], {}, stream, None, "cudnn",
              _raw(ws))
        results.append((out, lse))
    used = [min(n, s) for n in lens]
    keys = [k[i, :, :n].transpose(0, 1) for i, n in enumerate(used)]
    values = [v[i, :, :n].transpose(0, 1) for i, n in enumerate(used)]
    want_out = _sdpa_reference(q, keys, values)
    for out, lse in results:
        close(out, want_out, dt, scale=2)
        for i, kb in enumerate(keys):
            kk = kb.double().repeat_interleave(hq // hkv, dim=1)
            sc = torch.einsum("hd,nhd->hn", q[i].double(), kk) / d ** 0.5
            want = torch.logsumexp(sc, dim=1) if kb.shape[0] else torch.full((hq,), -float("inf"), device="cuda",
                                                                              dtype=torch.float64)
            torch.testing.assert_close(lse[i].double(), want, rtol=2e-5, atol=2e-5)
