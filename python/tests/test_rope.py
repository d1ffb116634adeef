"""Rotary position embedding and the KV-cache append through
baracuda.functional: on numpy arrays (host backend) against numpy in
float64, and on CUDA tensors against a torch rotate_half implementation
(skipped without torch + CUDA)."""
import math

import numpy as np
import pytest

import baracuda.functional as F
from torch_parity import close, gpu, torch

RNG = np.random.default_rng(0)


def _x(shape, dtype=np.float64):
    return RNG.uniform(-2, 2, size=shape).astype(dtype)


# ---------------------------------------------------------------- numpy reference

def _inv_freq(rd, base=10000.0, scaling=None, factor=1.0, low=1.0, high=4.0, original=8192):
    if scaling == "ntk":
        base = base * factor ** (rd / (rd - 2))
    freq = 1.0 / base ** (np.arange(0, rd, 2, dtype=np.float64) / rd)
    if scaling == "linear":
        freq = freq / factor
    elif scaling == "llama3":
        wavelen = 2 * math.pi / freq
        smooth = (original / wavelen - low) / (high - low)
        medium = (1 - smooth) * freq / factor + smooth * freq
        freq = np.where(wavelen < original / high, freq, np.where(wavelen > original / low, freq / factor, medium))
    return freq


def _rope_np(x, positions, rotary_dim=None, interleaved=False, sign=1.0, **freq_args):
    """x [..., seq, heads, dim], positions [..., seq] (broadcast), in float64."""
    x = np.asarray(x, dtype=np.float64)
    rd = rotary_dim or x.shape[-1]
    theta = sign * np.asarray(positions, dtype=np.float64)[..., None] * _inv_freq(rd, **freq_args)  # [..., seq, rd/2]
    cos, sin = np.cos(theta)[..., None, :], np.sin(theta)[..., None, :]  # over heads
    out = x.copy()
    if interleaved:
        a, b = x[..., 0:rd:2], x[..., 1:rd:2]
        out[..., 0:rd:2], out[..., 1:rd:2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = x[..., :rd // 2], x[..., rd // 2:rd]
        out[..., :rd // 2], out[..., rd // 2:rd] = a * cos - b * sin, b * cos + a * sin
    return out


# ---------------------------------------------------------------- host backend vs numpy

SCALINGS = [dict(), dict(scaling="linear", factor=4.0), dict(scaling="ntk", factor=8.0, base=500.0),
            dict(scaling="llama3", factor=8.0, original_max_position=100)]


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotary_dim", [None, 8])
@pytest.mark.parametrize("scaling", SCALINGS)
def test_rope_matches_numpy(interleaved, rotary_dim, scaling):
    x = _x((2, 5, 3, 10))
    pos = RNG.integers(0, 3000, size=(2, 5))
    np_args = {("original" if k == "original_max_position" else k): v for k, v in scaling.items()}
    want = _rope_np(x, pos, rotary_dim, interleaved, **np_args)
    got = F.rope(x, pos, rotary_dim=rotary_dim, interleaved=interleaved, **scaling)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11)
    back = F.rope_backward(got, pos, rotary_dim=rotary_dim, interleaved=interleaved, **scaling)
    np.testing.assert_allclose(back, x, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(F.rope_backward(x, pos, rotary_dim=rotary_dim, interleaved=interleaved, **scaling),
                               _rope_np(x, pos, rotary_dim, interleaved, sign=-1.0, **np_args), rtol=1e-11, atol=1e-11)


def test_rope_f32_shared_positions_rank3_and_int32():
    x = _x((7, 4, 16), np.float32)
    pos = RNG.integers(0, 50000, size=7).astype(np.int32)
    np.testing.assert_allclose(F.rope(x, pos), _rope_np(x, pos), rtol=1e-5, atol=1e-5)
    x4 = _x((3, 7, 4, 16))
    np.testing.assert_allclose(F.rope(x4, pos), _rope_np(x4, pos[None, :]), rtol=1e-11, atol=1e-11)


def test_rope_in_place_and_strided_views():
    base = _x((2, 4, 9, 12))  # [B, H, S, D]
    x = base.transpose(0, 2, 1, 3)[:, ::-1]  # [B, S, H, D], seq walking backwards
    pos = RNG.integers(0, 2000, size=(2, 9))
    want = _rope_np(x, pos, rotary_dim=6, interleaved=True)
    np.testing.assert_allclose(F.rope(x, pos, rotary_dim=6, interleaved=True), want, rtol=1e-11, atol=1e-11)
    y = x.copy()
    assert F.rope(y, pos, rotary_dim=6, interleaved=True, inplace=True) is y
    np.testing.assert_allclose(y, want, rtol=1e-11, atol=1e-11)
    np.testing.assert_array_equal(y[..., 6:], x[..., 6:])


def test_rope_bad_input_raises():
    x, pos = _x((2, 5, 3, 10)), np.zeros((2, 5), np.int64)
    with pytest.raises(ValueError, match="'rotary_dim' must be even"):
        F.rope(x, pos, rotary_dim=5)
    with pytest.raises(ValueError, match="exceeds the head dim"):
        F.rope(x, pos, rotary_dim=12)
    with pytest.raises(ValueError, match="'positions' shape"):
        F.rope(x, np.zeros((2, 4), np.int64))
    with pytest.raises(ValueError, match="'positions' dtype f32"):
        F.rope(x, np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="scaling must be"):
        F.rope(x, pos, scaling="yarn")


def _kv_np(cache, new, seqlens, table, block_size):
    cache = cache.copy()
    for b in range(new.shape[0]):
        for t in range(new.shape[1]):
            p = seqlens[b] + t
            if table is None:
                cache[b, p] = new[b, t]
            else:
                cache[table[b, p // block_size], p % block_size] = new[b, t]
    return cache


@pytest.mark.parametrize("paged", [True, False])
def test_kv_append_matches_numpy(paged):
    B, T, H, D, Dv, block_size = 3, 3, 2, 10, 6, 4
    k, v = _x((B, T, H, D), np.float32), _x((B, T, H, Dv), np.float32)
    seqlens = np.array([0, 5, 9], np.int32)
    if paged:
        table = RNG.permutation(12)[:B * 4].reshape(B, 4).astype(np.int32)
        k_cache, v_cache = _x((12, block_size, H, D), np.float32), _x((12, block_size, H, Dv), np.float32)
    else:
        table = None
        k_cache, v_cache = _x((B, 16, H, D), np.float32), _x((B, 16, H, Dv), np.float32)
    k_want = _kv_np(k_cache, k, seqlens, table, block_size)
    v_want = _kv_np(v_cache, v, seqlens, table, block_size)
    kc, vc = F.kv_append(k, v, k_cache, v_cache, seqlens, table)
    assert kc is k_cache and vc is v_cache
    np.testing.assert_array_equal(k_cache, k_want)
    np.testing.assert_array_equal(v_cache, v_want)


def test_kv_append_bad_block_id_is_named():
    k = _x((1, 2, 1, 4), np.float32)
    cache = np.zeros((4, 2, 1, 4), np.float32)
    with pytest.raises(ValueError, match=r"sequence 0 token 1: position 2 .* block id 7"):
        F.kv_append(k, k, cache, cache.copy(), np.array([1], np.int32), np.array([[0, 7]], np.int32))
    np.testing.assert_array_equal(cache, 0)


# ---------------------------------------------------------------- CUDA vs torch

def _torch_rope(x, positions, rotary_dim=None, base=10000.0):
    """The usual rotate_half formula in float64."""
    rd = rotary_dim or x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, rd, 2, device=x.device, dtype=torch.float64) / rd)
    freqs = positions.double()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]  # [B, S, 1, rd]
    xr, rest = x.double()[..., :rd], x.double()[..., rd:]
    half = torch.cat((-xr[..., rd // 2:], xr[..., :rd // 2]), dim=-1)
    return torch.cat((xr * emb.cos() + half * emb.sin(), rest), dim=-1)


@gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape,rotary_dim", [((2, 33, 8, 128), None), ((1, 7, 3, 20), 12), ((4, 1, 32, 64), 32)])
def test_rope_matches_torch(dtype, shape, rotary_dim):
    x = (torch.rand(shape, device="cuda", dtype=torch.float64) * 4 - 2).to(getattr(torch, dtype))
    pos = torch.randint(0, 8192, shape[:2], device="cuda", dtype=torch.int64)
    want = _torch_rope(x, pos, rotary_dim)
    # scale 4: torch's and our f64 inv_freq differ by an ulp, times positions up to 8192
    close(F.rope(x, pos, rotary_dim=rotary_dim), want, dtype, scale=4, msg=f"{shape}")
    y = x.clone()
    F.rope(y, pos.int(), rotary_dim=rotary_dim, inplace=True)
    close(y, want, dtype, scale=4, msg=f"in place {shape}")
    close(F.rope_backward(F.rope(x, pos, rotary_dim=rotary_dim), pos, rotary_dim=rotary_dim), x, dtype, scale=4)
    xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # [B, S, H, D] with heads outermost
    close(F.rope(xt, pos, rotary_dim=rotary_dim), want, dtype, scale=4, msg=f"strided {shape}")


@gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_kv_append_matches_torch(dtype):
    B, T, H, D, block_size = 3, 5, 4, 128, 16
    t = getattr(torch, dtype)
    k = torch.randn(B, T, H, D, device="cuda").to(t)
    v = torch.randn(B, T, H, D, device="cuda").to(t)
    table = torch.randperm(64, device="cuda")[:B * 4].reshape(B, 4).int()
    seqlens = torch.tensor([0, 14, 40], device="cuda", dtype=torch.int32)
    k_cache = torch.randn(64, block_size, H, D, device="cuda").to(t)
    v_cache = torch.randn(64, block_size, H, D, device="cuda").to(t)
    k_want, v_want = k_cache.clone(), v_cache.clone()
    for b in range(B):
        for i in range(T):
            p = int(seqlens[b]) + i
            k_want[table[b, p // block_size], p % block_size] = k[b, i]
            v_want[table[b, p // block_size], p % block_size] = v[b, i]
    F.kv_append(k, v, k_cache, v_cache, seqlens, table)
    assert torch.equal(k_cache, k_want) and torch.equal(v_cache, v_want)
