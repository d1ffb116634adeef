"""Which attention kernel is fastest, shape by shape: the default candidate
(cuDNN's fused attention where it serves) and the bespoke CUDA kernels
forced through the backend preference, both through the same call
(`_baracuda.run`), and torch, timed side by side in one run over batch,
heads, sequence length, head dim and the causal rule, bf16 [B, H, S, D].
The last column is the default's time over the bespoke kernel's: above 1
the bespoke kernel is faster. By default the calls are timed back to back
(bench_elementwise.median_ms): small shapes then time the host's cost of a
call; `--graph` times 20 calls captured in a CUDA graph (device time
alone). `--bwd` adds the backward rows. The data behind select's order
(the default candidate first) shape by shape."""
import argparse

import torch

from bench_attention import ATTRS, run_backend
from bench_elementwise import graph_ms, median_ms

TF = torch.nn.functional

SHAPES = ((1, 16, 1024), (2, 16, 1024), (1, 32, 2048), (2, 16, 2048), (4, 16, 2048), (1, 32, 4096), (2, 32, 4096),
          (4, 32, 4096), (1, 16, 8192))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bwd", action="store_true", help="backward rows too")
    parser.add_argument("--graph", action="store_true", help="device time (CUDA graphs) instead of back-to-back calls")
    parser.add_argument("--dims", default="64,128", help="comma-separated head dims")
    args = parser.parse_args()
    timed = graph_ms if args.graph else median_ms
    bf16 = torch.bfloat16
    empty, no_slopes = torch.empty(0, device="cuda", dtype=bf16), torch.empty(0, device="cuda")
    print(f"{'row':<40} {'default':>9} {'bespoke':>9} {'torch':>9} {'(TFLOP/s)':<9} {'bespoke/default':>15}")
    for d in (int(x) for x in args.dims.split(",")):
        for causal in (False, True):
            for b, h, s in SHAPES:
                flops = 4 * b * h * s * s * d // (2 if causal else 1)
                q, k, v, g = (torch.randn(b, h, s, d, device="cuda", dtype=bf16) for _ in range(4))
                out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
                attrs = dict(ATTRS, causal=int(causal))
                tag = f"B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
                fwd = lambda backend: run_backend("scaled_dot_product_attention", [q, k, v, empty, no_slopes],  # noqa: E731
                                                  [out, lse], attrs, backend)
                times = [timed(fn) for fn in (lambda: fwd(None), lambda: fwd("cuda"),
                                              lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=causal))]
                rates = " ".join(f"{flops / t / 1e9:9.1f}" for t in times)
                print(f"fwd {tag:<36} {rates} {'':<9} {times[0] / times[1]:15.2f}", flush=True)
                if args.bwd:
                    fwd("cuda")
                    grads = [torch.empty_like(q) for _ in range(3)]
                    qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
                    ref = TF.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
                    bwd = lambda backend: run_backend("scaled_dot_product_attention_backward",  # noqa: E731
                                                      [g, q, k, v, out, lse, empty, no_slopes], grads, attrs, backend)
                    # torch's autograd is left out of graphs (its backward would need its forward captured too).
                    theirs = (lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True))
                    times = [timed(lambda: bwd(None)), timed(lambda: bwd("cuda")),
                             median_ms(theirs) if args.graph else timed(theirs)]
                    rates = " ".join(f"{flops * 5 / 2 / t / 1e9:9.1f}" for t in times)
                    print(f"bwd {tag:<36} {rates} {'':<9} {times[0] / times[1]:15.2f}", flush=True)
                    del grads, qr, kr, vr, ref
                del q, k, v, g, out, lse


if __name__ == "__main__":
    main()
