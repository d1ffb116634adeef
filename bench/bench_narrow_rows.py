"""The row ops over narrow rows (8 to 512 elements, 2^26 elements a case):
softmax forward and backward, layer_norm / rms_norm forward and backward,
against torch, bf16 and f32, on one GPU in one run. Bandwidth = minimum
bytes (operands once, per-row statistics included) / the median time
(bench_elementwise's timing). bench_rows.py keeps the issue's shapes."""
import torch

import baracuda.functional as F
from bench_elementwise import median_ms

aten = torch.ops.aten
WIDTHS = (8, 16, 32, 64, 128, 256, 512)


def main():
    print(f"{'op':<20} {'dtype':<9} {'shape':<14} {'ours TB/s':>9} {'torch TB/s':>10} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        for cols in WIDTHS:
            rows = (1 << 26) // cols
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            g = torch.randn_like(x)
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            n = x.numel()
            y = torch.softmax(x, -1)
            _, mean, rstd = F.native_layer_norm(x, (cols,), w, b)
            _, tmean, trstd = aten.native_layer_norm(x, (cols,), w, b, 1e-5)
            _, rrstd = F.native_rms_norm(x, (cols,), w, eps=1e-6)
            xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
            yr = torch.nn.functional.rms_norm(xr, (cols,), wr, eps=1e-6)
            cases = (
                ("softmax", lambda: F.softmax(x, -1), lambda: torch.softmax(x, -1), 2 * n * es),
                ("softmax_backward", lambda: F.softmax_backward(g, y, -1),
                 lambda: aten._softmax_backward_data(g, y, -1, dtype), 3 * n * es),
                ("layer_norm", lambda: F.native_layer_norm(x, (cols,), w, b),
                 lambda: aten.native_layer_norm(x, (cols,), w, b, 1e-5), 2 * n * es + rows * 8),
                ("rms_norm", lambda: F.native_rms_norm(x, (cols,), w, eps=1e-6),
                 lambda: torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6), 2 * n * es + rows * 4),
                ("layer_norm_backward", lambda: F.layer_norm_backward(g, x, mean, rstd, w),
                 lambda: aten.native_layer_norm_backward(g, x, (cols,), tmean, trstd, w, b, [True, True, True]),
                 3 * n * es + rows * 8),
                ("rms_norm_backward", lambda: F.rms_norm_backward(g, x, rrstd, w),
                 lambda: torch.autograd.grad(yr, (xr, wr), g, retain_graph=True), 3 * n * es + rows * 4),
            )
            for name, ours, theirs, nbytes in cases:
                t_ours, t_torch = median_ms(ours), median_ms(theirs)
                print(f"{name:<20} {str(dtype)[6:]:<9} {f'{rows}x{cols}':<14} {nbytes / t_ours / 1e9:9.3f} "
                      f"{nbytes / t_torch / 1e9:10.3f} {t_torch / t_ours:6.2f}", flush=True)
            del x, g, y, xr, wr, yr
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
