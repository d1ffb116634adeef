"""Per-call overhead of the Python wrappers on tiny operands, where the
kernel costs nothing and what a caller sees is the binding's own work:
operand classification, shape inference, plan lookup, output allocation.

    PYTHONPATH=build-py/python python3 bench/bench_overhead.py

Prints microseconds per call (best of several timeit repeats). Rows on torch
tensors need torch; CUDA rows need a GPU and measure launch cost too (no
synchronisation inside the loop, one at the end), as torch.add's row does.
"""
import argparse
import timeit

import numpy as np

import baracuda
import baracuda.functional as F


def us_per_call(fn, number, repeat, sync=None):
    """Best of `repeat` timings of `number` calls, in microseconds per call."""
    fn()
    if sync:
        sync()
    best = float("inf")
    for _ in range(repeat):
        start = timeit.default_timer()
        for _ in range(number):
            fn()
        if sync:
            sync()
        best = min(best, timeit.default_timer() - start)
    return best / number * 1e6


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--number", type=int, default=20000, help="calls per timing")
    parser.add_argument("--repeat", type=int, default=7, help="timings per row (the best is kept)")
    args = parser.parse_args()
    timed = lambda fn, sync=None: us_per_call(fn, args.number, args.repeat, sync)  # noqa: E731

    rows = []
    x = np.arange(4, dtype=np.float32)
    y = np.ones(4, dtype=np.float32)
    o = np.empty(4, dtype=np.float32)
    rows.append(("numpy f32[4]: F.add(x, y)", timed(lambda: F.add(x, y))))
    rows.append(("numpy f32[4]: F.add(x, y, out=o)", timed(lambda: F.add(x, y, out=o))))
    rows.append(("numpy f32[4]: F.add(x, 2.0)", timed(lambda: F.add(x, 2.0))))
    rows.append(("numpy f32[4]: F.relu(x)", timed(lambda: F.relu(x))))
    rows.append(("numpy f32[4]: F.sum(x)", timed(lambda: F.sum(x))))
    rows.append(("numpy f32[4]: _C.run('add', ...)", timed(lambda: baracuda.run("add", [x, y], [o]))))
    rows.append(("numpy f32[4]: np.add(x, y) (reference)", timed(lambda: np.add(x, y))))

    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        a, b = torch.arange(4, dtype=torch.float32), torch.ones(4)
        rows.append(("torch cpu f32[4]: F.add(a, b)", timed(lambda: F.add(a, b))))
        rows.append(("torch cpu f32[4]: torch.add(a, b) (reference)", timed(lambda: torch.add(a, b))))
        if torch.cuda.is_available():
            a, b = a.cuda(), b.cuda()
            c = torch.empty_like(a)
            sync = torch.cuda.synchronize
            rows.append(("torch cuda f32[4]: F.add(a, b)", timed(lambda: F.add(a, b), sync)))
            rows.append(("torch cuda f32[4]: F.add(a, b, out=c)", timed(lambda: F.add(a, b, out=c), sync)))
            rows.append(("torch cuda f32[4]: F.add(a, 2.0)", timed(lambda: F.add(a, 2.0), sync)))
            rows.append(("torch cuda f32[4]: torch.add(a, b) (reference)", timed(lambda: torch.add(a, b), sync)))
            rows.append(("torch cuda f32[4]: torch.add(a, b, out=c) (ref.)",
                         timed(lambda: torch.add(a, b, out=c), sync)))
            # Ten operands a call, three outputs allocated (output 0 in the input's layout).
            x = torch.randn(2, 4, 3, 3, device="cuda")
            g, w, bias = torch.randn_like(x), torch.ones(4, device="cuda"), torch.zeros(4, device="cuda")
            rm, rv = torch.zeros(4, device="cuda"), torch.ones(4, device="cuda")
            _, sm, si = F.native_batch_norm(x, w, bias, rm, rv, True, 0.1, 1e-5)
            rows.append(("torch cuda [2,4,3,3]: F.native_batch_norm",
                         timed(lambda: F.native_batch_norm(x, w, bias, rm, rv, True, 0.1, 1e-5), sync)))
            rows.append(("torch cuda [2,4,3,3]: torch.native_batch_norm (ref.)",
                         timed(lambda: torch.native_batch_norm(x, w, bias, rm, rv, True, 0.1, 1e-5), sync)))
            rows.append(("torch cuda [2,4,3,3]: F.batch_norm_backward",
                         timed(lambda: F.batch_norm_backward(g, x, sm, si, w), sync)))
            rows.append(("torch cuda [2,4,3,3]: aten native_batch_norm_backward (ref.)",
                         timed(lambda: torch.ops.aten.native_batch_norm_backward(
                             g, x, w, rm, rv, sm, si, True, 1e-5, [True, True, True]), sync)))
            # A plan with workspace (the split partials), synchronised after every call: the binding's
            # workspace pool keeps its memory across synchronisations (python/src/module.cpp).
            x = torch.randn(64, 1024, device="cuda")
            g, w, bias = torch.randn_like(x), torch.ones(1024, device="cuda"), torch.zeros(1024, device="cuda")
            _, lm, lr = F.native_layer_norm(x, (1024,), w, bias)
            rows.append(("torch cuda [64,1024]: F.layer_norm_backward, sync each",
                         timed(lambda: (F.layer_norm_backward(g, x, lm, lr, w), sync()))))
            rows.append(("torch cuda [64,1024]: aten native_layer_norm_backward, sync each (ref.)",
                         timed(lambda: (torch.ops.aten.native_layer_norm_backward(
                             g, x, (1024,), lm.unsqueeze(1), lr.unsqueeze(1), w, bias, [True, True, True]),
                             sync()))))
            # Losses with a workspace (the per-row terms of the mean) and a class weight left out (a cached
            # empty operand); BARACUDA_WORKSPACE_PER_CALL=1 allocates the workspace per call instead
            # (Note [Workspace kept per stream] in python/src/module.cpp).
            x = torch.randn(64, 512, device="cuda")
            t = torch.randint(0, 512, (64,), device="cuda")
            rows.append(("torch cuda [64,512]: F.multi_margin_loss (mean)", timed(lambda: F.multi_margin_loss(x, t), sync)))
            rows.append(("torch cuda [64,512]: torch multi_margin_loss (ref.)",
                         timed(lambda: torch.nn.functional.multi_margin_loss(x, t), sync)))
            rows.append(("torch cuda [64,512]: F.cross_entropy", timed(lambda: F.cross_entropy(x, t), sync)))
            rows.append(("torch cuda [64,512]: torch cross_entropy (ref.)",
                         timed(lambda: torch.nn.functional.cross_entropy(x, t), sync)))
            rows.append(("torch cuda [64,512]: F.sum(x)", timed(lambda: F.sum(x), sync)))
            rows.append(("torch cuda [64,512]: torch.sum(x) (ref.)", timed(lambda: torch.sum(x), sync)))
            rows.append(("torch cuda [64,512]: F.layer_norm", timed(lambda: F.layer_norm(x, (512,)), sync)))
            rows.append(("torch cuda [64,512]: torch layer_norm (ref.)",
                         timed(lambda: torch.nn.functional.layer_norm(x, (512,)), sync)))
            # A decode step's cache append (bench_rope's kv_append row): six operands, two outputs in place.
            kn = torch.randn(64, 1, 8, 128, device="cuda", dtype=torch.bfloat16)
            kc = torch.zeros(8192, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
            vc = torch.zeros_like(kc)
            table = torch.randperm(8192, device="cuda")[:64 * 64].reshape(64, 64).int()
            lens = torch.randint(0, 1000, (64,), device="cuda", dtype=torch.int32)
            rows.append(("torch cuda bf16 B64: F.kv_append",
                         timed(lambda: F.kv_append(kn, kn, kc, vc, lens, table), sync)))
            stream = torch.cuda.current_stream().cuda_stream  # looked up once: the public getter costs ~8 us
            rows.append(("torch cuda bf16 B64: _C.run('kv_append', ...)",
                         timed(lambda: baracuda.run("kv_append", [kn, kn, table, lens], [kc, vc], stream=stream),
                               sync)))
            ids = table.gather(1, (lens.long() // 16)[:, None]).squeeze(1).long()
            slots = lens.long() % 16

            def torch_append():
                kc[ids, slots] = kn[:, 0]
                vc[ids, slots] = kn[:, 0]
            rows.append(("torch cuda bf16 B64: two index_put (ref.)", timed(torch_append, sync)))
            # A batched product through cuBLASLt; the CLI's host_us (`baracuda run bmm`) is the plan's run
            # alone, so what these rows add to it is the binding's.
            a3 = torch.randn(2, 8, 8, device="cuda", dtype=torch.bfloat16)
            o3 = torch.empty_like(a3)
            rows.append(("torch cuda bf16 [2,8,8]: F.bmm(a, a)", timed(lambda: F.bmm(a3, a3), sync)))
            rows.append(("torch cuda bf16 [2,8,8]: F.bmm(a, a, out=o)", timed(lambda: F.bmm(a3, a3, out=o3), sync)))
            rows.append(("torch cuda bf16 [2,8,8]: torch.bmm(a, a) (ref.)", timed(lambda: torch.bmm(a3, a3), sync)))
            rows.append(("torch cuda bf16 [2,8,8]: torch.bmm(a, a, out=o) (ref.)",
                         timed(lambda: torch.bmm(a3, a3, out=o3), sync)))
            # Empty operands: every path checks them and launches nothing, so these rows are the fixed cost.
            e1, e2, e3 = (torch.empty(0, device="cuda") for _ in range(3))
            m0, m0o = (torch.empty(0, 8, 8, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            rows.append(("torch cuda empty: F.add(e, e, out=e) (no launch)",
                         timed(lambda: F.add(e1, e2, out=e3), sync)))
            rows.append(("torch cuda empty: torch.add(e, e, out=e) (ref.)",
                         timed(lambda: torch.add(e1, e2, out=e3), sync)))
            rows.append(("torch cuda empty: F.bmm(m, m, out=o) (no launch)",
                         timed(lambda: F.bmm(m0, m0, out=m0o), sync)))
            rows.append(("torch cuda empty: torch.bmm(m, m, out=o) (ref.)",
                         timed(lambda: torch.bmm(m0, m0, out=m0o), sync)))
            rows.append(("torch cuda f32[4]: baracuda.run('add', ...)",
                         timed(lambda: baracuda.run("add", [a, b], [c], stream=stream), sync)))
            rows.append(("torch cuda: a bare launch from Python, torch.cuda._sleep(0) (ref.)",
                         timed(lambda: torch.cuda._sleep(0), sync)))
            # What the fast path asks torch for (Note [Functional fast path]), one item a row.
            raw_stream = torch._C._cuda_getCurrentRawStream
            for name, fn in (("a.new_empty(shape)", lambda: a3.new_empty((2, 8, 8))),
                             ("torch.empty(shape, dtype, device)",
                              lambda: torch.empty((2, 8, 8), dtype=torch.bfloat16, device=a3.device)),
                             ("_cuda_getCurrentRawStream(0)", lambda: raw_stream(0)),
                             ("a.data_ptr()", a3.data_ptr), ("a.stride()", a3.stride), ("a.shape", lambda: a3.shape),
                             ("a.dtype", lambda: a3.dtype), ("a.is_neg()", a3.is_neg),
                             ("a.is_cuda", lambda: a3.is_cuda),
                             ("a.get_device()", a3.get_device)):
                rows.append((f"torch cuda, one item: {name}", timed(fn)))
        else:
            print("(no CUDA device: torch CUDA rows skipped)")
    else:
        print("(torch not installed: torch rows skipped)")

    print(f"{'call':<72} {'us/call':>8}")
    for name, us in rows:
        print(f"{name:<72} {us:8.2f}")


if __name__ == "__main__":
    main()
