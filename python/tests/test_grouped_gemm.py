"""grouped_mm (torch._grouped_mm) through baracuda.functional: on numpy arrays
(host backend) against a per-group numpy loop in float64, and on CUDA tensors
against torch._grouped_mm where torch has it (bf16, sm90) and a per-group loop
of matmuls otherwise (skipped without torch + CUDA), forward, backward and autograd."""
import numpy as np
import pytest

import baracuda.functional as F
from torch_parity import DTYPES, close, close_product, cpu_torch, gpu, torch

RNG = np.random.default_rng(0)


def _x(*shape):
    return RNG.uniform(-2, 2, size=shape)


def _loop(a, b, offs, mm):
    """The product of every form as a loop over groups, with `mm` for one group."""
    if a.ndim == 3 and b.ndim == 3:
        return [mm(a[g], b[g]) for g in range(a.shape[0])]
    starts = [0] + [int(o) for o in offs[:-1]]
    if a.ndim == 3:  # columns split: the rest of b's columns are zero
        return [(s, int(e), mm(a[g], b[:, s:int(e)])) for g, (s, e) in enumerate(zip(starts, offs))]
    if b.ndim == 3:  # rows split: the rest of a's rows are zero
        return [(s, int(e), mm(a[s:int(e)], b[g])) for g, (s, e) in enumerate(zip(starts, offs))]
    return [mm(a[:, s:int(e)], b[s:int(e)]) for s, e in zip(starts, offs)]


def _numpy_reference(a, b, offs):
    if a.ndim == 2 and b.ndim == 3:
        out = np.zeros((a.shape[0], b.shape[2]))
        for s, e, part in _loop(a, b, offs, np.matmul):
            out[s:e] = part
        return out
    if a.ndim == 3 and b.ndim == 2:
        out = np.zeros((a.shape[1], b.shape[1]))
        for s, e, part in _loop(a, b, offs, np.matmul):
            out[:, s:e] = part
        return out
    return np.stack(_loop(a, b, offs, np.matmul))


CASES = [((37, 24), (4, 24, 45), [0, 10, 10, 30]), ((3, 5, 7), (3, 7, 9), None), ((6, 29), (29, 10), [5, 5, 20, 27]),
         ((3, 5, 24), (24, 45), [7, 7, 40])]


@pytest.mark.parametrize("a_shape,b_shape,offs", CASES)
def test_grouped_mm_matches_numpy(a_shape, b_shape, offs):
    a, b = _x(*a_shape), _x(*b_shape)
    o = None if offs is None else np.array(offs, dtype=np.int32)
    want = _numpy_reference(a, b, o)
    np.testing.assert_allclose(F.grouped_mm(a, b, o), want, rtol=1e-12, atol=1e-12)
    # torch._grouped_mm's argument names.
    np.testing.assert_allclose(F.grouped_mm(mat_a=a, mat_b=b, offs=o), want, rtol=1e-12, atol=1e-12)
    # b stored transposed (K-contiguous, the usual expert weight layout).
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))
    np.testing.assert_allclose(F.grouped_mm(a, np.swapaxes(bt, -1, -2), o), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("a_shape,b_shape,offs", CASES)
def test_grouped_mm_backward_matches_numpy(a_shape, b_shape, offs):
    a, b = _x(*a_shape), _x(*b_shape)
    o = None if offs is None else np.array(offs, dtype=np.int32)
    g = _x(*_numpy_reference(a, b, o).shape)
    ga, gb = F.grouped_mm_backward(g, a, b, o)
    # Linear in each operand: the gradient is the product's adjoint, checked through <g, f(e_i)>.
    eps_a, eps_b = np.zeros_like(a), np.zeros_like(b)
    for idx in [(0,) * a.ndim, tuple(s - 1 for s in a.shape)]:
        eps_a[...] = 0
        eps_a[idx] = 1
        assert ga[idx] == pytest.approx(np.sum(g * _numpy_reference(eps_a, b, o)), rel=1e-12, abs=1e-12)
    for idx in [(0,) * b.ndim, tuple(s - 1 for s in b.shape)]:
        eps_b[...] = 0
        eps_b[idx] = 1
        assert gb[idx] == pytest.approx(np.sum(g * _numpy_reference(a, eps_b, o)), rel=1e-12, abs=1e-12)


def test_grouped_mm_rejects_bad_offsets():
    a, b = _x(6, 4), _x(2, 4, 3)
    with pytest.raises(Exception, match="non-decreasing"):
        F.grouped_mm(a, b, np.array([4, 2], dtype=np.int32))
    with pytest.raises(Exception, match="past the rows of 'a'"):
        F.grouped_mm(a, b, np.array([4, 7], dtype=np.int32))
    with pytest.raises(ValueError, match="int32"):
        F.grouped_mm(a, b, np.array([4, 6], dtype=np.int64))


# ---------------------------------------------------------------- CUDA vs torch

def _t(shape, dtype):
    return (torch.rand(shape, device="cuda", dtype=torch.float64) * 4 - 2).to(getattr(torch, dtype))


def _torch_reference(a, b, offs):
    """float64 per-group loop of matmuls (rows past the last group: zero)."""
    a, b = a.double(), b.double()
    if a.dim() == 2 and b.dim() == 3:
        out = torch.zeros(a.shape[0], b.shape[2], device=a.device, dtype=torch.float64)
        for s, e, part in _loop(a, b, offs.tolist(), torch.mm):
            out[s:e] = part
        return out
    if a.dim() == 3 and b.dim() == 2:
        out = torch.zeros(a.shape[1], b.shape[1], device=a.device, dtype=torch.float64)
        for s, e, part in _loop(a, b, offs.tolist(), torch.mm):
            out[:, s:e] = part
        return out
    return torch.stack(_loop(a, b, None if offs is None else offs.tolist(), torch.mm))


def _offsets(sizes):
    return torch.tensor(np.cumsum(sizes), device="cuda", dtype=torch.int32)


GPU_CASES = [
    ((8 * 256, 512), (8, 512, 384), [256] * 8),          # MoE-like, tile multiples
    ((1000, 136), (5, 136, 200), [0, 301, 7, 0, 500]),   # empty groups, edges inside tiles, tail rows
    ((3, 130, 72), (3, 72, 66), None),                   # 3D x 3D
    ((96, 700), (700, 80), [128, 0, 333, 200]),          # K split, the weight-gradient form
    ((4, 136, 64), (64, 1000), [0, 301, 7, 500]),        # 3D x 2D: N split, misaligned starts, tail columns
    ((4, 256, 512), (512, 1024), [256] * 4),             # 3D x 2D, tile multiples
]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_k_contiguous", [False, True])
@pytest.mark.parametrize("a_shape,b_shape,sizes", GPU_CASES)
def test_grouped_mm_matches_torch(dtype, b_k_contiguous, a_shape, b_shape, sizes):
    a = _t(a_shape, dtype)
    b = _t(b_shape[:-2] + b_shape[-2:][::-1], dtype).transpose(-1, -2) if b_k_contiguous else _t(b_shape, dtype)
    offs = None if sizes is None else _offsets(sizes)
    want = _torch_reference(a, b, offs)
    got = F.grouped_mm(a, b, offs)
    close(got, want, dtype, scale=8, msg=f"{a_shape} @ {b_shape}")
    g = _t(want.shape, dtype)
    ad, bd = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    _torch_reference(ad, bd, offs).backward(g.double())
    ga, gb = F.grouped_mm_backward(g, a, b, offs)
    close(ga, ad.grad, dtype, scale=8, msg="grad_a")
    close(gb, bd.grad, dtype, scale=16, msg="grad_b")


@gpu
def test_grouped_mm_matches_torch_grouped_mm():
    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._grouped_mm needs torch >= 2.8 on sm90")
    a, b = _t((4 * 512, 1024), "bfloat16"), _t((4, 2048, 1024), "bfloat16").transpose(-1, -2)
    offs = _offsets([512, 256, 768, 512])
    close(F.grouped_mm(a, b, offs), torch._grouped_mm(a, b, offs), "bfloat16", scale=8)


@gpu
@pytest.mark.parametrize("form", ["2d_3d", "3d_2d", "2d_2d", "3d_3d"])
def test_grouped_mm_forms_match_torch_grouped_mm(form):
    """Every form against torch._grouped_mm itself (CUTLASS on both sides on sm90), offsets multiples of 16."""
    if not hasattr(torch, "_grouped_mm") or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("torch._grouped_mm needs torch >= 2.8 on sm90")
    sizes = [256, 0, 512, 128]
    offs = _offsets(sizes)
    shapes = {"2d_3d": ((896, 512), (4, 512, 384)), "3d_2d": ((4, 384, 512), (512, 896)),
              "2d_2d": ((384, 896), (896, 512)), "3d_3d": ((4, 384, 512), (4, 512, 256))}[form]
    a = _t(shapes[0], "bfloat16")
    b = _t(shapes[1][:-2] + shapes[1][-2:][::-1], "bfloat16").transpose(-1, -2)  # K-contiguous, as torch wants
    o = None if form == "3d_3d" else offs
    try:
        want = torch._grouped_mm(a, b, o)
    except RuntimeError as e:  # a form this torch does not have
        pytest.skip(f"torch._grouped_mm: {e}")
    close(F.grouped_mm(a, b, o), want, "bfloat16", scale=8, msg=form)


@gpu
def test_grouped_mm_autograd():
    a = _t((300, 64), "bfloat16").requires_grad_()
    b = _t((3, 64, 48), "bfloat16").requires_grad_()
    offs = _offsets([100, 0, 150])
    out = F.grouped_mm(a, b, offs)
    out.float().square().sum().backward()
    # The gradient autograd hands the backward is 2 * out in bf16 (exact); the
    # reference takes the same one, so that only the backward's error is measured.
    g, ad, bd = 2 * out.detach().double(), a.detach().double(), b.detach().double()
    want_a, want_b = torch.zeros_like(ad), torch.zeros_like(bd)
    starts = [0] + offs.tolist()[:-1]
    for k, (s, e) in enumerate(zip(starts, offs.tolist())):
        want_a[s:e] = g[s:e] @ bd[k].T
        want_b[k] = ad[s:e].T @ g[s:e]
    close(a.grad, want_a, "bfloat16", scale=16)
    close(b.grad, want_b, "bfloat16", scale=16)


@gpu
def test_grouped_mm_is_graph_capturable():
    a, b = _t((512, 128), "bfloat16"), _t((4, 128, 256), "bfloat16")
    offs = _offsets([100, 200, 100, 112])
    out = F.grouped_mm(a, b, offs)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F.grouped_mm(a, b, offs, out=out)
    offs.copy_(_offsets([12, 300, 0, 100]))  # new routing, same graph
    graph.replay()
    torch.cuda.synchronize()
    close(out, _torch_reference(a, b, offs), "bfloat16", scale=8)


# ---------------------------------------------------------------- grouped_gemm: a list of products

LIST_SHAPES = [(5, 7, 3), (0, 4, 6), (131, 33, 70), (9, 0, 11), (64, 72, 136)]  # (M, K, N) a group


def test_grouped_gemm_matches_numpy():
    a = [_x(m, k) for m, k, _ in LIST_SHAPES]
    b = [_x(k, n) for _, k, n in LIST_SHAPES]
    got = F.grouped_gemm(a, b, alpha=-2.0)
    assert len(got) == len(LIST_SHAPES)
    for g, (x, y) in enumerate(zip(a, b)):
        np.testing.assert_allclose(got[g], -2.0 * (x @ y), rtol=1e-12, atol=1e-12, err_msg=f"group {g}")


def test_grouped_gemm_beta_accumulates_into_out():
    a = [_x(m, k) for m, k, _ in LIST_SHAPES]
    b = [_x(k, n) for _, k, n in LIST_SHAPES]
    c = [np.asfortranarray(_x(m, n)) for m, _, n in LIST_SHAPES]  # column-major outputs
    out = [x.copy(order="F") for x in c]
    got = F.grouped_gemm(a, b, alpha=0.5, beta=-3.0, out=out)
    for g in range(len(LIST_SHAPES)):
        assert got[g] is out[g]
        np.testing.assert_allclose(out[g], 0.5 * (a[g] @ b[g]) - 3.0 * c[g], rtol=1e-12, atol=1e-12)


def test_grouped_gemm_backward_matches_numpy():
    a = [_x(m, k) for m, k, _ in LIST_SHAPES]
    b = [_x(k, n) for _, k, n in LIST_SHAPES]
    g = [_x(m, n) for m, _, n in LIST_SHAPES]
    grad_a, grad_b = F.grouped_gemm_backward(g, a, b, alpha=1.5)
    for i in range(len(LIST_SHAPES)):
        np.testing.assert_allclose(grad_a[i], 1.5 * g[i] @ b[i].T, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(grad_b[i], 1.5 * a[i].T @ g[i], rtol=1e-12, atol=1e-12)


def test_grouped_gemm_int8_products_are_int32():
    rng = np.random.default_rng(3)
    a = [rng.integers(-128, 128, size=(m, k), dtype=np.int8) for m, k, _ in LIST_SHAPES]
    b = [rng.integers(-128, 128, size=(k, n), dtype=np.int8) for _, k, n in LIST_SHAPES]
    got = F.grouped_gemm(a, b)
    for g in range(len(LIST_SHAPES)):
        assert got[g].dtype == np.int32
        np.testing.assert_array_equal(got[g], a[g].astype(np.int64) @ b[g].astype(np.int64))


def test_grouped_gemm_rejects_bad_lists():
    with pytest.raises(ValueError, match="lists of one equal, non-zero length"):
        F.grouped_gemm([_x(2, 3)], [_x(3, 4), _x(4, 5)])
    with pytest.raises(ValueError, match="lists of one equal, non-zero length"):
        F.grouped_gemm([], [])
    with pytest.raises(ValueError, match="beta != 0 reads out"):
        F.grouped_gemm([_x(2, 3)], [_x(3, 4)], beta=1.0)
    with pytest.raises(Exception, match=r"'a\[1\]' \[2, 3\] and 'b\[1\]' \[4, 5\] cannot be multiplied"):
        F.grouped_gemm([_x(2, 3), _x(2, 3)], [_x(3, 4), _x(4, 5)])


LIST_GPU_SHAPES = [(1024, 512, 384), (0, 64, 32), (300, 136, 200), (17, 4096, 4096), (2048, 256, 8), (130, 0, 66)]


@gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("b_k_contiguous", [False, True])
def test_grouped_gemm_matches_torch(dtype, b_k_contiguous):
    a = [_t((m, k), dtype) for m, k, _ in LIST_GPU_SHAPES]
    b = [_t((n, k), dtype).T if b_k_contiguous else _t((k, n), dtype) for _, k, n in LIST_GPU_SHAPES]
    got = F.grouped_gemm(a, b)
    g = [_t((m, n), dtype) for m, _, n in LIST_GPU_SHAPES]
    grad_a, grad_b = F.grouped_gemm_backward(g, a, b)
    for i, (x, y) in enumerate(zip(a, b)):
        close_product(got[i], x, y, dtype, scale=8, msg=f"group {i}")
        close_product(grad_a[i], g[i], y.T, dtype, scale=8, msg=f"grad_a {i}")
        close_product(grad_b[i], x.T, g[i], dtype, scale=16, msg=f"grad_b {i}")


@gpu
def test_grouped_gemm_autograd_and_graph_capture():
    shapes = [(64, 32, 48), (1, 32, 5), (100, 16, 8)]
    a = [_t((m, k), "bfloat16").requires_grad_() for m, k, _ in shapes]
    b = [_t((k, n), "bfloat16").requires_grad_() for _, k, n in shapes]
    out = F.grouped_gemm(a, b, alpha=2.0)
    sum(o.float().square().sum() for o in out).backward()
    for i in range(len(shapes)):
        g = 2 * out[i].detach().double()  # what autograd hands the backward (exact in bf16)
        close(a[i].grad, 2.0 * g @ b[i].detach().double().T, "bfloat16", scale=16)
        close(b[i].grad, 2.0 * a[i].detach().double().T @ g, "bfloat16", scale=16)
    x = [t.detach() for t in a]
    y = [t.detach() for t in b]
    outs = F.grouped_gemm(x, y)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        F.grouped_gemm(x, y, out=outs)
    for t in x:
        t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    for i in range(len(shapes)):
        close(outs[i], x[i].double() @ y[i].double(), "bfloat16", scale=8)


@cpu_torch
def test_autograd_functions_on_cpu_tensors():
    """grouped_gemm's and grouped_mm's torch.autograd.Functions on CPU tensors (the host backend) against
    torch's own autograd in float64; an output left out of the loss gets a zero gradient."""
    shapes = [(5, 3, 4), (2, 6, 1), (0, 2, 3), (3, 4, 2)]
    a = [torch.randn(m, k, dtype=torch.float64, requires_grad=True) for m, k, _ in shapes]
    b = [torch.randn(k, n, dtype=torch.float64, requires_grad=True) for _, k, n in shapes]
    out = F.grouped_gemm(a, b, alpha=2.0)
    sum((o * o).sum() for o in out[:3]).backward()  # out[3] unused
    for i, (x, y) in enumerate(zip(a, b)):
        xd, yd = x.detach().clone().requires_grad_(), y.detach().clone().requires_grad_()
        z = 2.0 * xd @ yd
        if i < 3:
            (z * z).sum().backward()
        torch.testing.assert_close(out[i], z.detach(), rtol=1e-12, atol=1e-12)
        want_a = xd.grad if i < 3 else torch.zeros_like(x)
        want_b = yd.grad if i < 3 else torch.zeros_like(y)
        torch.testing.assert_close(x.grad, want_a, rtol=1e-12, atol=1e-12, msg=f"grad_a {i}")
        torch.testing.assert_close(y.grad, want_b, rtol=1e-12, atol=1e-12, msg=f"grad_b {i}")
    a2 = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    b2 = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    offs = torch.tensor([3, 7], dtype=torch.int32)
    (F.grouped_mm(a2, b2, offs) ** 2).sum().backward()
    ad, bd = a2.detach().clone().requires_grad_(), b2.detach().clone().requires_grad_()
    (torch.cat([ad[:3] @ bd[0], ad[3:] @ bd[1]]) ** 2).sum().backward()
    torch.testing.assert_close(a2.grad, ad.grad, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(b2.grad, bd.grad, rtol=1e-12, atol=1e-12)
