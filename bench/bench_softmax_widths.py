"""softmax / log_softmax forward over row widths from 8 to 32768 elements
(2^27 elements a case: narrow rows held a few to a warp, wide rows by up to
512 threads, the widest on the rows kernel) against torch, bf16 and f32, on
one GPU in one run. Bandwidth = input and output once / the median time
(bench_elementwise's timing); each output is checked against torch's in f64.
bench_rows.py keeps the issue's two shapes."""
import torch

import baracuda.functional as F
from bench_elementwise import median_ms

WIDTHS = (8, 16, 24, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


def main():
    print(f"{'op':<12} {'dtype':<9} {'shape':<14} {'ours TB/s':>9} {'torch TB/s':>10} {'ratio':>6}")
    for dtype in (torch.bfloat16, torch.float32):
        es = torch.finfo(dtype).bits // 8
        tol = 1e-5 if es == 4 else 8e-3
        for cols in WIDTHS:
            rows = (1 << 27) // cols
            x = torch.randn(rows, cols, device="cuda", dtype=dtype) * 3
            out = torch.empty_like(x)
            nbytes = 2 * x.numel() * es
            for name, ours, theirs in (("softmax", F.softmax, torch.softmax),
                                       ("log_softmax", F.log_softmax, torch.log_softmax)):
                want = theirs(x[:4096].double(), -1)
                got = ours(x[:4096], -1).double()
                ok = (got - want).abs().max().item() <= tol * max(1.0, want.abs().max().item())
                t_ours = median_ms(lambda: ours(x, -1, out=out))
                t_torch = median_ms(lambda: theirs(x, -1))
                print(f"{name:<12} {str(dtype)[6:]:<9} {f'{rows}x{cols}':<14} {nbytes / t_ours / 1e9:9.3f} "
                      f"{nbytes / t_torch / 1e9:10.3f} {t_torch / t_ours:6.2f}{'' if ok else '  MISMATCH'}", flush=True)
            del x, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
