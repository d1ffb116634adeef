#!/usr/bin/env python3
"""Host model of the bespoke attention backward's rounding on the sweep's kSamples[3] (src/attention/plan.cpp).

P and dS are rounded to bf16/f16 before the second products (as the GPU kernels, FlashAttention and cuDNN do) and
the gradients compared with f64 ones under the sweep's tolerance (atol = rtol = 8 x the dtype's, tools/harness.cpp).
Usage: attention_rounding_model.py DRAWS [LO,HI ...]   (lse domains; default 3,6 and 4,7)
"""
import sys

import numpy as np


def round_bf16(x):
    bits = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16  # round to nearest even
    return bits.astype(np.uint32).view(np.float32).astype(np.float64)


def round_f16(x):
    return np.asarray(x, np.float16).astype(np.float64)


HEADS, SEQ_Q, SEQ_K, DIM = 3, 70, 67, 64  # kSamples[3]: an additive [Sq, Skv] mask, no ALiBi
SCALE = 1 / np.sqrt(DIM)


def draw(rng, rnd, lse_lo, lse_hi):
    """Gradients in f64 and with P, dS rounded, and the largest P."""
    u = lambda *shape: rnd(rng.uniform(-2, 2, shape))  # noqa: E731
    q, k, v, grad_out, out = u(HEADS, SEQ_Q, DIM), u(HEADS, SEQ_K, DIM), u(HEADS, SEQ_K, DIM), u(HEADS, SEQ_Q, DIM), \
        u(HEADS, SEQ_Q, DIM)
    mask = u(SEQ_Q, SEQ_K)
    lse = rng.uniform(lse_lo, lse_hi, (HEADS, SEQ_Q)).astype(np.float32).astype(np.float64)
    p = np.exp(SCALE * q @ k.transpose(0, 2, 1) + mask - lse[..., None])
    ds = p * (grad_out @ v.transpose(0, 2, 1) - (grad_out * out).sum(-1)[..., None])
    exact = (SCALE * ds @ k, SCALE * ds.transpose(0, 2, 1) @ q, p.transpose(0, 2, 1) @ grad_out)
    p_r, ds_r = rnd(p), rnd(ds)
    rounded = (rnd(SCALE * ds_r @ k), rnd(SCALE * ds_r.transpose(0, 2, 1) @ q), rnd(p_r.transpose(0, 2, 1) @ grad_out))
    return exact, rounded, p.max()


def main():
    draws = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    domains = [tuple(map(float, a.split(","))) for a in sys.argv[2:]] or [(3, 6), (4, 7)]
    for name, rnd, tol in (("bf16", round_bf16, 1.6e-2 * 8), ("f16", round_f16, 2e-3 * 8)):
        for lo, hi in domains:
            over, worst, largest_p = 0, 0.0, 0.0
            for seed in range(draws):
                exact, rounded, p_max = draw(np.random.default_rng(seed), rnd, lo, hi)
                ratio = max((np.abs(g - r) / (tol + tol * np.abs(r))).max() for g, r in zip(rounded, exact))
                over += ratio > 1
                worst, largest_p = max(worst, ratio), max(largest_p, p_max)
            print(f"{name} lse U[{lo:g}, {hi:g}]: {over}/{draws} draws over the tolerance, worst error/bound "
                  f"{worst:.2f}, largest P {largest_p:.1f}")


if __name__ == "__main__":
    main()
