// RoPE and the KV-cache append: the generic sweep (every dtype x attribute
// set x shape x layout against the host reference; kv_append on contiguous
// caches), each scaling mode against a formula written out here, backward
// undoing forward, broadcast positions, in place, strided views; kv_append on
// paged caches touching only its slots; bad input named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <map>
#include <numeric>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

class RopeSweep : public testing::TestWithParam<std::string> {};
TEST_P(RopeSweep, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(RopeSweep, BespokeCudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
INSTANTIATE_TEST_SUITE_P(Ops, RopeSweep, testing::Values("rope", "rope_backward", "kv_append"), param_name);

// ---------------------------------------------------------------- buffers

/// A host tensor: logical row-major values in a buffer laid out by `strides`
/// (row-major when not given); bytes outside the view hold NaN (or 0x5A).
struct Buffer {
  DType dtype = DType::f64;
  Shape shape, strides;
  int64_t base = 0, span = 0;  // element offset of index 0; elements held
  Memory memory;

  std::vector<int64_t> offsets() const {
    std::vector<int64_t> out;
    std::vector<int64_t> idx(shape.size(), 0);
    for (int64_t i = 0; i < numel(shape); ++i) {
      int64_t off = base;
      for (size_t d = 0; d < shape.size(); ++d) off += idx[d] * strides[d];
      out.push_back(off);
      for (size_t d = shape.size(); d-- > 0;)
        if (++idx[d] < shape[d]) break;
        else idx[d] = 0;
    }
    return out;
  }
  std::vector<double> values() const {
    std::vector<double> v;
    for (int64_t off : offsets()) v.push_back(load_double(memory.data(), dtype, off));
    return v;
  }
  void set(const std::vector<double>& v) {
    const auto offs = offsets();
    for (size_t i = 0; i < offs.size(); ++i) store_double(memory.data(), dtype, offs[i], v[i]);
  }
  TensorView view(void* data) const {
    return *TensorView::strided(static_cast<char*>(data) + base * int64_t(dtype_size(dtype)), dtype, shape, strides);
  }
};

Buffer buffer(DType dtype, Shape shape, const std::vector<double>& values = {}, Shape strides = {}) {
  Buffer b;
  b.dtype = dtype;
  b.shape = shape;
  if (strides.empty()) {
    strides.assign(shape.size(), 0);
    int64_t step = 1;
    for (size_t d = shape.size(); d-- > 0;) strides[d] = step, step *= std::max<int64_t>(shape[d], 1);
  }
  b.strides = strides;
  int64_t lo = 0, hi = 0;
  for (size_t d = 0; d < shape.size(); ++d)
    if (shape[d] > 0) (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
  b.base = -lo;
  b.span = hi - lo + 1;
  b.memory = Memory::host(size_t(b.span) * dtype_size(dtype));
  if (is_floating(dtype))
    for (int64_t e = 0; e < b.span; ++e) store_double(b.memory.data(), dtype, e, NAN);
  else
    std::fill_n(static_cast<unsigned char*>(b.memory.data()), b.span * dtype_size(dtype), 0x5A);
  if (!values.empty()) b.set(values);
  return b;
}

std::vector<double> uniform(int64_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<double> integers(int64_t n, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = double(u(rng));
  return v;
}

/// Runs `op` on `backend` with the buffers (the same Buffer as input and
/// output runs in place) and copies every buffer back. Outputs are given.
Status run(Backend backend, const std::string& op, const std::vector<Buffer*>& ins, const std::vector<Buffer*>& outs,
           const Attrs& attrs = {}) {
  const bool device = backend != Backend::host_reference;
  std::map<Buffer*, Memory> on_device;
  auto data = [&](Buffer* b) -> Result<void*> {
    if (!device) return b->memory.data();
#ifdef BARACUDA_HAS_CUDA
    auto it = on_device.find(b);
    if (it == on_device.end()) {
      auto m = Memory::device(b->memory.bytes());
      if (!m) return m.status();
      cudaMemcpy(m->data(), b->memory.data(), b->memory.bytes(), cudaMemcpyHostToDevice);
      it = on_device.emplace(b, std::move(*m)).first;
    }
    return it->second.data();
#else
    return unsupported("no CUDA");
#endif
  };
  OpDesc desc{op, {}, {}, attrs};
  std::vector<TensorView> in_views, out_views;
  for (Buffer* b : ins) {
    auto p = data(b);
    if (!p) return p.status();
    in_views.push_back(b->view(*p));
    desc.inputs.push_back({b->dtype, b->shape});
  }
  for (Buffer* b : outs) {
    auto p = data(b);
    if (!p) return p.status();
    out_views.push_back(b->view(*p));
    desc.outputs.push_back({b->dtype, b->shape});
  }
  PlanPreference pref;
  pref.backend = backend;
  const Stream stream = device ? Stream::cuda() : Stream::host();
  auto plan = select(stream, desc, pref);
  if (!plan) return plan.status();
  const OpArgs args{in_views, out_views};
  BARACUDA_TRY((*plan)->can_implement(args));
  BARACUDA_TRY((*plan)->run(stream, {}, args));
#ifdef BARACUDA_HAS_CUDA
  if (device) {
    if (cudaDeviceSynchronize() != cudaSuccess) return internal_error("kernel failed");
    for (auto& [b, m] : on_device) cudaMemcpy(b->memory.data(), m.data(), b->memory.bytes(), cudaMemcpyDeviceToHost);
  }
#endif
  return Status::ok();
}

/// Largest |a - b| (NaN anywhere: infinity).
double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    const double d = std::abs(a[i] - b[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

// ---------------------------------------------------------------- RoPE, written out

struct RopeCase {
  int64_t rotary_dim = 0;
  bool interleaved = false;
  int scaling = 0;
  double base = 10000, factor = 1, low = 1, high = 4, original = 8192;
  Attrs attrs() const {
    return Attrs{{"rotary_dim", double(rotary_dim)}, {"interleaved", interleaved ? 1.0 : 0.0},
                 {"scaling", double(scaling)},       {"base", base},
                 {"factor", factor},                 {"low_freq_factor", low},
                 {"high_freq_factor", high},         {"original_max_position", original}};
  }
};

/// The angle of pair i at `pos` as the model papers define it (long double).
long double expected_angle(const RopeCase& c, int64_t rd, int64_t i, int64_t pos) {
  const long double pi = 3.14159265358979323846264338327950288L;
  long double base = c.base;
  if (c.scaling == 2) base *= std::pow((long double)c.factor, (long double)rd / (long double)(rd - 2));
  long double freq = 1.0L / std::pow(base, (long double)(2 * i) / (long double)rd);
  long double p = (long double)pos;
  if (c.scaling == 1) p /= c.factor;  // linear: positions interpolated
  if (c.scaling == 3) {
    const long double wavelength = 2 * pi / freq;
    if (wavelength > c.original / c.low) {
      freq /= c.factor;
    } else if (wavelength >= c.original / c.high) {
      const long double smooth = (c.original / wavelength - c.low) / (c.high - c.low);
      freq = (1 - smooth) * freq / c.factor + smooth * freq;
    }
  }
  return p * freq;
}

/// x [B, S, H, D] rotated at positions [B, S] (sign -1: backward), as complex products.
std::vector<double> expected_rope(const RopeCase& c, const Shape& x_shape, const std::vector<double>& x,
                                  const std::vector<double>& pos, double sign = 1) {
  const int64_t B = x_shape[0], S = x_shape[1], H = x_shape[2], D = x_shape[3];
  const int64_t rd = c.rotary_dim ? c.rotary_dim : D;
  std::vector<double> y = x;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t row = ((b * S + s) * H + h) * D;
        for (int64_t i = 0; i < rd / 2; ++i) {
          const int64_t d0 = c.interleaved ? 2 * i : i, d1 = c.interleaved ? 2 * i + 1 : i + rd / 2;
          const long double theta = sign * expected_angle(c, rd, i, int64_t(pos[b * S + s]));
          const std::complex<long double> z(x[row + d0], x[row + d1]);
          const std::complex<long double> r = z * std::polar(1.0L, theta);
          y[row + d0] = double(r.real());
          y[row + d1] = double(r.imag());
        }
      }
  return y;
}

/// f32 and f64 on the GPU (angles in f64, Note [RoPE precision]); f64 on the host.
std::vector<DType> rope_dtypes(Backend backend) {
  if (backend == Backend::host_reference) return {DType::f64};
  return {DType::f64, DType::f32};
}
double rope_tolerance(DType dtype) { return dtype == DType::f64 ? 1e-11 : 1e-5; }

TEST(RopeFormula, EachScalingModeMatchesAnIndependentFormula) {
  const Shape shape{2, 5, 3, 10};  // odd seq, head dim not a multiple of 8
  const auto x = uniform(numel(shape), -2, 2, 1);
  const auto pos = integers(10, 0, 3000, 2);
  std::vector<RopeCase> cases;
  for (int scaling = 0; scaling < 4; ++scaling)
    for (bool interleaved : {false, true}) {
      RopeCase c;
      c.rotary_dim = scaling % 2 ? 8 : 0;  // rotary_dim < D: dims 8, 9 pass through
      c.interleaved = interleaved;
      c.scaling = scaling;
      c.factor = scaling ? 4 : 1;
      c.base = scaling == 2 ? 500 : 10000;
      if (scaling == 3) c.original = 100, c.low = 1, c.high = 4;  // wavelengths 6.3 | 63 | 628, 6283: all three bands
      cases.push_back(c);
    }
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : rope_dtypes(backend))
      for (const RopeCase& c : cases) {
        Buffer xb = buffer(dtype, shape, x), pb = buffer(DType::i64, {2, 5}, pos), out = buffer(dtype, shape);
        ASSERT_TRUE(run(backend, "rope", {&xb, &pb}, {&out}, c.attrs()).is_ok());
        const auto want = expected_rope(c, shape, xb.values(), pos);
        EXPECT_LE(max_diff(out.values(), want), rope_tolerance(dtype))
            << backend_name(backend) << " " << dtype_name(dtype) << " scaling " << c.scaling << " interleaved "
            << c.interleaved;
        Buffer grad = buffer(dtype, shape);
        ASSERT_TRUE(run(backend, "rope_backward", {&xb, &pb}, {&grad}, c.attrs()).is_ok());
        EXPECT_LE(max_diff(grad.values(), expected_rope(c, shape, xb.values(), pos, -1)), rope_tolerance(dtype))
            << backend_name(backend) << " backward scaling " << c.scaling;
      }
}

TEST(RopeFormula, Llama3KeepsHighFrequenciesAndSlowsLowOnes) {
  // D = 64, original 64: wavelengths 2 pi .. 2 pi * 10000^(62/64); pair 0 is
  // below 64 / 4 (unchanged), the last pair above 64 / 1 (linear by factor).
  const Shape shape{1, 3, 1, 64};
  const auto x = uniform(64 * 3, -1, 1, 3);
  const std::vector<double> pos{0, 17, 1234};
  RopeCase none, linear, llama;
  linear.scaling = 1, linear.factor = 8;
  llama.scaling = 3, llama.factor = 8, llama.original = 64;
  auto rope_of = [&](const RopeCase& c) {
    Buffer xb = buffer(DType::f64, shape, x), pb = buffer(DType::i32, {3}, pos), out = buffer(DType::f64, shape);
    EXPECT_TRUE(run(Backend::host_reference, "rope", {&xb, &pb}, {&out}, c.attrs()).is_ok());
    return out.values();
  };
  const auto a = rope_of(none), b = rope_of(linear), c = rope_of(llama);
  for (int64_t s = 0; s < 3; ++s) {
    const int64_t row = s * 64;
    EXPECT_NEAR(c[row + 0], a[row + 0], 1e-12);    // pair 0: high frequency
    EXPECT_NEAR(c[row + 31], b[row + 31], 1e-12);  // pair 31: low frequency
    EXPECT_NEAR(c[row + 63], b[row + 63], 1e-12);
  }
}

TEST(Rope, BackwardUndoesForward) {
  const Shape shape{3, 7, 2, 24};
  const auto x = uniform(numel(shape), -2, 2, 4);
  const auto pos = integers(21, 0, 100000, 5);
  RopeCase c;
  c.rotary_dim = 16, c.interleaved = true, c.scaling = 3, c.factor = 8;
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : rope_dtypes(backend)) {
      Buffer xb = buffer(dtype, shape, x), pb = buffer(DType::i64, {3, 7}, pos);
      Buffer y = buffer(dtype, shape), back = buffer(dtype, shape);
      ASSERT_TRUE(run(backend, "rope", {&xb, &pb}, {&y}, c.attrs()).is_ok());
      ASSERT_TRUE(run(backend, "rope_backward", {&y, &pb}, {&back}, c.attrs()).is_ok());
      EXPECT_LE(max_diff(back.values(), xb.values()), 2 * rope_tolerance(dtype)) << backend_name(backend);
      EXPECT_GT(max_diff(y.values(), xb.values()), 0.1);  // it did rotate
    }
}

TEST(Rope, PositionsBroadcastOverTheBatch) {
  const Shape shape{3, 5, 2, 16};
  const auto x = uniform(numel(shape), -2, 2, 6);
  const auto pos = integers(5, 0, 5000, 7);
  std::vector<double> repeated;
  for (int b = 0; b < 3; ++b) repeated.insert(repeated.end(), pos.begin(), pos.end());
  for (Backend backend : host_and_cuda_backends()) {
    Buffer xb = buffer(DType::f32, shape, x), shared = buffer(DType::i32, {5}, pos);
    Buffer per_batch = buffer(DType::i32, {3, 5}, repeated);
    Buffer a = buffer(DType::f32, shape), b = buffer(DType::f32, shape);
    ASSERT_TRUE(run(backend, "rope", {&xb, &shared}, {&a}).is_ok());
    ASSERT_TRUE(run(backend, "rope", {&xb, &per_batch}, {&b}).is_ok());
    EXPECT_EQ(max_diff(a.values(), b.values()), 0) << backend_name(backend);
  }
}

TEST(Rope, InPlaceMatchesOutOfPlace) {
  const Shape shape{2, 9, 3, 20};
  const auto x = uniform(numel(shape), -2, 2, 8);
  const auto pos = integers(18, 0, 9000, 9);
  RopeCase c;
  c.rotary_dim = 12;
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : {DType::f32, DType::bf16}) {
      Buffer xb = buffer(dtype, shape, x), pb = buffer(DType::i64, {2, 9}, pos), out = buffer(dtype, shape);
      ASSERT_TRUE(run(backend, "rope", {&xb, &pb}, {&out}, c.attrs()).is_ok());
      Buffer inplace = buffer(dtype, shape, x);
      ASSERT_TRUE(run(backend, "rope", {&inplace, &pb}, {&inplace}, c.attrs()).is_ok());
      EXPECT_EQ(max_diff(inplace.values(), out.values()), 0) << backend_name(backend) << " " << dtype_name(dtype);
      const auto got = inplace.values(), orig = xb.values();
      for (int64_t r = 0; r < numel(shape) / 20; ++r)  // the pass-through dims are untouched
        for (int d = 12; d < 20; ++d) ASSERT_EQ(got[r * 20 + d], orig[r * 20 + d]);
    }
}

TEST(Rope, StridedViewsMatchContiguous) {
  // x: a [B, H, S, D] buffer seen as [B, S, H, D] with seq walking backwards
  // and a gap between elements of a head; out: a different strided layout.
  const int64_t B = 2, S = 7, H = 3, D = 16;
  const Shape shape{B, S, H, D};
  const auto x = uniform(numel(shape), -2, 2, 10);
  const auto pos = integers(B * S, 0, 3000, 11);
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : {DType::f32, DType::f16, DType::f64})
      for (bool interleaved : {false, true}) {
        RopeCase c;
        c.interleaved = interleaved;
        c.rotary_dim = 8;
        Buffer xb = buffer(dtype, shape, x), pb = buffer(DType::i64, {B, S}, pos), want = buffer(dtype, shape);
        ASSERT_TRUE(run(backend, "rope", {&xb, &pb}, {&want}, c.attrs()).is_ok());
        Buffer xs = buffer(dtype, shape, x, {H * S * D * 2, -D * 2, S * D * 2, 2});
        Buffer ps = buffer(DType::i64, {B, S}, pos, {1, B});  // column-major positions
        Buffer out = buffer(dtype, shape, {}, {1, B * H * D, B, B * H});
        ASSERT_TRUE(run(backend, "rope", {&xs, &ps}, {&out}, c.attrs()).is_ok());
        EXPECT_LE(max_diff(out.values(), want.values()), dtype == DType::f16 ? 1e-3 : 1e-6)
            << backend_name(backend) << " " << dtype_name(dtype) << " interleaved " << interleaved;
      }
}

TEST(Rope, Rank3AndI32PositionsMatchRank4AndI64) {
  const int64_t S = 5, H = 4, D = 32;
  const auto x = uniform(S * H * D, -2, 2, 12);
  const auto pos = integers(S, 0, 60000, 13);
  for (Backend backend : host_and_cuda_backends()) {
    Buffer x3 = buffer(DType::bf16, {S, H, D}, x), p32 = buffer(DType::i32, {S}, pos), a = buffer(DType::bf16, {S, H, D});
    Buffer x4 = buffer(DType::bf16, {1, S, H, D}, x), p64 = buffer(DType::i64, {1, S}, pos);
    Buffer b = buffer(DType::bf16, {1, S, H, D});
    ASSERT_TRUE(run(backend, "rope", {&x3, &p32}, {&a}).is_ok());
    ASSERT_TRUE(run(backend, "rope", {&x4, &p64}, {&b}).is_ok());
    EXPECT_EQ(max_diff(a.values(), b.values()), 0) << backend_name(backend);
  }
}

TEST(Rope, LargePositionsKeepF32Accuracy) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Positions near 10^6: an f32 product pos * inv_freq would be off by up to 0.06 rad.
  const Shape shape{1, 16, 2, 128};
  const auto x = uniform(numel(shape), -2, 2, 14);
  const auto pos = integers(16, 900000, 1000000, 15);
  RopeCase c;
  Buffer xb = buffer(DType::f32, shape, x), pb = buffer(DType::i64, {1, 16}, pos), out = buffer(DType::f32, shape);
  ASSERT_TRUE(run(Backend::bespoke_cuda, "rope", {&xb, &pb}, {&out}, c.attrs()).is_ok());
  EXPECT_LE(max_diff(out.values(), expected_rope(c, shape, xb.values(), pos)), 2e-6);
}

TEST(RopeErrors, BadInputIsNamed) {
  auto error = [](std::vector<TensorSpec> in, const Attrs& attrs, std::vector<TensorSpec> out = {}) {
    OpDesc d{"rope", std::move(in), std::move(out), attrs};
    auto r = find_op("rope")->infer(d);
    return r ? std::string("ok") : r.status().message();
  };
  const TensorSpec x{DType::f32, {2, 5, 3, 10}}, pos{DType::i64, {2, 5}};
  EXPECT_EQ(error({x, pos}, {}), "ok");
  EXPECT_NE(error({x, pos}, {{"rotary_dim", 5}}).find("'rotary_dim' must be even, got 5"), std::string::npos);
  EXPECT_NE(error({x, pos}, {{"rotary_dim", 12}}).find("'rotary_dim' 12 exceeds the head dim 10"), std::string::npos);
  EXPECT_NE(error({{DType::f32, {2, 5, 3, 9}}, pos}, {}).find("'rotary_dim' must be even, got 9 (the head dim"),
            std::string::npos);
  EXPECT_NE(error({x, {DType::i64, {2, 6}}}, {}).find("'positions' shape [2, 6], expected [5] or [2, 5]"),
            std::string::npos);
  EXPECT_NE(error({{DType::f32, {5, 3, 10}}, pos}, {}).find("'positions' shape [2, 5], expected [5] for"),
            std::string::npos);
  EXPECT_NE(error({x, {DType::f32, {2, 5}}}, {}).find("'positions' dtype f32, expected i32 or i64"), std::string::npos);
  EXPECT_NE(error({{DType::i32, {2, 5, 3, 10}}, pos}, {}).find("dtype i32 is not supported"), std::string::npos);
  EXPECT_NE(error({{DType::f32, {5, 10}}, pos}, {}).find("'x' must be [batch, seq, heads, dim]"), std::string::npos);
  EXPECT_NE(error({x, pos}, {}, {{DType::f16, x.shape}}).find("output 'out' must be f32[2, 5, 3, 10], got f16"),
            std::string::npos);
  EXPECT_NE(error({x, pos}, {{"scaling", 5}}).find("'scaling' must be"), std::string::npos);
  EXPECT_NE(error({x, pos}, {{"scaling", 2}, {"rotary_dim", 2}}).find("NTK scaling needs rotary_dim > 2"),
            std::string::npos);
  EXPECT_NE(error({x, pos}, {{"scaling", 3}, {"low_freq_factor", 4}}).find("low_freq_factor < high_freq_factor"),
            std::string::npos);
  EXPECT_NE(error({x, pos}, {{"base", -1}}).find("'base' must be positive"), std::string::npos);
  auto bad_attr = select(Stream::host(), OpDesc{"rope", {x, pos}, {}, {{"theta", 1}}});
  ASSERT_FALSE(bad_attr);
  EXPECT_NE(bad_attr.status().message().find("unknown attribute 'theta'"), std::string::npos);
  // In place needs the same layout: out overlapping x shifted by one element is refused.
  Buffer xb = buffer(DType::f32, {1, 2, 1, 8}, uniform(16, -1, 1, 16)), pb = buffer(DType::i64, {2}, {1, 2});
  auto plan = select(Stream::host(), OpDesc{"rope", {{DType::f32, {1, 2, 1, 8}}, {DType::i64, {2}}}, {}, {}});
  ASSERT_TRUE(plan);
  const TensorView in[2] = {xb.view(xb.memory.data()), pb.view(pb.memory.data())};
  const TensorView outs[1] = {*TensorView::strided(static_cast<float*>(xb.memory.data()) + 1, DType::f32,
                                                   Shape{1, 2, 1, 8}, Shape{16, 8, 8, 1})};
  const Status s = (*plan)->can_implement(OpArgs{in, outs});
  EXPECT_NE(s.message().find("output 'out' overlaps input 'x'"), std::string::npos) << s.message();
}

// ---------------------------------------------------------------- kv_append

struct KvCase {
  int64_t batch = 3, tokens = 3, heads = 2, dim = 10, dim_v = 6;
  int64_t num_blocks = 12, block_size = 4, max_blocks = 4;
};

/// A block table with distinct ids (a shuffled subset of [0, num_blocks)).
std::vector<double> distinct_blocks(const KvCase& c, uint64_t seed) {
  std::vector<double> ids(c.num_blocks);
  std::iota(ids.begin(), ids.end(), 0.0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  ids.resize(c.batch * c.max_blocks);
  return ids;
}

/// The cache after appending `src` [B, T, H, D] by the block table (empty: contiguous).
std::vector<double> expected_cache(const KvCase& c, int64_t dim, std::vector<double> cache, const std::vector<double>& src,
                                   const std::vector<double>& table, const std::vector<double>& seqlens, DType dtype) {
  const int64_t slots = table.empty() ? cache.size() / (c.batch * c.heads * dim) : c.block_size;
  for (int64_t b = 0; b < c.batch; ++b)
    for (int64_t t = 0; t < c.tokens; ++t) {
      const int64_t pos = int64_t(seqlens[b]) + t;
      const int64_t block = table.empty() ? b : int64_t(table[b * c.max_blocks + pos / c.block_size]);
      const int64_t slot = table.empty() ? pos : pos % c.block_size;
      for (int64_t h = 0; h < c.heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          double v = src[((b * c.tokens + t) * c.heads + h) * dim + d];
          char scratch[16];
          store_double(scratch, dtype, 0, v);  // the cache's rounding
          cache[((block * slots + slot) * c.heads + h) * dim + d] = load_double(scratch, dtype, 0);
        }
    }
  return cache;
}

struct KvBuffers {
  Buffer k, v, table, seqlens, k_cache, v_cache;
  std::vector<double> k_prior, v_prior;
};

KvBuffers kv_buffers(const KvCase& c, DType in, DType cache, bool paged, const std::vector<double>& seqlens,
                     const std::vector<double>& table, Shape k_strides = {}) {
  const int64_t blocks = paged ? c.num_blocks : c.batch, slots = paged ? c.block_size : c.block_size * c.max_blocks;
  KvBuffers b;
  b.k = buffer(in, {c.batch, c.tokens, c.heads, c.dim}, uniform(c.batch * c.tokens * c.heads * c.dim, -2, 2, 20), k_strides);
  b.v = buffer(in, {c.batch, c.tokens, c.heads, c.dim_v}, uniform(c.batch * c.tokens * c.heads * c.dim_v, -2, 2, 21));
  b.table = paged ? buffer(DType::i32, {c.batch, c.max_blocks}, table) : buffer(DType::i32, {0});
  b.seqlens = buffer(DType::i32, {c.batch}, seqlens);
  b.k_cache = buffer(cache, {blocks, slots, c.heads, c.dim}, uniform(blocks * slots * c.heads * c.dim, -1, 1, 22));
  b.v_cache = buffer(cache, {blocks, slots, c.heads, c.dim_v}, uniform(blocks * slots * c.heads * c.dim_v, -1, 1, 23));
  b.k_prior = b.k_cache.values();
  b.v_prior = b.v_cache.values();
  return b;
}

Status append(Backend backend, KvBuffers& b) {
  return run(backend, "kv_append", {&b.k, &b.v, &b.table, &b.seqlens}, {&b.k_cache, &b.v_cache});
}

TEST(KvAppend, PagedWritesOnlyItsSlots) {
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : {DType::f32, DType::f16, DType::bf16, DType::f64})
      for (int64_t dim : {10, 16}) {  // 16: the 16-byte path for the halves
        KvCase c;
        c.dim = dim;
        const std::vector<double> seqlens{0, 5, 9};  // tokens cross block boundaries (block_size 4)
        const auto table = distinct_blocks(c, 30 + dim);
        KvBuffers b = kv_buffers(c, dtype, dtype, true, seqlens, table);
        ASSERT_TRUE(append(backend, b).is_ok()) << backend_name(backend);
        EXPECT_EQ(max_diff(b.k_cache.values(), expected_cache(c, c.dim, b.k_prior, b.k.values(), table, seqlens, dtype)), 0)
            << backend_name(backend) << " " << dtype_name(dtype) << " dim " << dim;
        EXPECT_EQ(max_diff(b.v_cache.values(), expected_cache(c, c.dim_v, b.v_prior, b.v.values(), table, seqlens, dtype)), 0)
            << backend_name(backend) << " " << dtype_name(dtype);
        EXPECT_GT(max_diff(b.k_cache.values(), b.k_prior), 0);  // something was written
      }
}

TEST(KvAppend, ContiguousCachesAndStridedInputs) {
  KvCase c;  // caches [B, 16, H, D]
  const std::vector<double> seqlens{13, 0, 4};
  for (Backend backend : host_and_cuda_backends()) {
    // k_new: a [B, H, T, D] buffer seen as [B, T, H, D].
    const Shape k_strides{c.heads * c.tokens * c.dim, c.dim, c.tokens * c.dim, 1};
    KvBuffers b = kv_buffers(c, DType::f32, DType::f32, false, seqlens, {}, k_strides);
    ASSERT_TRUE(append(backend, b).is_ok()) << backend_name(backend);
    EXPECT_EQ(max_diff(b.k_cache.values(), expected_cache(c, c.dim, b.k_prior, b.k.values(), {}, seqlens, DType::f32)), 0);
    EXPECT_EQ(max_diff(b.v_cache.values(), expected_cache(c, c.dim_v, b.v_prior, b.v.values(), {}, seqlens, DType::f32)), 0);
  }
}

TEST(KvAppend, Fp8Caches) {
  for (Backend backend : host_and_cuda_backends())
    for (DType cache : {DType::fp8_e4m3, DType::fp8_e5m2})
      for (DType in : {DType::bf16, DType::f16, DType::f32}) {
        KvCase c;
        c.dim = 16;
        const std::vector<double> seqlens{2, 7, 0};
        const auto table = distinct_blocks(c, 40);
        KvBuffers b = kv_buffers(c, in, cache, true, seqlens, table);
        ASSERT_TRUE(append(backend, b).is_ok()) << backend_name(backend);
        EXPECT_EQ(max_diff(b.k_cache.values(), expected_cache(c, c.dim, b.k_prior, b.k.values(), table, seqlens, cache)), 0)
            << backend_name(backend) << " " << dtype_name(in) << " -> " << dtype_name(cache);
        EXPECT_EQ(max_diff(b.v_cache.values(), expected_cache(c, c.dim_v, b.v_prior, b.v.values(), table, seqlens, cache)), 0);
      }
}

TEST(KvAppendErrors, HostNamesTheBadTokenAndWritesNothing) {
  KvCase c;
  struct Bad {
    std::vector<double> seqlens;
    int bad_id;  // put at block_table[1, 1] (-1: none)
    bool paged;
    std::string expect;
  };
  const std::vector<Bad> cases = {
      {{0, 5, 2}, 99, true, "sequence 1 token 0: position 5 (cache_seqlens[1] = 5 + 0): block id 99 at block_table[1, 1]"},
      {{0, 14, 2}, -1, true, "sequence 1 token 2: position 16 (cache_seqlens[1] = 14 + 2) needs block_table[1, 4], but "
                             "the table has 4 blocks per sequence"},
      {{0, -2, 2}, -1, true, "sequence 1 token 0: position -2 (cache_seqlens[1] = -2 + 0) is negative"},
      {{0, 15, 2}, -1, false, "sequence 1 token 1: position 16 (cache_seqlens[1] = 15 + 1) is past the cache's 16"},
  };
  for (const Bad& bad : cases) {
    auto table = distinct_blocks(c, 50);
    if (bad.bad_id >= 0) table[1 * c.max_blocks + 1] = bad.bad_id;
    KvBuffers b = kv_buffers(c, DType::f32, DType::f32, bad.paged, bad.seqlens, bad.paged ? table : std::vector<double>{});
    const Status s = append(Backend::host_reference, b);
    ASSERT_FALSE(s);
    EXPECT_NE(s.message().find(bad.expect), std::string::npos) << s.message();
    EXPECT_EQ(max_diff(b.k_cache.values(), b.k_prior), 0);
    EXPECT_EQ(max_diff(b.v_cache.values(), b.v_prior), 0);
  }
}

TEST(KvAppend, CudaSkipsOutOfRangeTokensAndWritesNothingElse) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (int64_t dim : {10, 16}) {
    KvCase c;
    c.dim = dim;
    auto table = distinct_blocks(c, 60);
    table[0 * c.max_blocks + 0] = 12;      // sequence 0, block 0: id one past the cache
    table[2 * c.max_blocks + 3] = -7;      // sequence 2, block 3: negative id
    const std::vector<double> seqlens{2, 14, 9};  // seq 1 runs past the table at token 2; seq 2 reaches block 3 at t 3
    c.tokens = 4;
    // The caches sit inside larger buffers whose guard elements must stay as they are.
    KvBuffers b = kv_buffers(c, DType::bf16, DType::bf16, true, seqlens, table);
    Buffer guard_k = buffer(DType::bf16, {c.num_blocks + 2, c.block_size, c.heads, c.dim},
                            uniform((c.num_blocks + 2) * c.block_size * c.heads * c.dim, -1, 1, 61));
    const auto guard_before = guard_k.values();
    const int64_t block_elems = c.block_size * c.heads * c.dim;
    Buffer k_cache_view;  // blocks 1 .. num_blocks of guard_k
    k_cache_view.dtype = DType::bf16;
    k_cache_view.shape = b.k_cache.shape;
    k_cache_view.strides = b.k_cache.strides;
    k_cache_view.base = block_elems;
    k_cache_view.span = guard_k.span;
    k_cache_view.memory = std::move(guard_k.memory);
    const auto k_prior = k_cache_view.values();
    ASSERT_TRUE(run(Backend::bespoke_cuda, "kv_append", {&b.k, &b.v, &b.table, &b.seqlens}, {&k_cache_view, &b.v_cache})
                    .is_ok());
    // Expected: every token whose slot is valid; the rest nowhere.
    std::vector<double> want = k_prior;
    const auto k = b.k.values();
    for (int64_t s = 0; s < c.batch; ++s)
      for (int64_t t = 0; t < c.tokens; ++t) {
        const int64_t pos = int64_t(seqlens[s]) + t, index = pos / c.block_size;
        if (index >= c.max_blocks) continue;
        const int64_t block = int64_t(table[s * c.max_blocks + index]);
        if (block < 0 || block >= c.num_blocks) continue;
        for (int64_t e = 0; e < c.heads * c.dim; ++e)
          want[(block * c.block_size + pos % c.block_size) * c.heads * c.dim + e] =
              k[((s * c.tokens + t) * c.heads) * c.dim + e];
      }
    EXPECT_EQ(max_diff(k_cache_view.values(), want), 0) << "dim " << dim;
    const auto after = [&] {
      std::vector<double> all;
      for (int64_t e = 0; e < k_cache_view.span; ++e) all.push_back(load_double(k_cache_view.memory.data(), DType::bf16, e));
      return all;
    }();
    for (int64_t e = 0; e < block_elems; ++e) ASSERT_EQ(after[e], guard_before[e]) << "guard before the cache";
    for (int64_t e = (c.num_blocks + 1) * block_elems; e < k_cache_view.span; ++e)
      ASSERT_EQ(after[e], guard_before[e]) << "guard after the cache";
  }
}

TEST(KvAppendErrors, BadOperandsAreNamed) {
  const TensorSpec k{DType::f16, {2, 3, 4, 8}}, v{DType::f16, {2, 3, 4, 6}}, table{DType::i32, {2, 5}},
      seqlens{DType::i32, {2}}, kc{DType::f16, {10, 16, 4, 8}}, vc{DType::f16, {10, 16, 4, 6}};
  auto error = [](std::vector<TensorSpec> in, std::vector<TensorSpec> out) {
    auto r = find_op("kv_append")->infer(OpDesc{"kv_append", std::move(in), std::move(out), {}});
    return r ? std::string("ok") : r.status().message();
  };
  EXPECT_EQ(error({k, v, table, seqlens}, {kc, vc}), "ok");
  EXPECT_EQ(error({k, v, {DType::i32, {0}}, seqlens}, {{DType::f16, {2, 16, 4, 8}}, {DType::f16, {2, 16, 4, 6}}}), "ok");
  EXPECT_EQ(error({k, v, table, seqlens}, {{DType::fp8_e4m3, kc.shape}, {DType::fp8_e4m3, vc.shape}}), "ok");
  EXPECT_NE(error({k, v, table, seqlens}, {}).find("give both outputs 'k_cache' and 'v_cache'"), std::string::npos);
  EXPECT_NE(error({k, v, {DType::i32, {3, 5}}, seqlens}, {kc, vc}).find("'block_table' must be [2, max_blocks] or [0]"),
            std::string::npos);
  EXPECT_NE(error({k, v, {DType::i64, {2, 5}}, seqlens}, {kc, vc}).find("'block_table' dtype i64, expected i32"),
            std::string::npos);
  EXPECT_NE(error({k, v, table, {DType::i32, {3}}}, {kc, vc}).find("'cache_seqlens' must be [2], got shape [3]"),
            std::string::npos);
  EXPECT_NE(error({k, {DType::bf16, v.shape}, table, seqlens}, {kc, vc}).find("'v_new' dtype bf16 != 'k_new' dtype f16"),
            std::string::npos);
  EXPECT_NE(error({k, {DType::f16, {2, 2, 4, 6}}, table, seqlens}, {kc, vc}).find("'v_new' must be [2, 3, 4,"),
            std::string::npos);
  EXPECT_NE(error({k, v, table, seqlens}, {{DType::f16, {10, 16, 2, 8}}, vc}).find("'k_cache' must be [num_blocks, "
                                                                                    "block_size, 4, 8]"),
            std::string::npos);
  EXPECT_NE(error({k, v, {DType::i32, {0}}, seqlens}, {kc, vc}).find("'k_cache' must be [batch, max_seqlen, 4, 8] with "
                                                                     "batch 2"),
            std::string::npos);
  EXPECT_NE(error({k, v, table, seqlens}, {kc, {DType::f16, {10, 16, 4, 8}}}).find("'v_cache' must be [10, 16, 4, 6]"),
            std::string::npos);
  EXPECT_NE(error({k, v, table, seqlens}, {{DType::f32, kc.shape}, vc}).find("'k_cache' dtype f32, expected f16 or fp8"),
            std::string::npos);
  EXPECT_NE(error({k, v, table, seqlens}, {kc, {DType::bf16, vc.shape}}).find("'v_cache' dtype bf16 != 'k_cache' dtype"),
            std::string::npos);
}

}  // namespace
