"""Matrix products against PyTorch on one GPU, side by side in one run:
TFLOP/s (2*M*N*K / median time; TB/s of weights for the weight-bound row)
with bench_elementwise's back-to-back CUDA-event timing for both libraries."""
import argparse

import torch

import baracuda
import baracuda.functional as F
from bench_elementwise import graph_ms, median_ms
from bench_rows import close

TF = torch.nn.functional


def row(name, dtype, ours, theirs, work, unit="TFLOP/s", check=None):
    t_ours, t_torch = median_ms(ours, samples=15), median_ms(theirs, samples=15)
    scale = 1e9  # FLOP or bytes per ms -> T per s
    ok = "" if check is None else ("" if check() else "  MISMATCH")
    print(f"{name:<44} {str(dtype).replace('torch.', ''):<9} {work / t_ours / scale:10.1f} {work / t_torch / scale:10.1f}"
          f" {unit:<8} {t_torch / t_ours:6.2f}{ok}", flush=True)


def _torch_takes(fn):
    """Whether this torch build and GPU run a scaled_mm form (row-wise needs sm_90 and CUDA 12.9+)."""
    try:
        fn()
        return True
    except (RuntimeError, ValueError) as e:
        print(f"# torch._scaled_mm refuses: {str(e).splitlines()[0]}")
        return False


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated substrings of the row groups to run")
    args = parser.parse_args()
    want = lambda name: any(part in name for part in args.only.split(","))  # noqa: E731
    torch.backends.cuda.matmul.allow_tf32 = False
    print(f"{'op':<44} {'dtype':<9} {'ours':>10} {'torch':>10} {'unit':<8} {'ratio':>6}")
    bf16 = torch.bfloat16
    if want("mm"):
        for m, n, k in ((8192, 8192, 8192), (4096, 14336, 4096)):
            a = torch.randn(m, k, device="cuda", dtype=bf16)
            b = torch.randn(k, n, device="cuda", dtype=bf16)
            o1, o2 = torch.empty(m, n, device="cuda", dtype=bf16), torch.empty(m, n, device="cuda", dtype=bf16)
            row(f"mm {m}x{n}x{k}", bf16, lambda: F.mm(a, b, out=o1), lambda: torch.mm(a, b, out=o2), 2 * m * n * k,
                check=lambda: close(F.mm(a, b), torch.mm(a, b), 2e-2 * k ** 0.5))
            del a, b, o1, o2
    if want("fp8"):  # torch._scaled_mm's layout: a row-major, b column-major; per-tensor scales
        m = n = k = 8192
        e4m3 = torch.float8_e4m3fn
        a, b = torch.randn(m, k, device="cuda").to(e4m3), torch.randn(n, k, device="cuda").to(e4m3).t()
        sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(2.0, device="cuda")
        a16, b16 = a.to(bf16), b.to(bf16)
        o1, o2 = torch.empty(m, n, device="cuda", dtype=bf16), torch.empty(m, n, device="cuda", dtype=bf16)
        for fast in (False, True):
            ours = lambda: F.scaled_mm(a, b, sa, sb, out_dtype=bf16, use_fast_accum=fast, out=o1)  # noqa: E731
            theirs = lambda: torch._scaled_mm(a, b, sa, sb, out_dtype=bf16, use_fast_accum=fast)  # noqa: E731
            name = f"scaled_mm e4m3 {m}^3 -> bf16{' fast_accum' if fast else ''}"
            row(name, e4m3, ours, theirs, 2 * m * n * k, check=lambda: close(ours(), theirs(), 2e-2 * k ** 0.5))
        row(f"scaled_mm e4m3 {m}^3 vs torch bf16 mm", e4m3, lambda: F.scaled_mm(a, b, sa, sb, out_dtype=bf16, out=o1),
            lambda: torch.mm(a16, b16, out=o2), 2 * m * n * k)
        # The kernel select picks for scaled_mm with these scales (CUTLASS on sm_90 for row-wise and block-wise).
        no_bias, none = torch.empty(0, device="cuda", dtype=bf16), torch.empty(0, device="cuda")
        attrs = {"out_dtype": baracuda._baracuda.dtype_code("bf16"), "use_fast_accum": 0}
        sku = lambda xa, xb: baracuda.plan_info(  # noqa: E731
            "scaled_mm", [F._spec(x) for x in (a, b, xa, xb, no_bias, none)], attrs, device="cuda")["sku"]
        # Row-wise scales (scale_a [M, 1], scale_b [1, N]), bf16 out: torch's row-wise form.
        ra, rb = torch.rand(m, 1, device="cuda") + 0.5, torch.rand(1, n, device="cuda") + 0.5
        print(f"# scaled_mm row-wise runs {sku(ra, rb)}", flush=True)
        ours = lambda: F.scaled_mm(a, b, ra, rb, out_dtype=bf16, out=o1)  # noqa: E731
        theirs = lambda: torch._scaled_mm(a, b, ra, rb, out_dtype=bf16)  # noqa: E731
        if _torch_takes(theirs):
            row(f"scaled_mm e4m3 {m}^3 row-wise -> bf16", e4m3, ours, theirs, 2 * m * n * k,
                check=lambda: close(ours(), theirs(), 2e-2 * k ** 0.5))
        # fp8 out with scale_result (cuBLASLt's D scale), saturated.
        sr = torch.tensor(1 / 64, device="cuda")
        f1 = torch.empty(m, n, device="cuda", dtype=e4m3)
        ours = lambda: F.scaled_mm(a, b, sa, sb, scale_result=sr, out_dtype=e4m3, out=f1)  # noqa: E731
        theirs = lambda: torch._scaled_mm(a, b, sa, sb, scale_result=sr, out_dtype=e4m3)  # noqa: E731
        if _torch_takes(theirs):
            # torch 2.11 leaves scale_result out on the H100 (its outputs are ours / scale_result): the
            # check compares ours with torch's output times scale_result, saturated as ours is.
            top = torch.finfo(e4m3).max
            row(f"scaled_mm e4m3 {m}^3 -> e4m3 (scale_result)", e4m3, ours, theirs, 2 * m * n * k,
                check=lambda: close(ours(), (theirs().float() * sr).clamp(-top, top).to(e4m3), 0.26))
        # Block-wise scales (1 x 128 for a, 128 x 128 for b); against torch where it takes them.
        ba = (torch.rand(k // 128, m, device="cuda") + 0.5).t()  # M-major, as torch wants
        bb = torch.rand(k // 128, n // 128, device="cuda") + 0.5
        print(f"# scaled_mm block-wise runs {sku(ba, bb)}", flush=True)
        ours = lambda: F.scaled_mm(a, b, ba, bb, out_dtype=bf16, out=o1)  # noqa: E731
        theirs = lambda: torch._scaled_mm(a, b, ba, bb, out_dtype=bf16)  # noqa: E731
        if _torch_takes(theirs):
            row(f"scaled_mm e4m3 {m}^3 block-wise -> bf16", e4m3, ours, theirs, 2 * m * n * k,
                check=lambda: close(ours(), theirs(), 2e-2 * k ** 0.5))
        else:
            row(f"scaled_mm e4m3 {m}^3 block-wise vs torch bf16 mm", e4m3, ours, lambda: torch.mm(a16, b16, out=o2),
                2 * m * n * k)
        del a, b, a16, b16, o1, o2, f1
    m, n, k = 4096, 14336, 4096
    x = torch.randn(m, k, device="cuda", dtype=bf16)
    w = torch.randn(n, k, device="cuda", dtype=bf16) * 0.02
    bias = torch.randn(n, device="cuda", dtype=bf16)
    flops = 2 * m * n * k
    if want("linear"):
        o1 = torch.empty(m, n, device="cuda", dtype=bf16)
        row(f"linear {m}x{n}x{k}", bf16, lambda: F.linear(x, w, out=o1), lambda: TF.linear(x, w), flops,
            check=lambda: close(F.linear(x, w), TF.linear(x, w), 2e-2))
        row(f"linear+bias+gelu_tanh {m}x{n}x{k} (fused)", bf16,
            lambda: F.linear(x, w, bias, activation="gelu_tanh", out=o1),
            lambda: TF.gelu(TF.linear(x, w, bias), approximate="tanh"), flops,
            check=lambda: close(F.linear(x, w, bias, activation="gelu_tanh"),
                                TF.gelu(TF.linear(x, w, bias), approximate="tanh"), 3e-2))
        row(f"matmul+bias+gelu {m}x{n}x{k} (torch 3 kernels)", bf16,
            lambda: F.linear(x, w, bias, activation="gelu", out=o1),
            lambda: TF.gelu(torch.matmul(x, w.t()) + bias), flops,
            check=lambda: close(F.linear(x, w, bias, activation="gelu"), TF.gelu(torch.matmul(x, w.t()) + bias), 3e-2))
        row(f"linear+bias+relu {m}x{n}x{k}", bf16, lambda: F.linear(x, w, bias, activation="relu", out=o1),
            lambda: torch.relu(TF.linear(x, w, bias)), flops)
        del o1
    if want("decode"):
        xs = torch.randn(16, k, device="cuda", dtype=bf16)
        o1 = torch.empty(16, n, device="cuda", dtype=bf16)
        row(f"linear 16x{n}x{k} (weights TB/s)", bf16, lambda: F.linear(xs, w, out=o1), lambda: TF.linear(xs, w),
            n * k * 2, unit="TB/s", check=lambda: close(F.linear(xs, w), TF.linear(xs, w), 2e-2))
    if want("backward"):
        g = torch.randn(m, n, device="cuda", dtype=bf16)
        def torch_backward():
            return torch.matmul(g, w), torch.matmul(g.t(), x), g.sum(0)
        row(f"linear_backward {m}x{n}x{k} (dx, dW, db)", bf16, lambda: F.linear_backward(g, x, w),
            torch_backward, 2 * flops)
        del g
    if want("f32"):
        for tf32 in (False, True):
            a = torch.randn(4096, 4096, device="cuda")
            b = torch.randn(4096, 4096, device="cuda")
            o1 = torch.empty(4096, 4096, device="cuda")
            torch.backends.cuda.matmul.allow_tf32 = tf32
            F.set_allow_tf32(tf32)
            row(f"mm 4096^3 {'tf32' if tf32 else 'true f32'}", torch.float32, lambda: F.mm(a, b, out=o1),
                lambda: torch.mm(a, b), 2 * 4096 ** 3)
        F.set_allow_tf32(False)
        torch.backends.cuda.matmul.allow_tf32 = False
    if want("host"):  # host cost of one call (tiny shapes, no synchronisation): what small products pay
        import time
        a, b = torch.randn(8, 8, device="cuda", dtype=bf16), torch.randn(8, 8, device="cuda", dtype=bf16)
        o1 = torch.empty(8, 8, device="cuda", dtype=bf16)
        for name, fn in (("F.mm out=", lambda: F.mm(a, b, out=o1)), ("torch.mm out=", lambda: torch.mm(a, b, out=o1)),
                         ("F.mm", lambda: F.mm(a, b)), ("F.linear", lambda: F.linear(a, b)),
                         ("F.add", lambda: F.add(a, b)), ("torch.add", lambda: torch.add(a, b))):
            for _ in range(200):
                fn()
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(2000):
                fn()
            us = (time.perf_counter() - t) / 2000 * 1e6
            torch.cuda.synchronize()
            print(f"host cost {name:<36} {us:8.1f} us per call", flush=True)
    if want("graph"):  # device time alone: 20 calls captured in a CUDA graph, replayed (also proves capture works)
        xs = torch.randn(16, k, device="cuda", dtype=bf16)
        o1, o2 = torch.empty(16, n, device="cuda", dtype=bf16), torch.empty(16, n, device="cuda", dtype=bf16)
        a3 = torch.randn(64, 512, 128, device="cuda", dtype=bf16)
        b3 = torch.randn(64, 128, 512, device="cuda", dtype=bf16)
        o3, o4 = torch.empty(64, 512, 512, device="cuda", dtype=bf16), torch.empty(64, 512, 512, device="cuda", dtype=bf16)
        for name, ours, theirs, work, unit in (
                (f"graph: linear 16x{n}x{k} (weights TB/s)", lambda: F.linear(xs, w, out=o1),
                 lambda: torch.mm(xs, w.t(), out=o2), n * k * 2, "TB/s"),
                ("graph: bmm 64x512x512x128", lambda: F.bmm(a3, b3, out=o3), lambda: torch.bmm(a3, b3, out=o4),
                 2 * 64 * 512 * 512 * 128, "TFLOP/s")):
            t_ours, t_torch = graph_ms(ours), graph_ms(theirs)
            print(f"{name:<44} {'bfloat16':<9} {work / t_ours / 1e9:10.2f} {work / t_torch / 1e9:10.2f} {unit:<8}"
                  f" {t_torch / t_ours:6.2f}", flush=True)
    if args.only and want("profile"):  # where the host time of one call goes
        import cProfile
        import pstats
        a, b = torch.randn(8, 8, device="cuda", dtype=bf16), torch.randn(8, 8, device="cuda", dtype=bf16)
        cProfile.runctx("for _ in range(2000): F.add(a, b)", globals(), {"F": F, "a": a, "b": b}, "/tmp/add.prof")
        pstats.Stats("/tmp/add.prof").sort_stats("tottime").print_stats(14)
    if want("bmm"):
        a = torch.randn(64, 512, 128, device="cuda", dtype=bf16)
        b = torch.randn(64, 128, 512, device="cuda", dtype=bf16)
        row("bmm 64x512x512x128", bf16, lambda: F.bmm(a, b), lambda: torch.bmm(a, b), 2 * 64 * 512 * 512 * 128)
    if want("grouped"):  # MoE experts: G=8, 2048 rows each, K=4096, N=2048, weights stored [G, N, K]
        g_count, rows, kk, nn = 8, 2048, 4096, 2048
        a = torch.randn(g_count * rows, kk, device="cuda", dtype=bf16)
        wt = (torch.randn(g_count, nn, kk, device="cuda", dtype=bf16) * 0.02).transpose(-1, -2)  # [G, K, N]
        offs = torch.arange(1, g_count + 1, device="cuda", dtype=torch.int32) * rows
        o1 = torch.empty(g_count * rows, nn, device="cuda", dtype=bf16)
        flops = 2 * g_count * rows * nn * kk
        loop = lambda: torch.cat([torch.mm(a[i * rows:(i + 1) * rows], wt[i]) for i in range(g_count)])  # noqa: E731
        sku = lambda *xs: baracuda.plan_info("grouped_mm", [F._spec(x) for x in xs], {}, device="cuda")["sku"]  # noqa: E731
        print(f"grouped_mm runs {sku(a, wt, offs)}", flush=True)

        def forward_rows(name, x, w, o, off, loop):  # ours against torch._grouped_mm and a loop of mm
            if hasattr(torch, "_grouped_mm"):
                row(name + " vs _grouped_mm", bf16, lambda: F.grouped_mm(x, w, off, out=o),
                    lambda: torch._grouped_mm(x, w, off), flops, check=lambda: close(F.grouped_mm(x, w, off), loop(), 5e-2))
            row(name + " vs mm loop", bf16, lambda: F.grouped_mm(x, w, off, out=o), loop, flops)

        forward_rows(f"grouped_mm G{g_count} {g_count * rows}x{nn}x{kk}", a, wt, o1, offs, loop)
        g = torch.randn(g_count * rows, nn, device="cuda", dtype=bf16)
        row(f"grouped_mm_backward G{g_count} (grad_a, grad_b) vs mm loop", bf16,
            lambda: F.grouped_mm_backward(g, a, wt, offs),
            lambda: [(torch.mm(g[i * rows:(i + 1) * rows], wt[i].t()), torch.mm(a[i * rows:(i + 1) * rows].t(),
                                                                                   g[i * rows:(i + 1) * rows]))
                     for i in range(g_count)], 2 * flops)
        del a, wt, o1, g
        # torch's 3D x 2D form (offs over N): a [G, M, K] @ b [K, total N], b stored K-contiguous.
        a3 = torch.randn(g_count, rows, kk, device="cuda", dtype=bf16)
        b2 = (torch.randn(g_count * nn, kk, device="cuda", dtype=bf16) * 0.02).t()  # [K, G * N]
        offs_n = torch.arange(1, g_count + 1, device="cuda", dtype=torch.int32) * nn
        o2 = torch.empty(rows, g_count * nn, device="cuda", dtype=bf16)
        loop2 = lambda: torch.cat([torch.mm(a3[i], b2[:, i * nn:(i + 1) * nn]) for i in range(g_count)], 1)  # noqa: E731
        forward_rows(f"grouped_mm 3Dx2D G{g_count} {rows}x{g_count * nn}x{kk}", a3, b2, o2, offs_n, loop2)
        g2 = torch.randn(rows, g_count * nn, device="cuda", dtype=bf16)
        row(f"grouped_mm_backward 3Dx2D G{g_count} (grad_a, grad_b) vs mm loop", bf16,
            lambda: F.grouped_mm_backward(g2, a3, b2, offs_n),
            lambda: [(torch.mm(g2[:, i * nn:(i + 1) * nn], b2[:, i * nn:(i + 1) * nn].t()),
                      torch.mm(a3[i].t(), g2[:, i * nn:(i + 1) * nn])) for i in range(g_count)], 2 * flops)
        del a3, b2, o2, g2
    if want("list"):  # grouped_gemm: per-group M, N and K (LoRA-like and MoE-like lists) against a loop of torch.mm
        lists = {
            "lora G16 (4096x16x4096, 4096x4096x16)": [(4096, 16, 4096), (4096, 4096, 16)] * 8,
            "experts G8 M 256..2048, N 2048/4096, K 4096": [(256 * (i + 1), 4096, 2048 * (1 + i % 2)) for i in range(8)],
        }
        for name, shapes in lists.items():
            a = [torch.randn(m, k, device="cuda", dtype=bf16) for m, k, _ in shapes]
            b = [torch.randn(k, n, device="cuda", dtype=bf16) * 0.02 for _, k, n in shapes]
            outs = [torch.empty(m, n, device="cuda", dtype=bf16) for m, _, n in shapes]
            flops = sum(2 * m * n * k for m, k, n in shapes)
            loop = lambda: [torch.mm(x, y) for x, y in zip(a, b)]  # noqa: E731
            row(f"grouped_gemm {name} vs mm loop", bf16, lambda: F.grouped_gemm(a, b, out=outs), loop, flops,
                check=lambda: all(close(o, r, 5e-2) for o, r in zip(F.grouped_gemm(a, b), loop())))
            del a, b, outs


if __name__ == "__main__":
    main()
