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


def close_outputs(ours, theirs, tol):
    """Each output within tol of torch's, relative to the largest magnitude of torch's."""
    return all((a.double() - b.double()).abs().max().item() <= tol * b.double().abs().max().item()
               for a, b in zip(ours, theirs))


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


def softmax_rows(x, g, o1, o2, shape, es, tol):
    """softmax, log_softmax (outputs checked against torch's) and softmax_backward over the last dim of x."""
    n, dtype = x.numel(), x.dtype
    row(f"softmax {shape}", dtype, lambda: F.softmax(x, -1, out=o1),
        lambda: aten._softmax.out(x, -1, False, out=o2), 2 * n * es,
        lambda: close(F.softmax(x, -1), torch.softmax(x, -1), tol))
    row(f"log_softmax {shape}", dtype, lambda: F.log_softmax(x, -1, out=o1),
        lambda: aten._log_softmax.out(x, -1, False, out=o2), 2 * n * es,
        lambda: close(F.log_softmax(x, -1), torch.log_softmax(x, -1), tol * 4))
    y = torch.softmax(x, -1)
    row(f"softmax_backward {shape}", dtype, lambda: F.softmax_backward(g, y, -1, out=o1),
        lambda: aten._softmax_backward_data.out(g, y, -1, dtype, grad_input=o2), 3 * n * es,
        lambda: close(F.softmax_backward(g, y, -1), aten._softmax_backward_data(g, y, -1, dtype), tol))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated substrings of row names to run (any matches)")
    args = parser.parse_args()
    want = lambda name: any(part in name for part in args.only.split(","))  # noqa: E731
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
                softmax_rows(x, g, o1, o2, shape, es, tol)
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
                    3 * n * es + stats,
                    lambda: close_outputs(F.layer_norm_backward(g, x, mean, rstd, w),
                                          aten.native_layer_norm_backward(g, x, (cols,), tmean, trstd, w, b,
                                                                          [True, True, True]), tol))
            if want("rms_norm"):
                row(f"rms_norm {shape}", dtype, lambda: F.native_rms_norm(x, (cols,), w, eps=1e-6),
                    lambda: torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6), 2 * n * es + stats // 2,
                    lambda: close(F.rms_norm(x, (cols,), w, eps=1e-6), torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6), tol * 4))
                _, rstd = F.native_rms_norm(x, (cols,), w, eps=1e-6)
                xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
                yr = torch.nn.functional.rms_norm(xr, (cols,), wr, eps=1e-6)
                row(f"rms_norm_backward {shape}", dtype, lambda: F.rms_norm_backward(g, x, rstd, w),
                    lambda: torch.autograd.grad(yr, (xr, wr), g, retain_graph=True), 3 * n * es + stats // 2,
                    lambda: close_outputs(F.rms_norm_backward(g, x, rstd, w),
                                          torch.autograd.grad(yr, (xr, wr), g, retain_graph=True), tol))
                del xr, wr, yr
            del x, g, o1, o2
        if want("group_norm") or want("instance_norm"):
            for (n, c, h, wd), groups in (((32, 512, 32, 32), 32), ((16, 256, 64, 64), 256)):
                name = "group_norm" if groups < c else "instance_norm"
                if not want(name):
                    continue
                x = torch.randn(n, c, h, wd, device="cuda", dtype=dtype)
                g = torch.randn_like(x)
                w = torch.randn(c, device="cuda", dtype=dtype)
                b = torch.randn(c, device="cuda", dtype=dtype)
                numel, hw, stats = x.numel(), h * wd, n * groups * 4 * 2
                shape = f"{n}x{c}x{h}x{wd} G={groups}"
                row(f"{name} {shape}", dtype, lambda: F.native_group_norm(x, w, b, n, c, hw, groups, 1e-5),
                    lambda: aten.native_group_norm(x, w, b, n, c, hw, groups, 1e-5), 2 * numel * es + stats,
                    lambda: close(F.group_norm(x, groups, w, b), torch.nn.functional.group_norm(x, groups, w, b), tol * 4))
                _, mean, rstd = F.native_group_norm(x, w, b, n, c, hw, groups, 1e-5)
                _, tmean, trstd = aten.native_group_norm(x, w, b, n, c, hw, groups, 1e-5)
                row(f"{name}_backward {shape}", dtype, lambda: F.group_norm_backward(g, x, mean, rstd, w),
                    lambda: aten.native_group_norm_backward(g, x, tmean, trstd, w, n, c, hw, groups, [True, True, True]),
                    3 * numel * es + stats,
                    lambda: close(F.group_norm_backward(g, x, mean, rstd, w)[0],
                                  aten.native_group_norm_backward(g, x, tmean, trstd, w, n, c, hw, groups,
                                                                  [True, True, True])[0], tol * 8))
                del x, g
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
        if want("softmax"):
            for rows, cols in ((1024, 131072), (256, 262144)):  # long rows (clusters)
                x = torch.randn(rows, cols, device="cuda", dtype=dtype)
                g = torch.randn_like(x)
                softmax_rows(x, g, torch.empty_like(x), torch.empty_like(x), f"{rows}x{cols}", es, tol)
                del x, g
        rows_losses(dtype, es, tol, want)
        if want("batch_norm"):
            # Training step with running stats; f32 parameters for bf16 (torch's mixed batch norm).
            pdtype = torch.float32
            for shape, fmt in (((32, 256, 56, 56), torch.contiguous_format), ((256, 64, 112, 112), torch.contiguous_format),
                               ((32, 256, 56, 56), torch.channels_last)):
                c = shape[1]
                x = torch.randn(shape, device="cuda", dtype=dtype).to(memory_format=fmt)
                g = torch.randn_like(x)
                w, b = torch.randn(c, device="cuda", dtype=pdtype), torch.randn(c, device="cuda", dtype=pdtype)
                rm, rv = torch.zeros(c, device="cuda", dtype=pdtype), torch.ones(c, device="cuda", dtype=pdtype)
                trm, trv = rm.clone(), rv.clone()
                n = x.numel()
                name = "x".join(map(str, shape)) + (" NHWC" if fmt == torch.channels_last else "")
                row(f"batch_norm {name}", dtype, lambda: F.native_batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5),
                    lambda: torch.nn.functional.batch_norm(x, trm, trv, w, b, True, 0.1, 1e-5), 2 * n * es,
                    lambda: close(F.batch_norm(x, None, None, w, b, True), torch.nn.functional.batch_norm(
                        x, None, None, w, b, True), tol * 4))
                _, sm, si = F.native_batch_norm(x, w, b, None, None, True, 0.1, 1e-5)
                xr, wr, br = (t.detach().requires_grad_() for t in (x, w, b))
                yr = torch.nn.functional.batch_norm(xr, None, None, wr, br, True, 0.1, 1e-5)
                row(f"batch_norm_backward {name}", dtype, lambda: F.batch_norm_backward(g, x, sm, si, w),
                    lambda: torch.autograd.grad(yr, (xr, wr, br), g, retain_graph=True), 3 * n * es,
                    lambda: close(F.batch_norm_backward(g, x, sm, si, w)[0],
                                  torch.autograd.grad(yr, (xr,), g, retain_graph=True)[0], tol * 8))
                del x, g, xr, wr, br, yr
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
            # fp8 log-probabilities (the forward only): torch has no fp8 ctc_loss, so its user widens to f32 first.
            lp8 = lp.to(torch.float8_e4m3fn)
            row(f"ctc_loss fp8_e4m3 T{T} N{N} C{C} S{S}", dtype, lambda: F.ctc_loss(lp8, tg, il, tl),
                lambda: torch.nn.functional.ctc_loss(lp8.float(), tg, il, tl), n + N * S * 8,
                lambda: close(F.ctc_loss(lp8, tg, il, tl).float(), torch.nn.functional.ctc_loss(lp8.float(), tg, il, tl),
                              0.07))
            del lp, lpr, lp8
        if want("cumsum"):
            x = torch.randn(1 << 26, device="cuda", dtype=dtype)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            bits = torch.int16 if es == 2 else torch.int32
            row("cumsum 64M", dtype, lambda: F.cumsum(x, 0, out=o1), lambda: torch.cumsum(x, 0, out=o2),
                2 * x.numel() * es, lambda: close(F.cumsum(x, 0) / 1e3, torch.cumsum(x.double(), 0).to(dtype) / 1e3, tol)
                and torch.equal(F.cumsum(x, 0).view(bits), F.cumsum(x, 0).view(bits)))  # bitwise run to run
            i1, i2 = (torch.empty(x.shape, device="cuda", dtype=torch.long) for _ in range(2))
            row("cummax 64M", dtype, lambda: F.cummax(x, 0, out=(o1, i1)), lambda: torch.cummax(x, 0, out=(o2, i2)),
                x.numel() * (2 * es + 8), lambda: all(torch.equal(a, b) for a, b in zip(F.cummax(x, 0), torch.cummax(x, 0))))
            row("logcumsumexp 64M", dtype, lambda: F.logcumsumexp(x, 0, out=o1),
                lambda: torch.logcumsumexp(x, 0, out=o2), 2 * x.numel() * es,
                lambda: close(F.logcumsumexp(x, 0), torch.logcumsumexp(x.double(), 0).to(dtype), tol))
            del i1, i2
            x = torch.randn((1 << 26) + 3, device="cuda", dtype=dtype)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            row("cumsum 64M+3", dtype, lambda: F.cumsum(x, 0, out=o1), lambda: torch.cumsum(x, 0, out=o2),
                2 * x.numel() * es, lambda: close(F.cumsum(x, 0) / 1e3, torch.cumsum(x.double(), 0).to(dtype) / 1e3, tol))
            x = torch.randn((1 << 26) + 1, device="cuda", dtype=dtype)[1:]  # misaligned start
            m1, m2 = o1[1:x.numel() + 1], o2[1:x.numel() + 1]  # the outputs misaligned too

            def misaligned_ok():  # the misaligned output close to f64's, and the bits of an aligned copy's scan
                F.cumsum(x, 0, out=m1)
                return (close(m1 / 1e3, torch.cumsum(x.double(), 0).to(dtype) / 1e3, tol) and
                        torch.equal(m1.view(bits), F.cumsum(x.clone(), 0).view(bits)))
            row("cumsum 64M offset 1", dtype, lambda: F.cumsum(x, 0, out=m1), lambda: torch.cumsum(x, 0, out=m2),
                2 * x.numel() * es, misaligned_ok)
            x = torch.randn(2 * 1000003, device="cuda", dtype=dtype)[::2]
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            row("cumsum 1000003 step 2", dtype, lambda: F.cumsum(x, 0, out=o1), lambda: torch.cumsum(x, 0, out=o2),
                2 * x.numel() * es, lambda: close(F.cumsum(x, 0) / 1e2, torch.cumsum(x.double(), 0).to(dtype) / 1e2, tol))
            x = torch.randn(8192, 8192, device="cuda", dtype=dtype)
            o1, o2 = torch.empty_like(x), torch.empty_like(x)
            row("cumsum 8192x8192 dim=-1", dtype, lambda: F.cumsum(x, -1, out=o1), lambda: torch.cumsum(x, -1, out=o2),
                2 * x.numel() * es)
            del x, o1, o2
        if want("cumprod_backward") or want("logcumsumexp_backward") or want("cummax_backward"):
            shape = (8192, 8192)
            g = torch.randn(shape, device="cuda", dtype=dtype)
            # Magnitudes near 1: products along 8192 columns stay in range.
            x = (torch.empty(shape, device="cuda").uniform_(-0.01, 0.01).exp() *
                 torch.randint(0, 2, shape, device="cuda").mul(2).sub(1)).to(dtype)
            n = x.numel()
            y = theirs = None

            def torch_grad(fn, x):
                xr = x.detach().requires_grad_()
                y = fn(xr)
                return lambda: torch.autograd.grad(y, xr, g, retain_graph=True)[0]

            def close_to_largest(a, b):
                return torch.allclose(a.float(), b.float(), rtol=tol * 8, atol=tol * 8 * b.float().abs().max().item())

            def f64_grad(fn, x):  # the gradient in f64 from the same inputs
                xr = x.detach().double().requires_grad_()
                return torch.autograd.grad(fn(xr), xr, g.double())[0]

            def error_to_largest(a, ref):
                return ((a.double() - ref).abs().max() / ref.abs().max()).item()

            if want("cumprod_backward"):
                y, theirs = torch.cumprod(x, -1), torch_grad(lambda t: torch.cumprod(t, -1), x)
                ref = f64_grad(lambda t: torch.cumprod(t, -1), x)
                # A long cumprod's gradient from low-precision inputs is ill-conditioned (bf16 rows are off by
                # a large part of their largest value in torch too), so ours passes when it is close to the
                # f64 gradient or no further from it than torch's.
                errors = {}

                def cumprod_grad_ok():
                    errors["ours"] = error_to_largest(F.cumprod_backward(g, x, -1, y), ref)
                    errors["torch"] = error_to_largest(theirs(), ref)
                    return errors["ours"] <= max(tol * 8, 1.1 * errors["torch"])
                row("cumprod_backward 8192x8192 dim=-1", dtype, lambda: F.cumprod_backward(g, x, -1, y), theirs,
                    4 * n * es, cumprod_grad_ok)
                print(f"  cumprod_backward error to the largest f64 value: ours {errors['ours']:.2e}, "
                      f"torch {errors['torch']:.2e}")
                del ref
            if want("logcumsumexp_backward"):
                y, theirs = torch.logcumsumexp(x, -1), torch_grad(lambda t: torch.logcumsumexp(t, -1), x)
                row("logcumsumexp_backward 8192x8192 dim=-1", dtype, lambda: F.logcumsumexp_backward(g, x, y, -1),
                    theirs, 4 * n * es, lambda: close_to_largest(F.logcumsumexp_backward(g, x, y, -1), theirs()))
            if want("cummax_backward"):
                xi = torch.randint(-8, 8, shape, device="cuda").to(dtype)  # ties
                _, idx = torch.cummax(xi, -1)
                theirs = torch_grad(lambda t: torch.cummax(t, -1)[0], xi)
                row("cummax_backward 8192x8192 dim=-1", dtype, lambda: F.cummax_backward(g, xi, idx, -1), theirs,
                    2 * n * es + 8 * n, lambda: close_to_largest(F.cummax_backward(g, xi, idx, -1), theirs()))
                del xi, idx
            del g, x, y, theirs
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


ROW_LOSSES = ("cosine_embedding_loss", "triplet_margin_loss", "multi_margin_loss", "multilabel_margin_loss")


def rows_losses(dtype, es, tol, want):
    """cosine_embedding, triplet_margin, multi_margin, multilabel_margin: forward and forward + backward (ours: the
    loss op then its backward op; torch: autograd)."""
    if not any(want(name) for name in ROW_LOSSES):
        return
    TF = torch.nn.functional
    rows, cols = 32768, 512
    n = rows * cols
    x1, x2, x3 = (torch.randn(rows, cols, device="cuda", dtype=dtype) for _ in range(3))
    y = torch.where(torch.rand(rows, device="cuda") > 0.5, 1.0, -1.0).to(dtype)
    t = torch.randint(0, cols, (rows,), device="cuda")
    labels = torch.full((rows, cols), -1, device="cuda", dtype=torch.long)
    labels[:, :4] = torch.randint(0, cols, (rows, 4), device="cuda")  # 4 listed classes per row
    long_labels = labels.clone()  # 16 listed: past the 8 kept in registers (the mask path)
    long_labels[:, :16] = torch.randint(0, cols, (rows, 16), device="cuda")
    one = torch.ones((), device="cuda", dtype=dtype)
    cases = [
        ("cosine_embedding_loss", (x1, x2, y), 2, 2 * n * es + rows * es, {}, ""),
        ("triplet_margin_loss", (x1, x2, x3), 3, 3 * n * es, {}, ""),
        ("multi_margin_loss", (x1, t), 1, n * es + rows * 8, {}, ""),
        ("multilabel_margin_loss", (x1, labels), 1, n * es + n * 8, {}, ""),
        ("multilabel_margin_loss", (x1, long_labels), 1, n * es + n * 8, {}, " k16"),
    ]
    for name, ops, grads, nbytes, kw, tag in cases:
        if not want(name):
            continue
        ours, theirs = getattr(F, name), getattr(TF, name)
        row(f"{name}{tag} {rows}x{cols}", dtype, lambda: ours(*ops, **kw), lambda: theirs(*ops, **kw), nbytes,
            lambda: close(ours(*ops, **kw), theirs(*[o.double() if o.is_floating_point() else o for o in ops], **kw),
                          tol * 4))
        req = [o.detach().requires_grad_(i < grads) if o.is_floating_point() else o for i, o in enumerate(ops)]

        def torch_fwd_bwd():
            return torch.autograd.grad(theirs(*req, **kw), req[:grads])

        back = getattr(F, name + "_backward")

        def first_grad():
            g = back(one, *ops, **kw)
            return g if grads == 1 else g[0]

        row(f"{name}{tag} fwd+bwd {rows}x{cols}", dtype, lambda: (ours(*ops, **kw), back(one, *ops, **kw)), torch_fwd_bwd,
            2 * nbytes + grads * n * es, lambda: close(first_grad(), torch_fwd_bwd()[0], tol * 4))


if __name__ == "__main__":
    main()
