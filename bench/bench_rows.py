"""Reductions, softmax and normalization against PyTorch on one GPU, side by
side in one run. Bandwidth = minimum bytes (inputs read once, outputs written
once; parameters and per-row statistics counted too) / median time, with the
same back-to-back CUDA-event timing for both libraries (bench_elementwise)."""
import argparse

import torch

import baracuda.functional as F
from bench_elementwise import median_ms

aten = torch.ops.aten


def row(name, dtype, ours, theirs, nbytes, check=None):
    t_ours, t_torch = median_ms(ours), median_ms(theirs)
    ok = "" if check is None else ("" if check() else "  MISMATCH")
    print(f"{name:<34} {str(dtype).replace('torch.', ''):<9} {nbytes / t_ours / 1e9:9.3f} {nbytes / t_torch / 1e9:11.3f}"
          f" {t_torch / t_ours:7.2f}{ok}", flush=True)


def close(a, b, tol):
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def torch_sparsemax(z):
    """Sparsemax along the last dim with sort + cumsum, as written in torch (math in float32 at least)."""
    dtype, z = z.dtype, z.float() if z.dtype in (torch.float16, torch.bfloat16) else z
    s = z.sort(-1, descending=True).values
    cs = s.cumsum(-1)
    k = torch.arange(1, z.shape[-1] + 1, device=z.device, dtype=z.dtype)
    support = (1 + k * s > cs).sum(-1, keepdim=True)
    tau = (cs.gather(-1, support - 1) - 1) / support.to(z.dtype)
    return (z - tau).clamp_min(0).to(dtype)


def torch_sparsemax_backward(g, y):
    s = y > 0
    return torch.where(s, g - (g * s).sum(-1, keepdim=True) / s.sum(-1, keepdim=True), 0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="substring of row names to run")
    args = parser.parse_args()
    want = lambda name: args.only in name  # noqa: E731
    print(f"{'op':<34} {'dtype':<9} {'ours TB/s':>9} {'torch TB/s':>11} {'ratio':>7}")
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
        for rows, cols in ((32768, 4096), (8192, 32768)):
            n = rows * cols
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            g = torch.randn_like(x)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            shape = f"{rows}x{cols}"
            if want("softmax"):
                row(f"softmax {shape}", dtype, lambda: F.softmax(x, -1, out=o1),
                    lambda: aten._softmax.out(x, -1, False, out=o2), 2 * n * es,
                    lambda: close(F.softmax(x, -1), torch.softmax(x, -1), tol))
                row(f"log_softmax {shape}", dtype, lambda: F.log_softmax(x, -1, out=o1),
                    lambda: aten._log_softmax.out(x, -1, False, out=o2), 2 * n * es)
                y = torch.softmax(x, -1)
                row(f"softmax_backward {shape}", dtype, lambda: F.softmax_backward(g, y, -1, out=o1),
                    lambda: aten._softmax_backward_data.out(g, y, -1, dtype, grad_input=o2), 3 * n * es,
                    lambda: close(F.softmax_backward(g, y, -1), aten._softmax_backward_data(g, y, -1, dtype), tol))
                del y
            if want("gumbel_softmax"):
                o3 = torch.empty_like(x)
                for hard in (False, True):
                    # Ours also writes the soft sample (the backward's input): bytes count one output.
                    row(f"gumbel_softmax{' hard' if hard else ''} {shape}", dtype,
                        lambda: F.gumbel_softmax(x, 0.5, hard, seed=1, out=(o1, o3)),
                        lambda: torch.nn.functional.gumbel_softmax(x, 0.5, hard), 2 * n * es)
                y = F.gumbel_softmax(x, 0.5, seed=1)
                xr = x.detach().requires_grad_()
                yr = torch.nn.functional.gumbel_softmax(xr, 0.5)
                row(f"gumbel_softmax_backward {shape}", dtype, lambda: F.gumbel_softmax_backward(g, y, 0.5, out=o1),
                    lambda: torch.autograd.grad(yr, xr, g, retain_graph=True), 3 * n * es)
                del o3, y, xr, yr
            if want("sparsemax"):
                row(f"sparsemax {shape}", dtype, lambda: F.sparsemax(x, -1, out=o1), lambda: torch_sparsemax(x),
                    2 * n * es, lambda: close(F.sparsemax(x, -1), torch_sparsemax(x), tol))
                y = F.sparsemax(x, -1)
                row(f"sparsemax_backward {shape}", dtype, lambda: F.sparsemax_backward(g, y, -1, out=o1),
                    lambda: torch_sparsemax_backward(g, y), 3 * n * es,
                    lambda: close(F.sparsemax_backward(g, y, -1), torch_sparsemax_backward(g, y), tol))
                del y
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            stats = rows * 4 * 2
            if want("layer_norm"):
                row(f"layer_norm {shape}", dtype, lambda: F.native_layer_norm(x, (cols,), w, b),
                    lambda: aten.native_layer_norm(x, (cols,), w, b, 1e-5), 2 * n * es + stats,
                    lambda: close(F.layer_norm(x, (cols,), w, b), torch.nn.functional.layer_norm(x, (cols,), w, b), tol * 4))
                _, mean, rstd = F.native_layer_norm(x, (cols,), w, b)
                _, tmean, trstd = aten.native_layer_norm(x, (cols,), w, b, 1e-5)
                row(f"layer_norm_backward {shape}", dtype, lambda: F.layer_norm_backward(g, x, mean, rstd, w),
                    lambda: aten.native_layer_norm_backward(g, x, (cols,), tmean, trstd, w, b, [True, True, True]),
                    3 * n * es + stats)
            if want("rms_norm"):
                row(f"rms_norm {shape}", dtype, lambda: F.native_rms_norm(x, (cols,), w, eps=1e-6),
                    lambda: torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6), 2 * n * es + stats // 2,
                    lambda: close(F.rms_norm(x, (cols,), w, eps=1e-6), torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6), tol * 4))
                _, rstd = F.native_rms_norm(x, (cols,), w, eps=1e-6)
                xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
                yr = torch.nn.functional.rms_norm(xr, (cols,), wr, eps=1e-6)
                row(f"rms_norm_backward {shape}", dtype, lambda: F.rms_norm_backward(g, x, rstd, w),
                    lambda: torch.autograd.grad(yr, (xr, wr), g, retain_graph=True), 3 * n * es + stats // 2)
                del xr, wr, yr
            del x, g, o1, o2
        if want("cross_entropy"):
            rows, cols = 8192, 128256
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            t = torch.randint(0, cols, (rows,), device="cuda")
            n = rows * cols
            row(f"cross_entropy {rows}x{cols}", dtype, lambda: F.cross_entropy_forward(x, t),
                lambda: torch.nn.functional.cross_entropy(x, t), n * es + rows * 8,
                lambda: close(F.cross_entropy(x, t), torch.nn.functional.cross_entropy(x.float(), t), tol / 2))
            xr = x.detach().requires_grad_()

            def torch_fwd_bwd():
                loss = torch.nn.functional.cross_entropy(xr, t)
                return torch.autograd.grad(loss, xr)

            row(f"cross_entropy fwd+bwd {rows}x{cols}", dtype, lambda: F.cross_entropy_fused(x, t), torch_fwd_bwd,
                2 * n * es + rows * 8,
                lambda: close(F.cross_entropy_fused(x, t)[1], torch_fwd_bwd()[0], 1e-6))
            del x, xr
        if want("ctc_loss") and dtype == torch.float32:
            T, N, C, S = 500, 32, 64, 100
            lp = torch.log_softmax(torch.randn(T, N, C, device="cuda"), -1)
            tg = torch.randint(1, C, (N, S), device="cuda")
            il = torch.full((N,), T, device="cuda", dtype=torch.long)
            tl = torch.randint(S // 2, S + 1, (N,), device="cuda")
            n = T * N * C
            row(f"ctc_loss T{T} N{N} C{C} S{S}", dtype, lambda: F.ctc_loss(lp, tg, il, tl),
                lambda: torch.nn.functional.ctc_loss(lp, tg, il, tl), n * es + N * S * 8,
                lambda: close(F.ctc_loss(lp, tg, il, tl), torch.nn.functional.ctc_loss(lp, tg, il, tl), 1e-4))
            lpr = lp.detach().requires_grad_()
            go = torch.ones((), device="cuda")

            def torch_ctc_fwd_bwd():
                return torch.autograd.grad(torch.nn.functional.ctc_loss(lpr, tg, il, tl), lpr)

            def ours_ctc_fwd_bwd():
                return F.ctc_loss(lp, tg, il, tl), F.ctc_loss_backward(go, lp, tg, il, tl)

            row(f"ctc_loss fwd+bwd T{T} N{N} C{C} S{S}", dtype, ours_ctc_fwd_bwd, torch_ctc_fwd_bwd,
                2 * n * es + N * S * 8,
                lambda: close(ours_ctc_fwd_bwd()[1], torch_ctc_fwd_bwd()[0], 1e-4))
            del lp, lpr
        if want("cumsum"):
            x = torch.randn(1 << 26, device="cuda", dtype=dtype)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            row("cumsum 64M", dtype, lambda: F.cumsum(x, 0, out=o1), lambda: torch.cumsum(x, 0, out=o2),
                2 * x.numel() * es, lambda: close(F.cumsum(x, 0) / 1e3, torch.cumsum(x.double(), 0).to(dtype) / 1e3, tol))
            x = torch.randn(8192, 8192, device="cuda", dtype=dtype)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            row("cumsum 8192x8192 dim=-1", dtype, lambda: F.cumsum(x, -1, out=o1), lambda: torch.cumsum(x, -1, out=o2),
                2 * x.numel() * es)
            del x, o1, o2
        if want("sum") or want("mean"):
            x = torch.randn(8192, 8192, device="cuda", dtype=dtype)
            for dim in (-1, 0):
                o1 = torch.empty(8192, device="cuda", dtype=dtype)
                o2 = torch.empty_like(o1)
                for name in ("sum", "mean"):
                    row(f"{name} dim={dim} 8192x8192", dtype, lambda: getattr(F, name)(x, dim, out=o1),
                        lambda: getattr(torch, name)(x, dim, out=o2), x.numel() * es + 8192 * es,
                        lambda: close(getattr(F, name)(x, dim), getattr(torch, name)(x, dim), tol * 10))
            del x


if __name__ == "__main__":
    main()
