"""layer_norm / rms_norm forward over the row widths models use (512 to 16384),
and the fused residual add + norm against torch's add then norm, on one GPU
in one run. Bandwidth = the output and inputs once (the residual form: input,
residual, output and residual_out) / the median time of torch's benchmark
Timer. bench_rows.py keeps the issue's two shapes."""
import torch
from torch.utils.benchmark import Timer

import baracuda.functional as F


def median_s(fn):
    fn()
    torch.cuda.synchronize()
    return Timer("fn()", globals={"fn": fn}).blocked_autorange(min_run_time=0.3).median


def row(name, rows, cols, dtype, nbytes, ours, theirs):
    o, th = median_s(ours), median_s(theirs)
    print(f"{name:<10} {rows}x{cols:<8} {str(dtype)[6:]:<9} {nbytes / o / 1e12:6.3f} {nbytes / th / 1e12:6.3f}",
          flush=True)


def main():
    print(f"{'op':<10} {'shape':<14} {'dtype':<9} {'ours':>6} {'torch':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        for rows, cols in ((262144, 512), (131072, 1024), (65536, 2048), (32768, 5120), (16384, 8192), (8192, 16384)):
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            nb = 2 * x.numel() * es
            row("layer", rows, cols, dtype, nb, lambda: F.native_layer_norm(x, (cols,), w, b),
                lambda: torch.ops.aten.native_layer_norm(x, (cols,), w, b, 1e-5))
            row("rms", rows, cols, dtype, nb, lambda: F.native_rms_norm(x, (cols,), w, eps=1e-6),
                lambda: torch.nn.functional.rms_norm(x, (cols,), w, eps=1e-6))
            del x
    print("residual (ours fused; torch: x + r, then the norm)")
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        for rows, cols in ((32768, 4096), (32768, 5120), (16384, 8192)):
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            r = torch.randn_like(x)
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            nb = 4 * x.numel() * es

            def torch_add_layer():
                h = x + r
                return torch.ops.aten.native_layer_norm(h, (cols,), w, b, 1e-5), h

            def torch_add_rms():
                h = x + r
                return torch.nn.functional.rms_norm(h, (cols,), w, eps=1e-6), h

            row("add_layer", rows, cols, dtype, nb, lambda: F.add_layer_norm(x, r, w, b), torch_add_layer)
            row("add_rms", rows, cols, dtype, nb, lambda: F.add_rms_norm(x, r, w, eps=1e-6), torch_add_rms)
            del x, r


if __name__ == "__main__":
    main()
