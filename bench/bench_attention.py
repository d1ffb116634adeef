"""Scaled dot-product attention against PyTorch on one GPU, side by side in
one run: TFLOP/s with FLOPs = 4*B*H*S^2*D (halved when causal; backward
2.5x forward), CUDA-event medians for both libraries. Rows: the default
candidate (cuDNN's fused attention where it serves), the bespoke kernels
forced through the backend preference (forward; backward on tensor cores
at D128 and D64, causal, and padded to 128 at D96), dropout (cuDNN refuses
it: the default is the bespoke kernel) and softcap (cuDNN through a score
modifier by default, and the bespoke kernel forced; a causal softcap's
forward and backward: cuDNN with the causal mask in the modifier) and packed sequences
(varlen_attention: cuDNN's ragged layout by default, and the bespoke kernels
forced; torch runs the same tokens as a dense batch of equal lengths).
`--only bespoke` runs the bespoke rows, `--only refused` only the
dropout and softcap rows, `--only varlen` the packed-sequence rows;
`--rows a,b` then times only the rows whose names hold one of those
substrings (an A/B of one kernel's rows). With
BARACUDA_ATTENTION_HOPPER=0 the bespoke rows time the mma.sync kernels other
archs run (the Hopper ones set aside)."""
import argparse
import os

import torch

import baracuda
import baracuda.functional as F
from bench_elementwise import median_ms

TF = torch.nn.functional


ROWS = ()  # --rows: substrings of the row names to time (empty: every row of the groups run)


def row(name, ours, theirs, flops, check=None):
    if ROWS and not any(part in name for part in ROWS):
        return
    t_ours, t_torch = median_ms(ours, samples=10), median_ms(theirs, samples=10)
    ok = "" if check is None else ("" if check() else "  MISMATCH")
    print(f"{name:<52} {flops / t_ours / 1e9:9.1f} {flops / t_torch / 1e9:9.1f} TFLOP/s {t_torch / t_ours:6.2f}{ok}",
          flush=True)


def close(a, b, tol):
    return (a.double() - b.double()).abs().max().item() < tol


def run_backend(op, inputs, outputs, attrs, backend):
    baracuda._baracuda.run(op, inputs, outputs, attrs, torch.cuda.current_stream().cuda_stream, None, backend, None)
    return outputs


ATTRS = dict(scale=0.0, causal=0, bottom_right=0, window_left=-1, window_right=-1, softcap=0.0, dropout_p=0.0,
             seed=0, offset=0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default="", help="comma-separated substrings of the row groups to run")
    parser.add_argument("--rows", default="", help="comma-separated substrings of the row names to time")
    args = parser.parse_args()
    global ROWS
    ROWS = tuple(part for part in args.rows.split(",") if part)
    want = lambda name: any(part in name for part in args.only.split(","))  # noqa: E731
    print(f"{'op':<52} {'ours':>9} {'torch':>9} {'unit':<7} {'ratio':>6}")
    bf16 = torch.bfloat16
    configs = [("fwd", 4, 32, 32, 4096, 128), ("d64", 4, 32, 32, 4096, 64), ("gqa", 4, 32, 8, 4096, 128)]
    for group, b, hq, hkv, s, d in configs:
        if not want(group) and not want("bwd"):
            continue
        q = torch.randn(b, hq, s, d, device="cuda", dtype=bf16)
        k = torch.randn(b, hkv, s, d, device="cuda", dtype=bf16)
        v = torch.randn(b, hkv, s, d, device="cuda", dtype=bf16)
        gqa = hq != hkv
        for causal in (False, True):
            flops = 4 * b * hq * s * s * d // (2 if causal else 1)
            tag = f"B{b} H{hq}/{hkv} S{s} D{d}{' causal' if causal else ''}"
            if want(group):
                row(f"sdpa fwd {tag}", lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                    lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa), flops,
                    check=lambda: close(F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa),
                                        TF.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa), 3e-2))
            if want("bwd") and group != "d64":
                out, lse = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=gqa, return_lse=True)
                g = torch.randn_like(out)
                qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
                ref = TF.scaled_dot_product_attention(qr, kr, vr, is_causal=causal, enable_gqa=gqa)
                row(f"sdpa bwd {tag}",
                    lambda: F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=causal, enable_gqa=gqa),
                    lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True), flops * 5 // 2,
                    check=lambda: close(F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, is_causal=causal,
                                                                                enable_gqa=gqa)[0],
                                        torch.autograd.grad(ref, (qr,), g, retain_graph=True)[0], 5e-2))
                del ref, qr, kr, vr, g, out, lse
        del q, k, v
    if want("bespoke"):
        # The bespoke kernels serve what cuDNN refuses (dropout, softcap, ALiBi, boolean masks, f32/f64...),
        # forced here through the backend preference: on tensor cores for f16/bf16 at head dims 64 and 128,
        # and padded to 128 at D96.
        # The forward on tensor cores: the warpgroup-MMA kernel on sm_90 (kernels_fwd_sm90.cu; other head dims
        # padded to 64 or 128) where its 128-row blocks reach half the SMs, mma.sync elsewhere.
        m, sl = torch.empty(0, device="cuda", dtype=bf16), torch.empty(0, device="cuda")
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        # BARACUDA_ATTENTION_HOPPER=0 sets the Hopper kernels aside: these rows then time the mma.sync ones.
        hopper = (torch.cuda.get_device_capability() == (9, 0)
                  and os.environ.get("BARACUDA_ATTENTION_HOPPER") != "0")
        for b, h, s, d, causal in ((4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (4, 32, 4096, 64, False),
                                   (4, 32, 4096, 64, True), (2, 16, 2048, 128, True), (1, 8, 1024, 128, False),
                                   (4, 32, 4096, 96, False)):
            attrs = dict(ATTRS, causal=int(causal))
            q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=bf16) for _ in range(3))
            out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
            ours = lambda: run_backend("scaled_dot_product_attention", [q, k, v, m, sl], [out, lse], attrs,  # noqa: E731
                                       "cuda")[0]
            theirs = lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
            fwd_kernel = "mma.sync"
            if hopper and 2 * b * h * -(-s // 128) >= sms:
                fwd_kernel = "wgmma" if d in (64, 128) else "wgmma, padded to 128"
            row(f"bespoke CUDA fwd B{b} H{h} S{s} D{d}{' causal' if causal else ''} ({fwd_kernel})", ours, theirs,
                4 * b * h * s * s * d // (2 if causal else 1), check=lambda: close(ours(), theirs(), 3e-2))
            del q, k, v, out, lse
        # The same forward on [B, S, H, D] tensors viewed as [B, H, S, D] (seq stride H * D): the
        # layout most models keep; TMA's tensor maps take these strides as they are.
        b, h, s, d = 4, 32, 4096, 128
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=bf16).transpose(1, 2) for _ in range(3))
        out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
        ours = lambda: run_backend("scaled_dot_product_attention", [q, k, v, m, sl], [out, lse], ATTRS,  # noqa: E731
                                   "cuda")[0]
        theirs = lambda: TF.scaled_dot_product_attention(q, k, v)  # noqa: E731
        row(f"bespoke CUDA fwd B{b} H{h} S{s} D{d} [B, S, H, D] layout ({'wgmma' if hopper else 'mma.sync'})", ours,
            theirs, 4 * b * h * s * s * d, check=lambda: close(ours(), theirs(), 3e-2))
        del q, k, v, out, lse
        for b, h, s, d, causal in ((4, 32, 4096, 128, False), (4, 32, 4096, 128, True), (4, 32, 4096, 64, False),
                                   (4, 32, 4096, 96, False), (1, 8, 1024, 96, False)):
            attrs = dict(ATTRS, causal=int(causal))
            q, k, v, g = (torch.randn(b, h, s, d, device="cuda", dtype=bf16) for _ in range(4))
            out, lse = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
            run_backend("scaled_dot_product_attention", [q, k, v, m, sl], [out, lse], attrs, "cuda")
            grads = [torch.empty_like(q) for _ in range(3)]
            qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
            ref = TF.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
            ours = lambda: run_backend("scaled_dot_product_attention_backward", [g, q, k, v, out, lse, m, sl],  # noqa: E731
                                       grads, attrs, "cuda")
            theirs = lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True)  # noqa: E731
            # The backward on tensor cores: the warpgroup-MMA kernels on sm_90 (kernels_bwd_sm90.cu: at D128,
            # or padded to it, one pass with dQ summed by bulk f32 reductions, two fixed-order passes when runs
            # must be reproducible, F.set_deterministic), mma.sync elsewhere (both padded to 128 at D96).
            one_pass = hopper and d > 64
            kernel = "wgmma, one pass" if one_pass else "wgmma" if hopper else "mma.sync"
            kernel += "" if d in (64, 128) else ", padded to 128"
            for reproducible in (False, True) if one_pass else (False,):
                F.set_deterministic(reproducible)
                row(f"bespoke CUDA bwd B{b} H{h} S{s} D{d}{' causal' if causal else ''} "
                    f"({'wgmma, two passes' if reproducible else kernel})", ours, theirs,
                    10 * b * h * s * s * d // (2 if causal else 1),
                    check=lambda: all(rel_close(a, r, 2e-2) for a, r in zip(ours(), theirs())))
            F.set_deterministic(False)
            del q, k, v, g, out, lse, grads, qr, kr, vr, ref
    if want("varlen"):
        varlen_rows(8, 2048)
        varlen_rows(7, 1100, bespoke_rows=False)  # a graph bucket (B8, S2048, T8192) above the shape
    if not (want("bespoke") or want("refused")):
        return
    # Cases cuDNN refuses, so the default candidate is the bespoke kernel: dropout (its RNG is not ours)
    # and softcap; torch has no softcap, its column is plain attention.
    b, h, s, d = 4, 32, 4096, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=bf16) for _ in range(3))
    for causal in (False, True):
        row(f"sdpa fwd dropout 0.1 B{b} H{h} S{s} D{d}{' causal' if causal else ''} (bespoke: wgmma on sm_90)",
            lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1, seed=1, is_causal=causal),
            lambda: TF.scaled_dot_product_attention(q, k, v, dropout_p=0.1, is_causal=causal),
            4 * b * h * s * s * d // (2 if causal else 1))
    # A softcap without a band: the default is cuDNN with a score modifier, checked against the bespoke kernel.
    m, sl = torch.empty(0, device="cuda", dtype=bf16), torch.empty(0, device="cuda")
    capped = dict(ATTRS, softcap=30.0)
    out_b, lse_b = torch.empty_like(q), torch.empty(b, h, s, device="cuda")
    bespoke_fwd = lambda: run_backend("scaled_dot_product_attention", [q, k, v, m, sl], [out_b, lse_b],  # noqa: E731
                                      capped, "cuda")[0]
    row(f"sdpa fwd softcap 30 B{b} H{h} S{s} D{d} (default: cuDNN)",
        lambda: F.scaled_dot_product_attention(q, k, v, softcap=30.0),
        lambda: TF.scaled_dot_product_attention(q, k, v), 4 * b * h * s * s * d,
        check=lambda: close(F.scaled_dot_product_attention(q, k, v, softcap=30.0), bespoke_fwd(), 3e-2))
    row(f"sdpa fwd softcap 30 B{b} H{h} S{s} D{d} (bespoke)", bespoke_fwd,
        lambda: TF.scaled_dot_product_attention(q, k, v), 4 * b * h * s * s * d)
    qr, kr, vr = (x.detach().requires_grad_() for x in (q, k, v))
    ref = TF.scaled_dot_product_attention(qr, kr, vr)
    g = torch.randn_like(q)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, softcap=30.0)
    grads = [torch.empty_like(q) for _ in range(3)]
    bespoke_bwd = lambda: run_backend("scaled_dot_product_attention_backward",  # noqa: E731
                                      [g, q, k, v, out, lse, m, sl], grads, capped, "cuda")
    row(f"sdpa bwd softcap 30 B{b} H{h} S{s} D{d} (default: cuDNN)",
        lambda: F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, softcap=30.0),
        lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True), 10 * b * h * s * s * d,
        check=lambda: all(rel_close(a, r, 2e-2) for a, r in
                          zip(F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, softcap=30.0),
                              bespoke_bwd())))
    row(f"sdpa bwd softcap 30 B{b} H{h} S{s} D{d} (bespoke)", bespoke_bwd,
        lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True), 10 * b * h * s * s * d)
    # A causal softcap: cuDNN by default, the causal mask inside its score modifier; checked against the bespoke
    # kernels.
    bespoke_fwd_c = lambda: run_backend("scaled_dot_product_attention", [q, k, v, m, sl], [out_b, lse_b],  # noqa: E731
                                        dict(capped, causal=1), "cuda")[0]
    row(f"sdpa fwd softcap 30 causal B{b} H{h} S{s} D{d} (default: cuDNN)",
        lambda: F.scaled_dot_product_attention(q, k, v, softcap=30.0, is_causal=True),
        lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=True), 2 * b * h * s * s * d,
        check=lambda: close(F.scaled_dot_product_attention(q, k, v, softcap=30.0, is_causal=True), bespoke_fwd_c(),
                            3e-2))
    row(f"sdpa fwd softcap 30 causal B{b} H{h} S{s} D{d} (bespoke)", bespoke_fwd_c,
        lambda: TF.scaled_dot_product_attention(q, k, v, is_causal=True), 2 * b * h * s * s * d)
    ref_c = TF.scaled_dot_product_attention(qr, kr, vr, is_causal=True)
    out_c, lse_c = F.scaled_dot_product_attention(q, k, v, return_lse=True, softcap=30.0, is_causal=True)
    bespoke_bwd_c = lambda: run_backend("scaled_dot_product_attention_backward",  # noqa: E731
                                        [g, q, k, v, out_c, lse_c, m, sl], grads, dict(capped, causal=1), "cuda")
    default_bwd_c = lambda: F.scaled_dot_product_attention_backward(g, q, k, v, out_c, lse_c,  # noqa: E731
                                                                    softcap=30.0, is_causal=True)
    row(f"sdpa bwd softcap 30 causal B{b} H{h} S{s} D{d} (default: cuDNN)", default_bwd_c,
        lambda: torch.autograd.grad(ref_c, (qr, kr, vr), g, retain_graph=True), 5 * b * h * s * s * d,
        check=lambda: all(rel_close(a, r, 2e-2) for a, r in zip(default_bwd_c(), bespoke_bwd_c())))
    row(f"sdpa bwd softcap 30 causal B{b} H{h} S{s} D{d} (bespoke)", bespoke_bwd_c,
        lambda: torch.autograd.grad(ref_c, (qr, kr, vr), g, retain_graph=True), 5 * b * h * s * s * d)
    del ref_c, out_c, lse_c
    extra = dict(dropout_p=0.1, seed=1)
    out, lse = F.scaled_dot_product_attention(q, k, v, return_lse=True, **extra)
    row(f"sdpa bwd dropout 0.1 B{b} H{h} S{s} D{d} (bespoke)",
        lambda: F.scaled_dot_product_attention_backward(g, q, k, v, out, lse, **extra),
        lambda: torch.autograd.grad(ref, (qr, kr, vr), g, retain_graph=True), 10 * b * h * s * s * d)


def varlen_rows(b, s, bespoke_rows=True):
    """B equal-length sequences packed [B * S, H, D]; torch sees them as [B, H, S, D] (same FLOPs)."""
    h, d = 32, 128
    t = b * s
    q, k, v, g = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    cu = torch.arange(0, t + 1, s, device="cuda", dtype=torch.int32)
    sl = torch.empty(0, device="cuda")
    dense = lambda x: x.view(b, s, h, d).transpose(1, 2)  # noqa: E731
    for causal in (False, True):
        flops = 4 * b * h * s * s * d // (2 if causal else 1)
        tag = f"B{b} H{h} S{s} D{d}{' causal' if causal else ''}"
        attrs = dict(ATTRS, causal=int(causal), max_seqlen_q=s, max_seqlen_kv=s)
        out_b, lse_b = torch.empty_like(q), torch.empty(h, t, device="cuda")
        bespoke = lambda: run_backend("varlen_attention", [q, k, v, cu, cu, sl], [out_b, lse_b], attrs,  # noqa: E731
                                      "cuda")[0]
        default = lambda: F.varlen_attention(q, k, v, cu, cu, s, s, causal=causal)  # noqa: E731
        theirs = lambda: TF.scaled_dot_product_attention(dense(q), dense(k), dense(v), is_causal=causal)  # noqa: E731
        row(f"varlen fwd {tag} (default: cuDNN)", default, theirs, flops,
            check=lambda: close(default(), bespoke(), 3e-2) and close(dense(default()), theirs(), 3e-2))
        if bespoke_rows:
            row(f"varlen fwd {tag} (bespoke)", bespoke, theirs, flops)
        out, lse = F.varlen_attention(q, k, v, cu, cu, s, s, causal=causal, return_lse=True)
        grads = [torch.empty_like(q) for _ in range(3)]
        bespoke_bwd = lambda: run_backend("varlen_attention_backward",  # noqa: E731
                                          [g, q, k, v, out, lse, cu, cu, sl], grads, attrs, "cuda")
        default_bwd = lambda: F.varlen_attention_backward(g, q, k, v, out, lse, cu, cu, s, s,  # noqa: E731
                                                          causal=causal)
        qr, kr, vr = (dense(x).detach().requires_grad_() for x in (q, k, v))
        ref = TF.scaled_dot_product_attention(qr, kr, vr, is_causal=causal)
        theirs_bwd = lambda: torch.autograd.grad(ref, (qr, kr, vr), dense(g), retain_graph=True)  # noqa: E731
        row(f"varlen bwd {tag} (default: cuDNN)", default_bwd, theirs_bwd, flops * 5 // 2,
            check=lambda: all(rel_close(a, r, 2e-2) for a, r in zip(default_bwd(), bespoke_bwd())) and
            all(rel_close(dense(a), r, 2e-2) for a, r in zip(default_bwd(), theirs_bwd())))
        if bespoke_rows:
            row(f"varlen bwd {tag} (bespoke)", bespoke_bwd, theirs_bwd, flops * 5 // 2)
        del out, lse, grads, qr, kr, vr, ref


def rel_close(a, b, tol):
    """Largest difference within tol times the largest magnitude of b."""
    return (a.double() - b.double()).abs().max().item() <= tol * b.double().abs().max().item()


if __name__ == "__main__":
    main()
