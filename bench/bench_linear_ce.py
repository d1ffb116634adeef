"""Fused linear + cross-entropy (forward and backward) against PyTorch eager
(F.linear + F.cross_entropy + backward, which materialise the [N, V] logits and
their gradient) on one GPU: median time (bench_elementwise's CUDA-event timing)
and peak memory above the inputs (torch.cuda.max_memory_allocated, plus our
plan's workspace, which the binding takes with cudaMallocAsync outside torch's
allocator). The point is speed parity at a fraction of the memory.

    python bench/bench_linear_ce.py            # N=8192, H=4096, V=128256, bf16
    python bench/bench_linear_ce.py --quick    # N=4096
    python bench/bench_linear_ce.py --class-weight   # with cross_entropy class weights [V]
    python bench/bench_linear_ce.py --fp8      # also the fp8 (e4m3) forward against torch._scaled_mm + cross_entropy
"""
import argparse

import torch

import baracuda
import baracuda.functional as F
from bench_elementwise import median_ms


def peak_bytes(fn, extra=0):
    """Peak bytes torch allocates while fn runs, above what was allocated before, plus `extra`."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base + extra
    del out
    return peak


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="N = 4096")
    parser.add_argument("--n", type=int, default=0)
    parser.add_argument("--h", type=int, default=4096)
    parser.add_argument("--v", type=int, default=128256)
    parser.add_argument("--chunk-rows", type=int, default=0, help="0: automatic (256 MiB of logits)")
    parser.add_argument("--dtype-weight-grad", action="store_true",
                        help="sum grad_weight across chunks in bf16 (f32_weight_grad=False: less memory)")
    parser.add_argument("--class-weight", action="store_true", help="class weights [V] (torch's cross_entropy weight)")
    parser.add_argument("--fp8", action="store_true", help="also time the e4m3 forward (no fp8 gradients)")
    args = parser.parse_args()
    N, H, V = args.n or (4096 if args.quick else 8192), args.h, args.v
    f32_sums = not args.dtype_weight_grad
    dtype = torch.bfloat16
    torch.manual_seed(0)
    x = torch.randn(N, H, device="cuda", dtype=dtype)
    w = (torch.randn(V, H, device="cuda") / H ** 0.5).to(dtype)
    t = torch.randint(0, V, (N,), device="cuda")
    t[::17] = -100
    c = (torch.rand(V, device="cuda") + 0.5).to(dtype) if args.class_weight else None

    def ours():
        return F.linear_cross_entropy_fused(x, w, t, chunk_rows=args.chunk_rows, f32_weight_grad=f32_sums,
                                            class_weight=c)

    def theirs():
        xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(xr, wr), t, weight=c)
        gx, gw = torch.autograd.grad(loss, (xr, wr))
        return loss, gx, gw

    specs = [F._spec(a) for a in (x, w, t, F._no_bias(x), F._no_bias(x) if c is None else c)]
    info = baracuda.plan_info("linear_cross_entropy_fused", specs, {"chunk_rows": float(args.chunk_rows), "f32_weight_grad": float(f32_sums)},
                                        device="cuda")
    a, b = ours(), theirs()
    loss_err = abs(a[0].float() - b[0].float()).item()
    gw_err = ((a[2].float() - b[2].float()).norm() / b[2].float().norm()).item()
    gx_err = ((a[1].float() - b[1].float()).norm() / b[1].float().norm()).item()
    del a, b
    t_ours, t_torch = median_ms(ours, warmup=2, samples=5, reps=2), median_ms(theirs, warmup=2, samples=5, reps=2)
    m_ours, m_torch = peak_bytes(ours, info["workspace_size"]), peak_bytes(theirs)
    flops = 3 * 2 * N * H * V
    print(f"linear_cross_entropy fwd+bwd bf16 N={N} H={H} V={V} f32_weight_grad={int(f32_sums)} "
          f"class_weight={int(c is not None)}  ({info['sku']}, workspace "
          f"{info['workspace_size'] / 2**20:.0f} MiB)")
    print(f"{'':<8} {'ms':>9} {'TFLOP/s':>9} {'peak GiB':>9}")
    print(f"{'ours':<8} {t_ours:9.3f} {flops / t_ours / 1e9:9.1f} {m_ours / 2**30:9.2f}")
    print(f"{'torch':<8} {t_torch:9.3f} {flops / t_torch / 1e9:9.1f} {m_torch / 2**30:9.2f}")
    print(f"time ratio torch/ours {t_torch / t_ours:.2f}, memory ratio ours/torch {m_ours / m_torch:.2f}; "
          f"|loss diff| {loss_err:.2e}, rel grad_input diff {gx_err:.2e}, rel grad_weight diff {gw_err:.2e}")
    if args.fp8:
        fp8_forward(x, w, t, c, args.chunk_rows)


def fp8_forward(x, w, t, c, chunk_rows):
    """The e4m3 forward (f32 logits, unit scales) against what a torch user writes for it: torch._scaled_mm
    to f32 logits, then cross_entropy (the whole [N, V] logits in memory)."""
    x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)
    c8 = None if c is None else c.to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    N, H = x.shape
    V = w.shape[0]

    def ours():
        return F.linear_cross_entropy(x8, w8, t, chunk_rows=chunk_rows, class_weight=c8)

    def theirs():
        logits = torch._scaled_mm(x8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.float32)
        return torch.nn.functional.cross_entropy(logits, t, weight=None if c8 is None else c8.float())

    specs = [F._spec(a) for a in (x8, w8, t, F._no_bias(x8), F._no_bias(x8) if c8 is None else c8)]
    info = baracuda.plan_info("linear_cross_entropy", specs, {"chunk_rows": float(chunk_rows)}, device="cuda")
    a, b = ours().float().item(), theirs().item()
    t_ours, t_torch = median_ms(ours, warmup=2, samples=5, reps=2), median_ms(theirs, warmup=2, samples=5, reps=2)
    m_ours, m_torch = peak_bytes(ours, info["workspace_size"]), peak_bytes(theirs)
    flops = 2 * N * H * V
    print(f"linear_cross_entropy fwd fp8_e4m3 N={N} H={H} V={V} ({info['sku']}, workspace "
          f"{info['workspace_size'] / 2**20:.0f} MiB; loss e4m3: ours {a:.4f}, torch f32 {b:.4f})")
    print(f"{'':<8} {'ms':>9} {'TFLOP/s':>9} {'peak GiB':>9}")
    print(f"{'ours':<8} {t_ours:9.3f} {flops / t_ours / 1e9:9.1f} {m_ours / 2**30:9.2f}")
    print(f"{'torch':<8} {t_torch:9.3f} {flops / t_torch / 1e9:9.1f} {m_torch / 2**30:9.2f}")
    print(f"time ratio torch/ours {t_torch / t_ours:.2f}")


if __name__ == "__main__":
    main()
