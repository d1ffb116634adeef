"""The native call path (`_C.call`, what baracuda.functional's wrappers run)
against the Python reference path (`functional._call_python`): same outputs,
same errors, same hand-over for what the native path does not take (Note
[Functional fast path] in python/src/module.cpp). A stand-in torch tensor
type over numpy memory exercises the torch reader on machines without torch.

Run: PYTHONPATH=<build>/python python3 -m pytest python/tests/test_call.py -q
"""
import numpy as np
import pytest

import baracuda
import baracuda.functional as F
from baracuda import _C, _interop
from torch_parity import gpu, torch

rng = np.random.default_rng(7)


def both(op, args, attrs=None, out=None, out_specs=None):
    """Runs op through both paths; returns the two results (or raised exceptions)."""
    results = []
    for call in (F._call, F._call_python):
        try:
            results.append(call(op, args, dict(attrs or {}), out, out_specs))
        except Exception as e:  # noqa: BLE001 (compared below)
            results.append(e)
    return results


def assert_same(fast, slow):
    if isinstance(slow, Exception):
        assert type(fast) is type(slow), (fast, slow)
        assert str(fast) == str(slow)
        return
    assert not isinstance(fast, Exception), fast
    fast, slow = (fast, slow) if isinstance(slow, tuple) else ((fast,), (slow,))
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert type(f) is type(s) and f.dtype == s.dtype and f.shape == s.shape
        np.testing.assert_array_equal(f, s)


def arr(shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


CASES = {
    "broadcast": ("add", lambda: (arr((3, 1, 5)), arr((4, 1))), {}),
    "float scalar": ("add", lambda: (arr((4,)), 2.5), {}),
    "scalar first": ("sub", lambda: (2.5, arr((4,))), {}),
    "int scalar into f16": ("mul", lambda: (arr((4,), np.float16), 3), {}),
    "float scalar into int": ("add", lambda: (np.arange(4, dtype=np.int32), 2.7), {}),
    "int scalar overflows i8": ("add", lambda: (np.arange(4, dtype=np.int8), 300), {}),
    "bool scalar": ("add", lambda: (arr((4,)), True), {}),
    "bool operand is not the reference": ("where", lambda: (arr((4,)) > 0, 1.5, arr((4,), np.float64)), {}),
    "only bools": ("logical_and", lambda: (np.array([True, False]), True), {}),
    "only scalars": ("add", lambda: (2, 3.5), {}),
    "list operand": ("add", lambda: ([1.0, 2.0], np.ones(2)), {}),
    "strided": ("mul", lambda: (arr((6, 8))[:, ::2], arr((8, 6)).T[::2]), {}),
    "negative strides": ("exp", lambda: (arr((7,))[::-1],), {}),
    "zero-d": ("neg", lambda: (np.array(3.0),), {}),
    "empty": ("add", lambda: (arr((0, 3)), arr((3,))), {}),
    "attrs": ("leaky_relu", lambda: (arr((5,)),), {"negative_slope": 0.3}),
    "int attr": ("sum", lambda: (arr((3, 4)),), {"dims": 1, "keepdim": 1}),
    "bool attr": ("sum", lambda: (arr((3, 4)),), {"dims": 1, "keepdim": True}),
    "two outputs": ("mul_backward", lambda: (arr((3, 4)), arr((3, 4)), arr((4,))), {}),
    "byte-swapped": ("exp", lambda: (arr((4,)).astype(">f4"),), {}),
    "bf16 numpy": ("add", lambda: (np.ones(3, _interop.numpy_dtype("bf16")), 1.0), {}),
    "cast to bf16": ("cast", lambda: (arr((3,)),), {"dtype": _C.dtype_code("bf16")}),
    "uint16": ("exp", lambda: (np.ones(3, np.uint16),), {}),
    "uint64": ("add", lambda: (np.ones(3, np.uint64), np.ones(3, np.uint64)), {}),
    "dtype mismatch": ("mul", lambda: (arr((4,)), np.ones(4)), {}),
    "shape mismatch": ("add", lambda: (arr((3, 4)), arr((5,))), {}),
    "unsupported dtype": ("sin", lambda: (np.ones(3, np.int32),), {}),
    "rank 9": ("exp", lambda: (np.ones((1,) * 9),), {}),
    "unknown attribute": ("exp", lambda: (arr((3,)),), {"alpha": 1.0}),
    "attribute not a number": ("leaky_relu", lambda: (arr((3,)),), {"negative_slope": "x"}),
    "wrong operand count": ("add", lambda: (arr((3,)),), {}),
    "not an array": ("exp", lambda: (object(),), {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_as_python_path(name):
    op, make, attrs = CASES[name]
    if "bf16" in name:
        pytest.importorskip("ml_dtypes")
    args = make()
    assert_same(*both(op, args, attrs))
    assert_same(*both(op, args, attrs))  # a cache hit behaves as the miss did


def test_unknown_op():
    with pytest.raises(ValueError, match="unknown op 'no_such_op'"):
        F._call("no_such_op", (np.ones(3),), {})


def test_out_given():
    a, b = arr((3, 4)), arr((4,))
    o1, o2 = np.empty((3, 4), np.float32), np.empty((3, 4), np.float32)
    assert F._call("add", (a, b), {}, o1) is o1
    F._call_python("add", (a, b), {}, o2)
    np.testing.assert_array_equal(o1, o2)
    g1, g2 = np.empty((3, 4), np.float32), np.empty((4,), np.float32)
    got = F._call("mul_backward", (a, a, b), {}, [g1, g2])
    assert got[0] is g1 and got[1] is g2
    want = F._call_python("mul_backward", (a, a, b), {})
    np.testing.assert_array_equal(g1, want[0])
    np.testing.assert_array_equal(g2, want[1])
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    assert_same(*both("exp", (a,), {}, ro))
    assert_same(*both("exp", (a,), {}, np.empty((3, 5), np.float32)))
    assert_same(*both("exp", (a,), {}, 1.0))


def test_out_with_missing_entries():
    """None in `out`: that output is allocated (as when out is not given), the others are used as given."""
    a, b = arr((3, 4)), arr((4,))
    want = F._call_python("mul_backward", (a, a, b), {})
    for call in (F._call, F._call_python):
        for given_first in (True, False):
            g = np.full((3, 4) if given_first else (4,), np.nan, np.float32)
            out = (g, None) if given_first else (None, g)
            got = call("mul_backward", (a, a, b), {}, out)
            assert got[0 if given_first else 1] is g
            for w, h in zip(want, got):
                assert h.dtype == w.dtype and h.shape == w.shape
                np.testing.assert_array_equal(h, w)
    # A given entry of the wrong shape is still checked; a wrong count of entries is an error on both paths.
    fast, slow = both("mul_backward", (a, a, b), {}, (np.empty((3, 5), np.float32), None))
    assert isinstance(fast, Exception) and isinstance(slow, Exception)
    fast, slow = both("mul_backward", (a, a, b), {}, (None,))
    assert isinstance(fast, Exception) and isinstance(slow, Exception)


def test_in_place_and_out_specs():
    x = arr((5,))
    want = np.exp(x.astype(np.float64)).astype(np.float32)
    assert F.exp(x, inplace=True) is x
    np.testing.assert_allclose(x, want, rtol=1e-6)
    g, c = arr((3, 4)), arr((3, 4)) > 0
    for shapes in (((3, 4), (4,)), ((1, 4), (3, 1))):
        specs = tuple(("f32", s) for s in shapes)
        assert_same(*both("where_backward", (g, c), {}, None, specs))


def test_cache_keys_separate_attrs_and_strides():
    x = arr((4, 6))
    a = F.leaky_relu(x, 0.1)
    b = F.leaky_relu(x, 0.2)
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(F.exp(x[:, ::2]), F._call_python("exp", (x[:, ::2],), {}))
    np.testing.assert_array_equal(F.exp(x[:, :3]), F._call_python("exp", (x[:, :3],), {}))
    baracuda.clear_plan_cache()
    np.testing.assert_array_equal(F.leaky_relu(x, 0.2), b)


# ---------------------------------------------------------------- the torch reader, with a stand-in type

class _FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return "torch." + self.name


_FAKE_DTYPES = {name: _FakeDtype(name) for name in ("float32", "float64", "int32", "bool", "uint16")}


class FakeTensor:
    """What the torch reader asks of a tensor, over numpy memory (a CPU tensor)."""
    __module__ = "torch"
    is_cuda, is_cpu = False, True

    def __init__(self, a, conj=False, neg=False):
        self.a, self.conj, self.neg = a, conj, neg

    @property
    def dtype(self):
        return _FAKE_DTYPES[self.a.dtype.name]

    @property
    def shape(self):
        return tuple(self.a.shape)

    def stride(self):
        return tuple(s // self.a.itemsize for s in self.a.strides)

    def data_ptr(self):
        return self.a.ctypes.data

    def get_device(self):
        return -1

    def is_conj(self):
        return self.conj

    def is_neg(self):
        return self.neg

    new_empty_calls = 0

    def new_empty(self, shape):
        """Outputs of the reference's dtype come this way (the hook serves other dtypes)."""
        FakeTensor.new_empty_calls += 1
        return FakeTensor(np.empty(shape, self.a.dtype))


@pytest.fixture
def fake_torch():
    """Hooks that allocate stand-in tensors (baracuda's own call torch)."""
    empty = lambda dtype, shape, like: FakeTensor(np.empty(shape, _interop.numpy_dtype(dtype)))  # noqa: E731
    scalar = lambda value, like: FakeTensor(np.asarray(value, like.a.dtype))  # noqa: E731
    fallback = []

    def python_path(*args):
        fallback.append(args[0])
        return F._call_python(*args)

    _C._set_call_hooks(python_path, _interop.is_torch_type, _interop.torch_dtype_name, empty, scalar,
                       _interop.torch_stream_getter)
    yield fallback
    _C._set_call_hooks(F._call_python, _interop.is_torch_type, _interop.torch_dtype_name, _interop.TORCH.empty,
                       _interop.TORCH.scalar, _interop.torch_stream_getter)


def test_torch_reader(fake_torch):
    x, y = arr((3, 4)), arr((4, 3)).T
    got = F.add(FakeTensor(x), FakeTensor(y))
    assert isinstance(got, FakeTensor) and got.a.dtype == np.float32
    np.testing.assert_array_equal(got.a, x + y)
    got = F.mul(FakeTensor(x), 2.0)
    np.testing.assert_array_equal(got.a, x * 2)
    o = FakeTensor(np.empty((3, 4), np.float32))
    assert F.sub(FakeTensor(x), FakeTensor(y[:, ::-1]), out=o) is o
    np.testing.assert_array_equal(o.a, x - y[:, ::-1])
    got = F.where(FakeTensor(x > 0), FakeTensor(x), 0.0)
    np.testing.assert_array_equal(got.a, np.where(x > 0, x, 0))
    assert fake_torch == []
    calls = FakeTensor.new_empty_calls
    got = F.gt(FakeTensor(x), FakeTensor(y))  # a bool output: through the hook
    assert isinstance(got, FakeTensor) and got.a.dtype == np.bool_ and FakeTensor.new_empty_calls == calls
    np.testing.assert_array_equal(got.a, x > y)
    F.add(FakeTensor(x), FakeTensor(y))  # the reference's dtype: new_empty
    assert FakeTensor.new_empty_calls == calls + 1
    with pytest.raises(baracuda.UnsupportedError, match="torch dtype uint16"):
        F.exp(FakeTensor(np.ones(3, np.uint16)))
    np.testing.assert_array_equal(F.add(FakeTensor(x), x).a, x + x)  # a numpy operand on the same host
    with pytest.raises(ValueError, match="'other' has dtype f64"):
        F.add(FakeTensor(x), FakeTensor(x.astype(np.float64)))


def test_torch_neg_view_takes_python_path(fake_torch):
    """A real tensor with the negative bit (torch's x.conj().imag) goes to the Python path, which resolves it; the
    conjugate bit, which only complex tensors carry, is not asked of real ones."""
    x = arr((3,))
    with pytest.raises(AttributeError, match="resolve_conj"):  # the Python path resolves it (the stand-in cannot)
        F.neg(FakeTensor(x, neg=True), out=FakeTensor(np.empty(3, np.float32)))
    assert fake_torch == ["neg"]
    np.testing.assert_array_equal(F.neg(FakeTensor(x, conj=True)).a, -x)  # a real tensor's conj bit is never set
    assert fake_torch == ["neg"]


def test_run_reads_numpy_and_torch_directly(fake_torch):
    """`run` reads numpy arrays and torch tensors as the fast path does (the stand-in has no __dlpack__, so a
    DLPack import of it would fail); what that reader does not take still goes through DLPack, which words the
    errors; a dtype override always does."""
    x, y = arr((3, 4)), arr((4, 3)).T
    out = np.full((3, 4), np.nan, np.float32)
    baracuda.run("add", [x, y], [out])
    np.testing.assert_array_equal(out, x + y)
    fo = FakeTensor(np.full((4, 3), np.nan, np.float32))
    baracuda.run("mul", [FakeTensor(x.T), y.T], [fo])  # a transposed stand-in beside a numpy operand
    np.testing.assert_array_equal(fo.a, x.T * y.T)
    with pytest.raises(TypeError, match="'input' must be an array"):  # the negative bit: not read directly
        baracuda.run("add", [FakeTensor(x, neg=True), y], [out])
    ro = np.empty((3, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match="'out' must be a writable array"):
        baracuda.run("add", [x, y], [ro])
    with pytest.raises(ValueError, match="operand 'other' has size 5"):
        baracuda.run("add", [x, arr((3, 5))], [out])
    h = np.full((3, 4), 0x3F80, np.uint16)  # bf16 ones, through DLPack with the override
    o16 = np.zeros((3, 4), np.uint16)
    baracuda.run("add", [h, h], [o16], dtypes=["bf16", "bf16", "bf16"])
    np.testing.assert_array_equal(o16, np.full((3, 4), 0x4000, np.uint16))  # bf16 2.0
    assert fake_torch == []


@pytest.mark.parametrize("view", ["plain", "reversed", "transposed", "broadcast", "0-d", "empty"])
def test_run_direct_reader_agrees_with_dlpack(view):
    """`run` on numpy views read directly gives what the DLPack import (forced by a dtype override) gives."""
    base = arr((6, 8))
    x = {"plain": base, "reversed": base[::-1, ::-2], "transposed": base.T,
         "broadcast": np.broadcast_to(base[:1], (6, 8)), "0-d": np.array(0.5, np.float32), "empty": base[:0]}[view]
    direct, imported = (np.full(x.shape, np.nan, np.float32) for _ in range(2))
    baracuda.run("exp", [x], [direct])
    baracuda.run("exp", [x], [imported], dtypes=["f32", "f32"])
    np.testing.assert_array_equal(direct, imported)
    np.testing.assert_allclose(direct, np.exp(x), rtol=1e-6)


@gpu
def test_cuda_scalars_are_cached_per_stream():
    """Python numbers beside CUDA tensors (Note [Cached torch scalars]): right values on every dtype, on a second
    stream, inside a captured graph (made fresh there, never cached) and after it."""
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32):
        x = torch.arange(6, device="cuda").to(dtype)
        for value in (2, 2.5 if dtype.is_floating_point else 5, -3, 2):  # the second 2 is a cache hit
            torch.testing.assert_close(F.add(x, value), x + value, msg=f"{dtype} {value}")
    x = torch.randn(1000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        slow = torch.randn(4096, 4096, device="cuda") @ torch.randn(4096, 4096, device="cuda")  # keeps it busy
        on_side = F.mul(x, 7.25)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(on_side, x * 7.25)
    del slow
    y = torch.empty_like(x)
    graph = torch.cuda.CUDAGraph()
    F.sub(x, 1.0, out=y)  # warm the plan outside the capture
    with torch.cuda.graph(graph):
        F.sub(x, 11.5, out=y)  # a value first seen while capturing
    x.fill_(1.0)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, torch.full_like(x, -10.5))
    assert torch.equal(F.sub(x, 11.5), torch.full_like(x, -10.5))  # after the capture: a fresh, cached scalar


@gpu
def test_binding_workspace_across_syncs_streams_and_graphs():
    """The workspace the binding allocates (its own stream-ordered pool, python/src/module.cpp): a plan with
    workspace (the norm backward's split partials) gives the same bits before and after synchronisations, on a
    second stream, and replayed from a captured graph; the results match torch's."""
    import baracuda._baracuda as B
    x = torch.randn(4096, 2048, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    g = torch.randn_like(x)
    _, mean, rstd = F.native_layer_norm(x, (2048,), w, b)
    specs = [("bf16", [4096, 2048]), ("bf16", [4096, 2048]), ("f32", [4096]), ("f32", [4096]), ("bf16", [2048])]
    assert B.plan_info("layer_norm_backward", specs, {}, None, "cuda")["workspace_size"] > 0
    first = F.layer_norm_backward(g, x, mean, rstd, w)
    xr = x.detach().float().requires_grad_()
    wr, br = w.float().requires_grad_(), b.float().requires_grad_()
    torch.nn.functional.layer_norm(xr, (2048,), wr, br).backward(g.float())
    for ours, ref in zip(first, (xr.grad, wr.grad, br.grad)):
        torch.testing.assert_close(ours.float(), ref, atol=0.05, rtol=0.02)
    for _ in range(3):
        torch.cuda.synchronize()  # the pool keeps its memory across these
        again = F.layer_norm_backward(g, x, mean, rstd, w)
        assert all(torch.equal(a, c) for a, c in zip(first, again))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        on_side = F.layer_norm_backward(g, x, mean, rstd, w)
    torch.cuda.current_stream().wait_stream(side)
    assert all(torch.equal(a, c) for a, c in zip(first, on_side))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = F.layer_norm_backward(g, x, mean, rstd, w)
    for t in captured:
        t.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, c) for a, c in zip(first, captured))


@gpu
def test_kept_workspace_grows_and_serves_many_streams():
    """Note [Workspace kept per stream] (python/src/module.cpp): on one stream, workspace needs that grow and
    shrink (multi_margin_loss's per-row terms: 4 bytes a row) give torch's results; so do more streams than the
    binding keeps buffers for, each running while the others are busy, and weights left out (one cached [0]
    operand per dtype and device, functional._absent) across dtypes."""
    torch.manual_seed(0)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for rows in (100, 300000, 7, 300000, 1000):
            for dtype in (torch.float32, torch.bfloat16):
                x = torch.randn(rows, 33, device="cuda", dtype=dtype)
                t = torch.randint(0, 33, (rows,), device="cuda")
                for reduction in ("mean", "sum"):
                    torch.testing.assert_close(F.multi_margin_loss(x, t, reduction=reduction),
                                               torch.nn.functional.multi_margin_loss(x, t, reduction=reduction),
                                               msg=f"{rows} {dtype} {reduction}")
    torch.cuda.current_stream().wait_stream(side)
    streams = [torch.cuda.Stream() for _ in range(80)]
    xs = [torch.randn(2000 + 37 * i, 65, device="cuda") for i in range(len(streams))]
    ts = [torch.randint(0, 65, (x.shape[0],), device="cuda") for x in xs]
    results = []
    for s, x, t in zip(streams, xs, ts):
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            results.append(F.multi_margin_loss(x, t))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    for i, (r, x, t) in enumerate(zip(results, xs, ts)):
        torch.testing.assert_close(r, torch.nn.functional.multi_margin_loss(x, t), msg=f"stream {i}")
