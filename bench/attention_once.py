"""One bespoke attention forward and backward of a given shape (bf16 [B, H, S, D]), for a profiler to catch its
kernels (tools/ncu_source.sh): no timing, no torch reference.
Usage: attention_once.py [B H S D] [--causal] [--deterministic]   (default 1 32 4096 128; --deterministic runs the
backward's two passes instead of the one pass)"""
import argparse

import torch

import baracuda
import baracuda.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("shape", nargs="*", type=int, default=[1, 32, 4096, 128])
parser.add_argument("--causal", action="store_true")
parser.add_argument("--deterministic", action="store_true")
args = parser.parse_args()
b, h, s, d = args.shape
attrs = dict(scale=0.0, causal=int(args.causal), bottom_right=0, window_left=-1, window_right=-1, softcap=0.0,
             dropout_p=0.0, seed=0, offset=0)
stream = torch.cuda.current_stream().cuda_stream


def run(op, inputs, outputs):
    baracuda._baracuda.run(op, inputs, outputs, attrs, stream, None, "cuda", None)


q, k, v, g = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
no_mask, no_slopes = torch.empty(0, device="cuda", dtype=torch.bfloat16), torch.empty(0, device="cuda")
out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
run("scaled_dot_product_attention", [q, k, v, no_mask, no_slopes], [out, lse])
F.set_deterministic(args.deterministic)
run("scaled_dot_product_attention_backward", [g, q, k, v, out, lse, no_mask, no_slopes],
    [torch.empty_like(q) for _ in range(3)])
torch.cuda.synchronize()
