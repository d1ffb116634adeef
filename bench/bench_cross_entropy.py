"""The fused cross_entropy forward + backward against PyTorch at the
vocabulary sizes of common models, side by side in one run (bench_rows'
timing: minimum bytes = logits read once + gradient written once + targets,
over the median time). torch: cross_entropy then autograd.grad.

    python bench/bench_cross_entropy.py [--elements N] [--dtypes bf16,f32]
"""
import argparse

import torch

import baracuda.functional as F
from bench_elementwise import median_ms

# Llama 2, GPT-2 (odd: rows off the 16-byte grid), Llama 3, Qwen 2, Gemma.
VOCABS = (32000, 50257, 128256, 151936, 256000)
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=8192 * 128256, help="logits a case (rows = elements // vocab)")
    parser.add_argument("--dtypes", default="bf16,f32")
    parser.add_argument("--vocabs", default=",".join(map(str, VOCABS)))
    args = parser.parse_args()
    print(f"{'cross_entropy fwd+bwd':<30} {'dtype':<6} {'ours TB/s':>9} {'torch TB/s':>10} {'ratio':>6}")
    for name in args.dtypes.split(","):
        dtype = DTYPES[name]
        es = torch.finfo(dtype).bits // 8
        for cols in map(int, args.vocabs.split(",")):
            rows = args.elements // cols
            x = torch.randn(rows, cols, device="cuda", dtype=dtype)
            t = torch.randint(0, cols, (rows,), device="cuda")
            t[::7] = -100  # ignored rows, as in padded batches
            xr = x.detach().requires_grad_()

            def torch_fwd_bwd():
                return torch.autograd.grad(torch.nn.functional.cross_entropy(xr, t), xr)[0]

            loss, grad = F.cross_entropy_fused(x, t)
            # The first rows' gradient against float64 (torch's own bf16 gradient rounds its log-softmax
            # first), within the dtype's rounding of the largest |gradient|; the loss (rounded to the dtype)
            # against torch in f32.
            xs, ts, kept = x[:64].double(), t[:64], (t != -100).sum().double()
            want = (torch.softmax(xs, 1) - torch.nn.functional.one_hot(ts.clamp(min=0), cols)) * (ts != -100)[:, None] / kept
            tol = 1e-5 if es == 4 else 8e-3
            ok = (grad[:64].double() - want).abs().max().item() <= tol * want.abs().max().item() and \
                torch.allclose(loss.float(), torch.nn.functional.cross_entropy(x.float(), t), rtol=tol, atol=1e-4)
            t_ours, t_torch = median_ms(lambda: F.cross_entropy_fused(x, t)), median_ms(torch_fwd_bwd)
            nbytes = 2 * rows * cols * es + rows * 8
            print(f"{f'{rows}x{cols}':<30} {name:<6} {nbytes / t_ours / 1e9:9.3f} {nbytes / t_torch / 1e9:10.3f}"
                  f" {t_torch / t_ours:6.2f}{'' if ok else '  MISMATCH'}", flush=True)
            del x, xr, t, loss, grad
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
