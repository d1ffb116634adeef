// Elementwise family: every registered op x dtype x layout x size x attribute
// set against the host reference in f64 (host backend in CI, CUDA on a GPU),
// backward against finite differences, functors against the C library, and
// the CUDA-specific properties (graph capture, > 2^31 elements, misalignment).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>

#include "baracuda/registry.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {


BARACUDA_SWEEP_SUITE(Elementwise, ops_of(OpCategory::elementwise));

// ---------------------------------------------------------------- finite differences

/// Runs `op` on the host in f64 over contiguous buffers.
void host_run(const std::string& op, const std::vector<std::vector<double>*>& inputs,
              const std::vector<Shape>& in_shapes, std::vector<std::vector<double>>& outputs, const Attrs& attrs,
              const std::vector<DType>& in_dtypes, std::vector<Shape> out_shapes = {}) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < inputs.size(); ++i) specs.push_back({in_dtypes[i], in_shapes[i]});
  OpDesc desc{op, specs, {}, attrs};
  for (const Shape& s : out_shapes) desc.outputs.push_back({DType::f64, s});
  auto full = find_op(op)->infer(desc);
  ASSERT_TRUE(full) << full.status().to_string();
  std::vector<TensorView> in, out;
  std::vector<std::vector<unsigned char>> bool_storage;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (in_dtypes[i] == DType::boolean) {
      bool_storage.emplace_back(inputs[i]->size());
      for (size_t k = 0; k < inputs[i]->size(); ++k) bool_storage.back()[k] = (*inputs[i])[k] != 0;
      in.push_back(*TensorView::contiguous(bool_storage.back().data(), DType::boolean, in_shapes[i]));
    } else {
      in.push_back(*TensorView::contiguous(inputs[i]->data(), DType::f64, in_shapes[i]));
    }
  }
  outputs.assign(full->outputs.size(), {});
  for (size_t j = 0; j < full->outputs.size(); ++j) {
    outputs[j].assign(full->outputs[j].numel(), NAN);
    out.push_back(*TensorView::contiguous(outputs[j].data(), DType::f64, full->outputs[j].shape));
  }
  auto plan = select(Stream::host(), *full);
  ASSERT_TRUE(plan) << plan.status().to_string();
  ASSERT_TRUE((*plan)->run(Stream::host(), {}, OpArgs{in, out}));
}

class FiniteDifferences : public testing::TestWithParam<std::string> {};

// Each output element depends only on the same-index elements of the inputs
// (gated ops: on both halves), so perturbing a whole input (or half) by h
// gives every partial derivative at once.
TEST_P(FiniteDifferences, HostBackwardMatchesForward) {
  const OpInfo& bwd = *find_op(GetParam());
  const OpInfo& fwd = *find_op(bwd.gradient);
  const bool gated = fwd.family == "gated", where = fwd.family == "where";
  uint64_t seed = 1469598103934665603ull;  // FNV-1a of the op name: every run draws the same points
  for (char c : GetParam()) seed = (seed ^ uint8_t(c)) * 1099511628211ull;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0, 1);
  for (const Attrs& attrs : fwd.sample_attrs) {
    const int64_t n = 257;
    Shape shape{n};
    std::vector<DType> fwd_dtypes = fwd.input_dtypes(DType::f64);
    const size_t n_in = fwd_dtypes.size();
    std::vector<Shape> fwd_shapes(n_in, gated ? Shape{2 * n} : shape);
    std::vector<std::vector<double>> x(n_in);
    for (size_t i = 0; i < n_in; ++i) {
      Domain d = fwd.domain(i);
      x[i].resize(gated ? 2 * n : n);
      for (double& v : x[i]) {
        v = fwd_dtypes[i] == DType::boolean ? double(unit(rng) < 0.5) : d.lo + (d.hi - d.lo) * unit(rng);
        if (d.symmetric && unit(rng) < 0.5) v = -v;
      }
    }
    std::vector<double> dy(n);
    for (double& v : dy) v = unit(rng) * 2 - 1;

    // Analytic gradients.
    std::vector<std::vector<double>*> bwd_in{&dy};
    std::vector<Shape> bwd_shapes{shape};
    std::vector<DType> bwd_dtypes{DType::f64};
    if (where) {
      bwd_in.push_back(&x[0]);
      bwd_shapes.push_back(shape);
      bwd_dtypes.push_back(DType::boolean);
    } else {
      for (size_t i = 0; i < n_in; ++i) {
        bwd_in.push_back(&x[i]);
        bwd_shapes.push_back(fwd_shapes[i]);
        bwd_dtypes.push_back(DType::f64);
      }
    }
    std::vector<std::vector<double>> grads;
    host_run(bwd.name, bwd_in, bwd_shapes, grads, attrs, bwd_dtypes);

    // Numeric gradients, one differentiable input (or half) at a time.
    std::vector<std::vector<double>*> fwd_in;
    for (auto& v : x) fwd_in.push_back(&v);
    struct Target {
      size_t input;
      int64_t begin, end;  // perturbed range of that input
      size_t grad;         // which gradient output
      int64_t grad_offset; // where in that output
    };
    std::vector<Target> targets;
    if (gated) targets = {{0, 0, n, 0, 0}, {0, n, 2 * n, 0, n}};
    else if (where) targets = {{1, 0, n, 0, 0}, {2, 0, n, 1, 0}};
    else
      for (size_t i = 0; i < n_in; ++i) targets.push_back({i, 0, n, i, 0});
    std::vector<std::vector<double>> center;
    host_run(fwd.name, fwd_in, fwd_shapes, center, attrs, fwd_dtypes);
    for (const Target& t : targets) {
      std::vector<double> saved = x[t.input];
      std::vector<double> h(n);
      std::vector<std::vector<double>> plus, minus;
      for (int64_t k = t.begin; k < t.end; ++k) {
        h[k - t.begin] = 1e-6 * std::max(1.0, std::abs(saved[k]));
        x[t.input][k] = saved[k] + h[k - t.begin];
      }
      host_run(fwd.name, fwd_in, fwd_shapes, plus, attrs, fwd_dtypes);
      for (int64_t k = t.begin; k < t.end; ++k) x[t.input][k] = saved[k] - h[k - t.begin];
      host_run(fwd.name, fwd_in, fwd_shapes, minus, attrs, fwd_dtypes);
      x[t.input] = saved;
      int bad = 0, checked = 0;
      for (int64_t k = 0; k < n; ++k) {
        // A kink or step inside [x - h, x + h] (floor, relu at 0...) makes the
        // one-sided slopes disagree: the central difference means nothing there.
        const double left = (center[0][k] - minus[0][k]) / h[k], right = (plus[0][k] - center[0][k]) / h[k];
        if (std::abs(left - right) > 1e-3 * (1 + std::abs(left) + std::abs(right))) continue;
        ++checked;
        double numeric = dy[k] * (plus[0][k] - minus[0][k]) / (2 * h[k]);
        double analytic = grads[t.grad][t.grad_offset + k];
        if (!(std::abs(numeric - analytic) <= 1e-5 + 1e-5 * std::abs(numeric)) && bad++ < 3)
          ADD_FAILURE() << bwd.name << " input " << t.input << " element " << k << ": analytic " << analytic
                        << ", numeric " << numeric;
      }
      EXPECT_GT(checked, n / 2) << bwd.name << " input " << t.input << ": most points straddle a kink";
    }
  }
}

std::vector<std::string> backward_ops() {
  std::vector<std::string> names;
  for (const OpInfo& op : registry())
    if (op.category == OpCategory::elementwise && op.direction == Direction::backward) names.push_back(op.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(Ops, FiniteDifferences, testing::ValuesIn(backward_ops()), param_name);

// ---------------------------------------------------------------- known values

/// The functors in f64 against the C library / closed forms at a few points.
TEST(KnownValues, UnaryFunctorsMatchClosedForms) {
  const double xs[] = {-2.5, -0.7, -0.1, 0.3, 0.9, 1.7, 3.2};
  auto sig = [](double x) { return 1 / (1 + std::exp(-x)); };
  const std::map<std::string, std::function<double(double)>> forms{
      {"neg", [](double x) { return -x; }}, {"abs", [](double x) { return std::abs(x); }},
      {"exp", [](double x) { return std::exp(x); }}, {"expm1", [](double x) { return std::expm1(x); }},
      {"sin", [](double x) { return std::sin(x); }}, {"tanh", [](double x) { return std::tanh(x); }},
      {"erf", [](double x) { return std::erf(x); }}, {"erfc", [](double x) { return std::erfc(x); }},
      {"floor", [](double x) { return std::floor(x); }}, {"round", [](double x) { return std::nearbyint(x); }},
      {"sigmoid", sig}, {"silu", [&](double x) { return x * sig(x); }},
      {"gelu", [](double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }},
      {"gelu_tanh", [](double x) { return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }},
      {"mish", [](double x) { return x * std::tanh(std::log1p(std::exp(x))); }},
      {"softplus", [](double x) { return std::log1p(std::exp(x)); }},
      {"hardswish", [](double x) { return x * std::min(std::max(x + 3, 0.0), 6.0) / 6; }},
      {"selu", [](double x) { return 1.0507009873554805 * (x > 0 ? x : 1.6732632423543772 * (std::exp(x) - 1)); }},
      {"softsign", [](double x) { return x / (1 + std::abs(x)); }},
      {"relu6", [](double x) { return std::min(std::max(x, 0.0), 6.0); }},
      {"frac", [](double x) { return x - std::trunc(x); }},
      {"leaky_relu", [](double x) { return x > 0 ? x : 0.01 * x; }},
  };
  for (const auto& [name, form] : forms) {
    std::vector<double> in(std::begin(xs), std::end(xs)), out(in.size(), NAN);
    Shape shape{int64_t(in.size())};
    TensorView vi = *TensorView::contiguous(in.data(), DType::f64, shape);
    TensorView vo = *TensorView::contiguous(out.data(), DType::f64, shape);
    ASSERT_TRUE(run_op(Stream::host(), name, std::span(&vi, 1), std::span(&vo, 1))) << name;
    for (size_t i = 0; i < in.size(); ++i) EXPECT_NEAR(out[i], form(in[i]), 1e-13 * (1 + std::abs(out[i]))) << name << "(" << in[i] << ")";
  }
  // lgamma/digamma: digamma(1) = -gamma, digamma(0.5) = -gamma - 2 ln 2; lgamma(5) = ln 24.
  std::vector<double> in{1.0, 0.5, 5.0}, dig(3), lg(3);
  Shape s{3};
  TensorView vi = *TensorView::contiguous(in.data(), DType::f64, s);
  TensorView vd = *TensorView::contiguous(dig.data(), DType::f64, s);
  TensorView vl = *TensorView::contiguous(lg.data(), DType::f64, s);
  ASSERT_TRUE(run_op(Stream::host(), "digamma", std::span(&vi, 1), std::span(&vd, 1)));
  ASSERT_TRUE(run_op(Stream::host(), "lgamma", std::span(&vi, 1), std::span(&vl, 1)));
  EXPECT_NEAR(dig[0], -0.5772156649015329, 1e-13);
  EXPECT_NEAR(dig[1], -0.5772156649015329 - 2 * std::log(2.0), 1e-13);
  EXPECT_NEAR(lg[2], std::log(24.0), 1e-13);
}

TEST(KnownValues, IntegerAndCastSemantics) {
  // floor_divide / remainder follow Python; fmod follows C; shifts; saturating casts.
  std::vector<int32_t> a{7, -7, 7, -7, 5}, b{2, 2, -2, -2, 0}, q(5), r(5), m(5);
  Shape s{5};
  TensorView in[2] = {*TensorView::contiguous(a.data(), DType::i32, s), *TensorView::contiguous(b.data(), DType::i32, s)};
  TensorView vq = *TensorView::contiguous(q.data(), DType::i32, s);
  TensorView vr = *TensorView::contiguous(r.data(), DType::i32, s);
  TensorView vm = *TensorView::contiguous(m.data(), DType::i32, s);
  ASSERT_TRUE(run_op(Stream::host(), "floor_divide", in, std::span(&vq, 1)));
  ASSERT_TRUE(run_op(Stream::host(), "remainder", in, std::span(&vr, 1)));
  ASSERT_TRUE(run_op(Stream::host(), "fmod", in, std::span(&vm, 1)));
  EXPECT_EQ(q, (std::vector<int32_t>{3, -4, -4, 3, 0}));
  EXPECT_EQ(r, (std::vector<int32_t>{1, 1, -1, -1, 0}));
  EXPECT_EQ(m, (std::vector<int32_t>{1, -1, 1, -1, 0}));

  std::vector<float> f{1e10f, -1e10f, NAN, -3.9f, 2.5f};
  std::vector<int8_t> i8(5);
  TensorView vf = *TensorView::contiguous(f.data(), DType::f32, s);
  TensorView vi8 = *TensorView::contiguous(i8.data(), DType::i8, s);
  ASSERT_TRUE(run_op(Stream::host(), "cast", std::span(&vf, 1), std::span(&vi8, 1), Attrs{{"dtype", double(int(DType::i8))}}));
  EXPECT_EQ(i8, (std::vector<int8_t>{127, -128, 0, -3, 2}));

  std::vector<uint8_t> bits{1, 128, 255, 3, 7}, shift{1, 1, 8, 0, 3}, left(5);
  TensorView sh[2] = {*TensorView::contiguous(bits.data(), DType::u8, s), *TensorView::contiguous(shift.data(), DType::u8, s)};
  TensorView vl = *TensorView::contiguous(left.data(), DType::u8, s);
  ASSERT_TRUE(run_op(Stream::host(), "bitwise_left_shift", sh, std::span(&vl, 1)));
  EXPECT_EQ(left, (std::vector<uint8_t>{2, 0, 0, 3, 56}));
}

TEST(KnownValues, NextafterStepsInTheStorageFormat) {
  // One ulp of the input's own dtype: f32 2^-23, f16 2^-10, bf16 2^-7 at 1.0;
  // from 0 toward -1: the smallest negative subnormal.
  struct Case {
    DType dtype;
    double ulp, tiniest;
  };
  const Case cases[] = {{DType::f32, 0x1p-23, 0x1p-149}, {DType::f16, 0x1p-10, 0x1p-24}, {DType::bf16, 0x1p-7, 0x1p-133},
                        {DType::f64, 0x1p-52, 0x1p-1074}};
  for (auto [dtype, ulp, tiniest] : cases) {
    alignas(8) char a[32], b[32], out[32];
    const double av[] = {1.0, 1.0, 0.0, 2.0}, bv[] = {2.0, 0.0, -1.0, 2.0};
    for (int i = 0; i < 4; ++i) {
      store_double(a, dtype, i, av[i]);
      store_double(b, dtype, i, bv[i]);
    }
    Shape s{4};
    TensorView in[2] = {*TensorView::contiguous(a, dtype, s), *TensorView::contiguous(b, dtype, s)};
    TensorView vo = *TensorView::contiguous(out, dtype, s);
    ASSERT_TRUE(run_op(Stream::host(), "nextafter", in, std::span(&vo, 1))) << dtype_name(dtype);
    EXPECT_EQ(load_double(out, dtype, 0), 1.0 + ulp) << dtype_name(dtype);
    EXPECT_EQ(load_double(out, dtype, 1), 1.0 - ulp / 2) << dtype_name(dtype);  // below 1 the spacing halves
    EXPECT_EQ(load_double(out, dtype, 2), -tiniest) << dtype_name(dtype);
    EXPECT_EQ(load_double(out, dtype, 3), 2.0) << dtype_name(dtype);
  }
}

TEST(KnownValues, BroadcastBackwardSumsOverBroadcastDims) {
  // add_backward with a [2,3] and b [3]: db = column sums of dy, alpha-scaled.
  std::vector<double> dy{1, 2, 3, 4, 5, 6}, a(6, 0.0), b(3, 0.0), da(6, NAN), db(3, NAN);
  Shape s23{2, 3}, s3{3};
  TensorView in[3] = {*TensorView::contiguous(dy.data(), DType::f64, s23), *TensorView::contiguous(a.data(), DType::f64, s23),
                      *TensorView::contiguous(b.data(), DType::f64, s3)};
  TensorView out[2] = {*TensorView::contiguous(da.data(), DType::f64, s23), *TensorView::contiguous(db.data(), DType::f64, s3)};
  ASSERT_TRUE(run_op(Stream::host(), "add_backward", in, out, Attrs{{"alpha", 2}}));
  EXPECT_EQ(da, dy);
  EXPECT_EQ(db, (std::vector<double>{10, 14, 18}));
}

// ---------------------------------------------------------------- CUDA specifics

#ifdef BARACUDA_HAS_CUDA
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(size_t bytes) { EXPECT_EQ(cudaMalloc(&ptr, bytes), cudaSuccess); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

TEST(CudaElementwise, GraphCaptureOfSeveralPlansReplays) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 100003;
  Shape s{n};
  std::vector<float> x(n), y(n), out(n);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> u(-2, 2);
  for (auto& v : x) v = u(rng);
  for (auto& v : y) v = u(rng);
  DeviceBuffer dx(n * 4), dy(n * 4), dt(n * 4), dout(n * 4);
  cudaMemcpy(dx.ptr, x.data(), n * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dy.ptr, y.data(), n * 4, cudaMemcpyHostToDevice);
  cudaStream_t cs;
  ASSERT_EQ(cudaStreamCreate(&cs), cudaSuccess);
  Stream stream = Stream::cuda(cs);
  auto vx = *TensorView::contiguous(dx.ptr, DType::f32, s), vy = *TensorView::contiguous(dy.ptr, DType::f32, s);
  auto vt = *TensorView::contiguous(dt.ptr, DType::f32, s), vo = *TensorView::contiguous(dout.ptr, DType::f32, s);
  auto add = check(select(stream, *infer("add", {{DType::f32, s}, {DType::f32, s}})));
  auto gelu = check(select(stream, *infer("gelu", {{DType::f32, s}})));
  auto mul = check(select(stream, *infer("mul", {{DType::f32, s}, {DType::f32, s}})));
  TensorView add_in[2] = {vx, vy}, mul_in[2] = {vt, vx};
  cudaGraph_t graph;
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_TRUE(add->run(stream, {}, OpArgs{add_in, std::span(&vt, 1)}));
  ASSERT_TRUE(gelu->run(stream, {}, OpArgs{std::span(&vt, 1), std::span(&vt, 1)}));
  ASSERT_TRUE(mul->run(stream, {}, OpArgs{mul_in, std::span(&vo, 1)}));
  ASSERT_EQ(cudaStreamEndCapture(cs, &graph), cudaSuccess);
  cudaGraphExec_t exec;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 2; ++replay) {
    cudaMemsetAsync(dout.ptr, 0xFF, n * 4, cs);
    ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
    cudaMemcpy(out.data(), dout.ptr, n * 4, cudaMemcpyDeviceToHost);
    for (int64_t i = 0; i < n; ++i) {
      double t = double(x[i]) + double(y[i]);
      double expect = 0.5 * t * (1 + std::erf(t / std::sqrt(2.0))) * x[i];
      ASSERT_NEAR(out[i], expect, 1e-5 * (1 + std::abs(expect))) << "replay " << replay << " element " << i;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(cs);
}

TEST(CudaElementwise, MoreThan2Pow31Elements) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = (int64_t(1) << 31) + 77;
  Shape s{n};
  DeviceBuffer a(n), b(n);
  auto va = *TensorView::contiguous(a.ptr, DType::u8, s), vb = *TensorView::contiguous(b.ptr, DType::u8, s);
  ASSERT_TRUE(run_op(Stream::cuda(), "fill", {}, std::span(&va, 1), Attrs{{"value", 3}}));
  TensorView add_in[2] = {va, va};
  ASSERT_TRUE(run_op(Stream::cuda(), "add", add_in, std::span(&vb, 1), Attrs{{"alpha", 2}}));  // 9, vector path
  // maximum(b[::-1], b) -> a: a reversed input forces the strided path with 64-bit offsets.
  int64_t rev_stride[] = {-1};
  auto rb = *TensorView::strided(static_cast<char*>(b.ptr) + n - 1, DType::u8, s, rev_stride);
  TensorView max_in[2] = {rb, vb};
  ASSERT_TRUE(run_op(Stream::cuda(), "maximum", max_in, std::span(&va, 1)));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (void* buf : {b.ptr, a.ptr}) {
    for (int64_t i : {int64_t(0), int64_t(1) << 31, n - 1}) {
      uint8_t v = 0;
      cudaMemcpy(&v, static_cast<char*>(buf) + i, 1, cudaMemcpyDeviceToHost);
      EXPECT_EQ(v, 9) << "element " << i;
    }
  }
}

TEST(CudaElementwise, MisalignedPointersFallBackToTheScalarPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t n = 4099;
  for (DType d : {DType::f32, DType::bf16, DType::f64}) {
    for (int shift : {1, 3}) {
      // Views shifted off the 16-byte vector alignment by hand.
      DeviceBuffer in((n + 8) * 8), out((n + 8) * 8);
      size_t es = dtype_size(d);
      std::vector<char> host((n + 8) * 8, 0);
      for (int64_t i = 0; i < n + 8; ++i) store_double(host.data(), d, i, std::sin(double(i)));
      cudaMemcpy(in.ptr, host.data(), host.size(), cudaMemcpyHostToDevice);
      Shape s{n};
      auto vi = *TensorView::contiguous(static_cast<char*>(in.ptr) + shift * es, d, s);
      auto vo = *TensorView::contiguous(static_cast<char*>(out.ptr) + (shift + 1) * es, d, s);
      ASSERT_TRUE(run_op(Stream::cuda(), "silu", std::span(&vi, 1), std::span(&vo, 1)));
      std::vector<char> got(host.size());
      cudaMemcpy(got.data(), out.ptr, got.size(), cudaMemcpyDeviceToHost);
      for (int64_t i = 0; i < n; ++i) {
        double x = load_double(host.data(), d, i + shift);
        double expect = x / (1 + std::exp(-x));
        double tol = d == DType::bf16 ? 1e-2 : 1e-6;
        ASSERT_NEAR(load_double(got.data(), d, i + shift + 1), expect, tol * (1 + std::abs(expect)))
            << dtype_name(d) << " shift " << shift << " element " << i;
      }
    }
  }
}
#endif

}  // namespace
