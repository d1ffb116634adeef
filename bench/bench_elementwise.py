"""Elementwise benchmark against PyTorch on one GPU, side by side in one run.

Bandwidth = minimum bytes (each input read once, each output written once) /
median time over CUDA-event-timed runs. Both libraries write into
preallocated outputs (torch's `out=` variants), so neither pays allocation.
"""
import argparse
import statistics

import torch

import baracuda.functional as F


def median_ms(fn, warmup=3, samples=10, reps=5):
    """Median over `samples` of the mean time of `reps` back-to-back calls: the
    host queues calls while the GPU runs (one untimed call first), so Python
    call overhead (ours and torch's) stays out of the kernel time as long as
    it is shorter than the kernel."""
    for _ in range(warmup):
        fn()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(samples):
        fn()  # keeps the GPU busy while the host records `start` and queues the timed calls
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) / reps)
    return statistics.median(times)


def graph_ms(fn, calls=20):
    """Device time of one call alone: `calls` calls captured in a CUDA graph
    (after one call outside it, which builds and caches the plans), the
    graph's replays timed by median_ms."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    return median_ms(graph.replay, samples=15, reps=3) / calls


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=1 << 28)
    parser.add_argument("--only", default="", help="comma-separated row names to run")
    args = parser.parse_args()
    n = args.elements
    side = int(n ** 0.5)
    dev = "cuda"
    torch.manual_seed(0)
    aten = torch.ops.aten
    rows = []

    only = set(filter(None, args.only.split(",")))

    def bench(name, dtype, ours, theirs, nbytes, check=None):
        if only and name not in only:
            return
        if check is not None:
            check()
        t_ours, t_torch = median_ms(ours), median_ms(theirs)
        rows.append((name, str(dtype).replace("torch.", ""), nbytes / t_ours / 1e9, nbytes / t_torch / 1e9,
                     t_torch / t_ours))

    src = torch.empty(n, device=dev, dtype=torch.float32).uniform_(-3, 3)
    dst = torch.empty_like(src)
    copy_tbs = 2 * n * 4 / median_ms(lambda: dst.copy_(src)) / 1e9
    del src, dst

    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        x = torch.empty(n, device=dev, dtype=dtype).uniform_(-3, 3)
        y = torch.empty(n, device=dev, dtype=dtype).uniform_(-3, 3)
        out, out2 = torch.empty_like(x), torch.empty_like(x)

        def same(op_ours, op_torch):
            return lambda: torch.testing.assert_close(op_ours(), op_torch().clone(), rtol=2e-2, atol=2e-2)

        bench("add", dtype, lambda: F.add(x, y, out=out), lambda: torch.add(x, y, out=out2), 3 * n * es,
              same(lambda: F.add(x, y, out=out), lambda: torch.add(x, y, out=out2)))
        bench("mul", dtype, lambda: F.mul(x, y, out=out), lambda: torch.mul(x, y, out=out2), 3 * n * es)
        bench("gelu", dtype, lambda: F.gelu(x, out=out), lambda: aten.gelu.out(x, out=out2), 2 * n * es,
              same(lambda: F.gelu(x, out=out), lambda: aten.gelu.out(x, out=out2)))
        bench("silu", dtype, lambda: F.silu(x, out=out), lambda: aten.silu.out(x, out=out2), 2 * n * es)
        bench("exp", dtype, lambda: F.exp(x, out=out), lambda: torch.exp(x, out=out2), 2 * n * es)
        cond = x > 0
        bench("where", dtype, lambda: F.where(cond, x, y, out=out), lambda: torch.where(cond, x, y, out=out2),
              n * (1 + 3 * es))
        if dtype == torch.float32:
            lo = torch.empty(n, device=dev, dtype=torch.bfloat16)
            bench("cast f32->bf16", dtype, lambda: F.to(x, torch.bfloat16, out=lo), lambda: lo.copy_(x), n * 6)
            del lo
        bench("gelu_backward", dtype, lambda: F.gelu_backward(y, x, out=out),
              lambda: aten.gelu_backward.grad_input(y, x, grad_input=out2), 3 * n * es,
              same(lambda: F.gelu_backward(y, x, out=out), lambda: aten.gelu_backward.grad_input(y, x, grad_input=out2)))
        dy = torch.empty_like(x).uniform_(-1, 1)
        da, db = torch.empty_like(x), torch.empty_like(x)
        bench("mul_backward", dtype, lambda: F.mul_backward(dy, x, y, out=(da, db)),
              lambda: (torch.mul(dy, y, out=out), torch.mul(dy, x, out=out2)), 5 * n * es)
        del dy, da, db, cond
        # Broadcast: [side, side] + [side] (a row vector).
        x2, out_2d, out2_2d = x[: side * side].view(side, side), out[: side * side].view(side, side), out2[: side * side].view(side, side)
        row = y[:side]
        bench("add row-broadcast", dtype, lambda: F.add(x2, row, out=out_2d), lambda: torch.add(x2, row, out=out2_2d),
              (2 * side * side + side) * es,
              same(lambda: F.add(x2, row, out=out_2d), lambda: torch.add(x2, row, out=out2_2d)))
        # Transposed input, contiguous output: a strided read.
        xt = x2.t()
        bench("gelu transposed->contig", dtype, lambda: F.gelu(xt, out=out_2d), lambda: aten.gelu.out(xt, out=out2_2d),
              2 * side * side * es,
              same(lambda: F.gelu(xt, out=out_2d), lambda: aten.gelu.out(xt, out=out2_2d)))
        # Transposed everywhere (torch's layout-preserving outputs): coalesces to contiguous.
        yt = y[: side * side].view(side, side).t()
        ot, ot2 = out_2d.t(), out2_2d.t()
        bench("add transposed (all)", dtype, lambda: F.add(xt, yt, out=ot), lambda: torch.add(xt, yt, out=ot2),
              3 * side * side * es)
        # Every other column: half of each sector is skipped.
        wide = x[: side * (side // 2) * 2].view(side, side // 2 * 2)
        half = wide[:, ::2]
        oh, oh2 = out[: half.numel()].view(half.shape), out2[: half.numel()].view(half.shape)
        bench("exp step-2 columns", dtype, lambda: F.exp(half, out=oh), lambda: torch.exp(half, out=oh2),
              2 * half.numel() * es)
        del x, y, out, out2

    print(f"\ncopy ceiling (torch copy_, f32, {n} elements): {copy_tbs:.3f} TB/s")
    print(f"{'op':28s} {'dtype':9s} {'ours TB/s':>10s} {'torch TB/s':>11s} {'ratio':>7s}")
    for name, dtype, ours, theirs, ratio in rows:
        print(f"{name:28s} {dtype:9s} {ours:10.3f} {theirs:11.3f} {ratio:7.2f}")


if __name__ == "__main__":
    main()
