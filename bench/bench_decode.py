"""Flash decoding against PyTorch on one GPU: one query token per sequence,
Hq 32 / Hkv 8 (GQA), D 128, 32K cached tokens, bf16, batch 1 and 8. Ours
reads paged caches (block size 16 and 64, shuffled tables) and contiguous
ones (torch's [B, Hkv, S, D] as a permuted view), with the plan's own
key splits and any forced by --splits (num_splits); torch runs
scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True) on the
contiguous [B, Hkv, S, D] tensors. TB/s counts the K and V bytes read once
(2 * B * S * Hkv * D * 2 / time); times are medians of CUDA-event samples
after a warm-up; the last column replays our call captured in a CUDA graph."""
import argparse

import torch

import baracuda
import baracuda.functional as F
from bench_elementwise import median_ms

OP = "decode_attention"


def close(a, b, tol=2e-2):
    """Largest error within tol of the reference's largest magnitude: a decode
    output averages 32K values and is small, so a fixed atol of tol would pass
    nearly anything."""
    a, b = a.float(), b.float()
    return bool(torch.isfinite(a).all()) and (a - b).abs().max().item() <= tol * b.abs().max().item()


class Ours:
    """One preallocated call of the op, as an engine makes it: outputs and the
    plan's exact workspace given, operands passed as raw views (pointer,
    dtype, shape, strides, device) exported once, the stream looked up once:
    no allocation, DLPack export or stream query per call."""

    def __init__(self, q, k, v, table, seq_lens, attrs=None):
        self.tensors = [q, k, v, table, seq_lens]  # kept alive for the raw views
        self.attrs = dict(attrs or {})
        names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32", torch.int32: "i32"}
        specs = [(names[x.dtype], list(x.shape)) for x in self.tensors]
        info = baracuda._baracuda.plan_info(OP, specs, self.attrs, None, "cuda")
        self.sku = info["sku"]
        self.workspace = torch.empty(max(info["workspace_size"], 1), dtype=torch.uint8, device="cuda")
        b, hq, _ = q.shape
        self.out = torch.empty(b, hq, v.shape[-1], dtype=q.dtype, device="cuda")
        self.lse = torch.empty(b, hq, dtype=torch.float32, device="cuda")

        def raw(x):
            return (x.data_ptr(), names.get(x.dtype, "u8"), tuple(x.shape), x.stride(), 2, x.get_device())
        self.inputs = [raw(x) for x in self.tensors]
        self.outputs = [raw(self.out), raw(self.lse)]
        self.raw_workspace = raw(self.workspace)
        self.stream = torch.cuda.current_stream().cuda_stream

    def __call__(self):
        baracuda._baracuda.run(OP, self.inputs, self.outputs, self.attrs, self.stream, None, None, self.raw_workspace)
        return self.out

    def graphed(self):
        self()  # plans are cached before capture
        graph = torch.cuda.CUDAGraph()
        eager_stream = self.stream
        with torch.cuda.graph(graph):
            self.stream = torch.cuda.current_stream().cuda_stream  # capture runs on a side stream
            self()
        self.stream = eager_stream
        return graph.replay


def paged(k, v, block_size, gen):
    """[B, Hkv, S, D] caches as paged pools [B * S / block_size, block_size, Hkv, D] under one shuffled table."""
    b, hkv, s, d = k.shape
    per_seq = s // block_size
    perm = torch.randperm(b * per_seq, generator=gen).to(k.device)

    def pool(x):
        p = torch.empty(b * per_seq, block_size, hkv, d, dtype=x.dtype, device=x.device)
        p[perm] = x.transpose(1, 2).reshape(b * per_seq, block_size, hkv, d)
        return p
    return pool(k), pool(v), perm.view(b, per_seq).to(torch.int32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--splits", default="", help="comma-separated num_splits to time besides the plan's own choice")
    args = parser.parse_args()
    forced = [int(x) for x in args.splits.split(",") if x]
    hq, hkv, d, s, dt = 32, 8, 128, args.seq, torch.bfloat16
    gen = torch.Generator().manual_seed(0)
    print(f"{'shape':<44} {'ours us':>9} {'TB/s':>6} {'torch us':>9} {'TB/s':>6} {'ratio':>6} {'graph us':>9} {'TB/s':>6}  sku")
    for b in (1, 8):
        q = torch.randn(b, hq, d, device="cuda", dtype=dt)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=dt)
        seq_lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        kv_bytes = 2 * b * s * hkv * d * k.element_size()

        def torch_call():
            return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)

        want = torch_call()[:, :, 0]
        t_torch = median_ms(torch_call, samples=args.samples)
        layouts = [("contiguous", k.transpose(1, 2), v.transpose(1, 2), torch.empty(0, dtype=torch.int32, device="cuda"))]
        for bs in (16, 64):
            layouts.append((f"paged bs {bs}", *paged(k, v, bs, gen)))
        for (name, kc, vc, table), splits in ((layout, n) for layout in layouts for n in [0, *forced]):
            ours = Ours(q, kc, vc, table, seq_lens, {"num_splits": splits} if splits else None)
            ok = "" if close(ours(), want) else "  MISMATCH"
            t_ours = median_ms(ours, samples=args.samples)
            t_graph = median_ms(ours.graphed(), samples=args.samples)
            tb = lambda ms: kv_bytes / (ms * 1e-3) / 1e12  # noqa: E731
            label = f"B {b} Hq {hq} Hkv {hkv} D {d} S {s} {name}" + (f" splits {splits}" if splits else "")
            print(f"{label:<44} {t_ours * 1e3:9.1f} {tb(t_ours):6.2f} "
                  f"{t_torch * 1e3:9.1f} {tb(t_torch):6.2f} {t_torch / t_ours:6.2f} {t_graph * 1e3:9.1f} "
                  f"{tb(t_graph):6.2f}  {ours.sku}{ok}", flush=True)
            del ours
        del q, k, v, layouts
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
