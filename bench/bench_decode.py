"""Flash decoding against PyTorch on one GPU: one query token per sequence,
Hq 32 / Hkv 8 (GQA), D 128, 32K cached tokens, bf16, batch 1 and 8. Ours
reads paged caches (block size 16 and 64, shuffled tables) and contiguous
ones (torch's [B, Hkv, S, D] as a permuted view), with the plan's own
key splits and any forced by --splits (num_splits), and cuDNN's fused
attention asked for by name with --cudnn (--sweep: split kernels against
cuDNN over contiguous shapes); torch runs
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

    def __init__(self, q, k, v, table, seq_lens, attrs=None, backend=None):
        self.tensors = [q, k, v, table, seq_lens]  # kept alive for the raw views
        self.attrs = dict(attrs or {})
        self.backend = backend
        names = {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32", torch.int32: "i32"}
        specs = [(names[x.dtype], list(x.shape)) for x in self.tensors]
        info = baracuda._baracuda.plan_info(OP, specs, self.attrs, None, "cuda", backend)
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
        baracuda._baracuda.run(OP, self.inputs, self.outputs, self.attrs, self.stream, None, self.backend,
                               self.raw_workspace)
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


def sweep(samples):
    """Contiguous caches over batch, length, heads and head dim: the split
    kernels ("cuda") and cuDNN's fused attention (asked for by name),
    us a call replayed in a CUDA graph (short calls are not host-bound
    there), then torch's eager call; the plan's own pick last."""
    print(f"{'B':>3} {'Hq':>3} {'Hkv':>3} {'D':>4} {'S':>6} {'split us':>9} {'cudnn us':>9} {'torch us':>9} "
          f"{'cudnn/split':>11}  auto")
    for hq, hkv, d in ((32, 8, 128), (32, 8, 64), (32, 32, 128), (64, 8, 128)):
        for b in (1, 4, 16, 64):
            for s in (1024, 4096, 32768):
                if b * s * hkv * d * 4 > 8 << 30:
                    continue
                q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
                v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
                lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
                none = torch.empty(0, dtype=torch.int32, device="cuda")
                want = torch.nn.functional.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True)[:, :, 0]
                times = []
                for backend in ("cuda", "cudnn"):
                    ours = Ours(q, k.transpose(1, 2), v.transpose(1, 2), none, lens, None, backend)
                    bad = "" if close(ours(), want) else f" MISMATCH({backend})"
                    try:
                        times.append((median_ms(ours.graphed(), samples=samples) * 1e3, bad))
                    except RuntimeError as e:  # a capture failure is a finding, not the end of the sweep
                        times.append((float("nan"), f" CAPTURE({backend}: {str(e)[:80]})"))
                auto = Ours(q, k.transpose(1, 2), v.transpose(1, 2), none, lens).sku
                t_torch = median_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                    q[:, :, None], k, v, enable_gqa=True), samples=samples) * 1e3
                print(f"{b:3d} {hq:3d} {hkv:3d} {d:4d} {s:6d} {times[0][0]:9.1f} {times[1][0]:9.1f} {t_torch:9.1f} "
                      f"{times[1][0] / times[0][0]:11.2f}  {auto}{times[0][1]}{times[1][1]}", flush=True)
                del q, k, v
                torch.cuda.empty_cache()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seq", type=int, default=32768)
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--splits", default="", help="comma-separated num_splits to time besides the plan's own choice")
    parser.add_argument("--cudnn", action="store_true", help="also time cuDNN's fused attention asked for by name")
    parser.add_argument("--sweep", action="store_true", help="split kernels against cuDNN over contiguous shapes")
    args = parser.parse_args()
    if args.sweep:
        sweep(args.samples)
        return
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
        runs = [(layout, n, None) for layout in layouts for n in [0, *forced]]
        if args.cudnn:
            runs.insert(1, (layouts[0], 0, "cudnn"))
        for (name, kc, vc, table), splits, backend in runs:
            ours = Ours(q, kc, vc, table, seq_lens, {"num_splits": splits} if splits else None, backend)
            ok = "" if close(ours(), want) else "  MISMATCH"
            t_ours = median_ms(ours, samples=args.samples)
            try:
                t_graph = median_ms(ours.graphed(), samples=args.samples)
            except RuntimeError as e:
                t_graph, ok = float("nan"), ok + f"  CAPTURE FAILED: {str(e)[:80]}"
            tb = lambda ms: kv_bytes / (ms * 1e-3) / 1e12  # noqa: E731
            label = (f"B {b} Hq {hq} Hkv {hkv} D {d} S {s} {name}" + (f" splits {splits}" if splits else "") +
                     (f" {backend}" if backend else ""))
            print(f"{label:<44} {t_ours * 1e3:9.1f} {tb(t_ours):6.2f} "
                  f"{t_torch * 1e3:9.1f} {tb(t_torch):6.2f} {t_torch / t_ours:6.2f} {t_graph * 1e3:9.1f} "
                  f"{tb(t_graph):6.2f}  {ours.sku}{ok}", flush=True)
            del ours
        del q, k, v, layouts
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
