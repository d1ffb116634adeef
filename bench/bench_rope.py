"""Rotary position embedding and the KV-cache append against PyTorch eager on
one GPU, side by side in one run. Bandwidth (GB/s) = minimum bytes (x read
once, out written once, positions read once; for the append: the new tokens
read and written once) / median time, with bench_elementwise's back-to-back
CUDA-event timing for both libraries. torch gets its cos/sin tables
precomputed (as models cache them); baracuda forms the angles itself."""
import argparse

import torch

import baracuda.functional as F
from bench_elementwise import median_ms


def row(name, dtype, ours, theirs, nbytes, check=None):
    t_ours, t_torch = median_ms(ours), median_ms(theirs)
    ok = "" if check is None else ("" if check() else "  MISMATCH")
    print(f"{name:<44} {str(dtype).replace('torch.', ''):<9} {nbytes / t_ours / 1e6:10.1f} {nbytes / t_torch / 1e6:10.1f}"
          f" {t_torch / t_ours:7.2f}{ok}", flush=True)


def cos_sin(positions, dim, dtype, base=10000.0):
    """[.., S, 1, dim] tables of the rotate_half formula."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device="cuda", dtype=torch.float32) / dim)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)[..., None, :]
    return emb.cos().to(dtype), emb.sin().to(dtype)


def torch_rope(x, cos, sin):
    """The usual rotate_half formula (HF Llama's apply_rotary_pos_emb)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def close(a, b, tol):
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated substrings of the row names to run")
    args = parser.parse_args()
    want = lambda name: any(part in name for part in args.only.split(","))  # noqa: E731
    print(f"{'op':<44} {'dtype':<9} {'ours GB/s':>10} {'torch GB/s':>10} {'ratio':>7}")
    bf16 = torch.bfloat16
    B, S, H, D = 4, 4096, 32, 128
    x = torch.randn(B, S, H, D, device="cuda", dtype=bf16)
    pos = torch.arange(S, device="cuda", dtype=torch.int64).expand(B, S).contiguous()
    cos, sin = cos_sin(pos, D, bf16)
    out = torch.empty_like(x)
    nbytes = 2 * x.numel() * x.element_size() + pos.numel() * pos.element_size()
    if want("rope"):
        row(f"rope [{B}, {S}, {H}, {D}]", bf16, lambda: F.rope(x, pos, out=out), lambda: torch_rope(x, cos, sin),
            nbytes, check=lambda: close(F.rope(x, pos), torch_rope(x, cos, sin), 6e-2))
        y = x.clone()
        row(f"rope [{B}, {S}, {H}, {D}] in place", bf16, lambda: F.rope(y, pos, inplace=True),
            lambda: torch_rope(x, cos, sin), nbytes)
        row(f"rope [{B}, {S}, {H}, {D}] interleaved", bf16, lambda: F.rope(x, pos, interleaved=True, out=out),
            lambda: torch_rope(x, cos, sin), nbytes)
        row(f"rope [{B}, {S}, {H}, {D}] llama3", bf16,
            lambda: F.rope(x, pos, scaling="llama3", factor=8.0, out=out), lambda: torch_rope(x, cos, sin), nbytes)
        row(f"rope_backward [{B}, {S}, {H}, {D}]", bf16, lambda: F.rope_backward(x, pos, out=out),
            lambda: torch_rope(x, cos, -sin), nbytes)
        xt = x.transpose(1, 2).contiguous().transpose(1, 2)  # heads outermost: still 16-byte rows
        row(f"rope [{B}, {S}, {H}, {D}] heads-major view", bf16, lambda: F.rope(xt, pos, out=out),
            lambda: torch_rope(xt, cos, sin), nbytes)
    del x, out
    if want("kv_append"):
        # A decode step: 64 sequences append one token each to a paged cache.
        Bd, Hkv, block_size, blocks = 64, 8, 16, 8192
        k = torch.randn(Bd, 1, Hkv, D, device="cuda", dtype=bf16)
        v = torch.randn(Bd, 1, Hkv, D, device="cuda", dtype=bf16)
        k_cache = torch.zeros(blocks, block_size, Hkv, D, device="cuda", dtype=bf16)
        v_cache = torch.zeros_like(k_cache)
        table = torch.randperm(blocks, device="cuda")[:Bd * 64].reshape(Bd, 64).int()
        seqlens = torch.randint(0, 1000, (Bd,), device="cuda", dtype=torch.int32)
        positions = seqlens.long()
        block_ids = table.gather(1, (positions // block_size)[:, None]).squeeze(1).long()
        slots = positions % block_size

        def torch_append():
            k_cache[block_ids, slots] = k[:, 0]
            v_cache[block_ids, slots] = v[:, 0]
        row(f"kv_append decode B={Bd} Hkv={Hkv} D={D}", bf16,
            lambda: F.kv_append(k, v, k_cache, v_cache, seqlens, table), torch_append,
            4 * k.numel() * k.element_size())


if __name__ == "__main__":
    main()
