"""Where a decode call's time goes (one GPU): 20 back-to-back calls captured
in one CUDA graph, replayed under torch.profiler, for the split kernels, cuDNN
asked for by name and torch's SDPA; per kernel name the median duration (us,
CUPTI's start to end: a kernel launched overlapped starts early and waits),
then the call period ((last end - first start) / calls). The bench_decode
shapes: 32K keys, Hq 32 / Hkv 8, D 128, bf16, contiguous caches."""
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

from bench_decode import Ours

CALLS = 20


def graph_of(fn, stream, calls=CALLS):
    """`calls` calls of fn captured on `stream` (ours queue on it by handle, torch's on the current stream)."""
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            fn()
    return g


def report(label, graph):
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                     key=lambda e: e.time_range.start)
    if not kernels:
        print(f"{label}: no kernel events")
        return
    by_name = {}
    for e in kernels:
        by_name.setdefault(e.name, []).append(e.time_range.end - e.time_range.start)
    span = kernels[-1].time_range.end - kernels[0].time_range.start
    print(f"{label}: {len(kernels)} kernels, period {span / (3 * CALLS):.1f} us a call")
    for name, d in by_name.items():
        print(f"    {statistics.median(d):8.1f} us  x{len(d):<4d} {name[:110]}")
    # gaps between consecutive kernels (start of next - end of previous), median by the pair's names
    gaps = {}
    for a, b in zip(kernels, kernels[1:]):
        gaps.setdefault((a.name[:40], b.name[:40]), []).append(b.time_range.start - a.time_range.end)
    for (a, b), d in gaps.items():
        print(f"    gap {statistics.median(d):7.1f} us  {a} -> {b}")


def main():
    hq, hkv, d, s = 32, 8, 128, 32768
    for b in (1, 8):
        q = torch.randn(b, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16)
        lens = torch.full((b,), s, dtype=torch.int32, device="cuda")
        none = torch.empty(0, dtype=torch.int32, device="cuda")
        for backend in ("cuda", "cudnn"):
            ours = Ours(q, k.transpose(1, 2), v.transpose(1, 2), none, lens, None, backend)
            stream = torch.cuda.Stream()
            ours.stream = stream.cuda_stream
            report(f"B{b} ours {backend}", graph_of(ours, stream))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        report(f"B{b} torch", graph_of(lambda: sdpa(q[:, :, None], k, v, enable_gqa=True), torch.cuda.Stream()))
        del q, k, v
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
