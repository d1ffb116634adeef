// Reduction family: every op x dtype x axis set x shape x layout against the
// host reference in f64 (host backend in CI, CUDA on a GPU), closed-form
// values, torch's semantics (NaN, ties, empty), bad input, and run-to-run
// bitwise determinism of the CUDA kernels (split reductions included).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "gradcheck.hpp"
#include "harness.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

BARACUDA_SWEEP_SUITE(Reduce, ops_of(OpCategory::reduce));

/// Runs a reduction on the host over a contiguous f64 input; returns the outputs as doubles.
std::vector<double> host_reduce(const std::string& op, std::vector<double> x, const Shape& shape, const Attrs& attrs,
                                DType out_dtype = DType::f64, Shape out_shape = {}, bool give_output = false) {
  OpDesc desc{op, {{DType::f64, shape}}, {}, attrs};
  if (give_output) desc.outputs.push_back({out_dtype, out_shape});
  auto full = find_op(op)->infer(desc);
  EXPECT_TRUE(full) << full.status().to_string();
  if (!full) return {};
  const TensorSpec& o = full->outputs[0];
  std::vector<char> out(std::max<int64_t>(o.numel(), 1) * dtype_size(o.dtype));
  auto in_view = *TensorView::contiguous(x.data(), DType::f64, shape);
  auto out_view = *TensorView::contiguous(out.data(), o.dtype, o.shape);
  Status s = run_op(Stream::host(), op, std::span(&in_view, 1), std::span(&out_view, 1), attrs);
  EXPECT_TRUE(s) << s.to_string();
  std::vector<double> result(o.numel());
  for (int64_t i = 0; i < o.numel(); ++i) result[i] = load_double(out.data(), o.dtype, i);
  return result;
}

TEST(ReduceKnownValues, ClosedForms) {
  const std::vector<double> x{1, -2, 3, 4, 0, -6};  // shape [2, 3]
  const Shape s{2, 3};
  EXPECT_EQ(host_reduce("sum", x, s, {}), std::vector<double>{0});
  EXPECT_EQ(host_reduce("sum", x, s, {{"dims", 1}}), (std::vector<double>{5, -2, -3}));
  EXPECT_EQ(host_reduce("sum", x, s, {{"dims", 2}}), (std::vector<double>{2, -2}));
  EXPECT_EQ(host_reduce("prod", x, s, {{"dims", 2}}), (std::vector<double>{-6, 0}));
  EXPECT_EQ(host_reduce("amax", x, s, {{"dims", 2}}), (std::vector<double>{3, 4}));
  EXPECT_EQ(host_reduce("amin", x, s, {}), std::vector<double>{-6});
  EXPECT_EQ(host_reduce("argmax", x, s, {}, DType::i64), std::vector<double>{3});
  EXPECT_EQ(host_reduce("argmin", x, s, {{"dims", 2}}, DType::i64), (std::vector<double>{1, 2}));
  EXPECT_EQ(host_reduce("count_nonzero", x, s, {}), std::vector<double>{5});
  EXPECT_EQ(host_reduce("any", x, s, {{"dims", 1}}), (std::vector<double>{1, 1, 1}));
  EXPECT_EQ(host_reduce("all", x, s, {{"dims", 2}}), (std::vector<double>{1, 0}));
  EXPECT_DOUBLE_EQ(host_reduce("mean", x, s, {})[0], 0.0);
  EXPECT_DOUBLE_EQ(host_reduce("norm", x, s, {})[0], std::sqrt(1 + 4 + 9 + 16 + 36.0));
  EXPECT_DOUBLE_EQ(host_reduce("norm", x, s, {{"p", 1}})[0], 16.0);
  EXPECT_DOUBLE_EQ(host_reduce("norm", x, s, {{"p", INFINITY}})[0], 6.0);
  EXPECT_DOUBLE_EQ(host_reduce("norm", x, s, {{"p", -INFINITY}})[0], 0.0);
  EXPECT_DOUBLE_EQ(host_reduce("norm", x, s, {{"p", 0}})[0], 5.0);
  EXPECT_NEAR(host_reduce("norm", x, s, {{"p", 3}})[0], std::cbrt(1 + 8 + 27 + 64 + 216.0), 1e-12);
  // var: mean 0, squares 66, n - 1 = 5.
  EXPECT_NEAR(host_reduce("var", x, s, {})[0], 66.0 / 5, 1e-12);
  EXPECT_NEAR(host_reduce("var", x, s, {{"correction", 0}})[0], 11.0, 1e-12);
  EXPECT_NEAR(host_reduce("std", x, s, {})[0], std::sqrt(66.0 / 5), 1e-12);
  EXPECT_NEAR(host_reduce("logsumexp", x, s, {})[0],
              std::log(std::exp(1) + std::exp(-2) + std::exp(3) + std::exp(4) + 1 + std::exp(-6)), 1e-12);
  EXPECT_EQ(host_reduce("trace", {1, 2, 3, 4, 5, 6}, {2, 3}, {}), std::vector<double>{6});  // 1 + 5
  EXPECT_EQ(host_reduce("sum_to", x, s, {}, DType::f64, {1, 3}, true), (std::vector<double>{5, -2, -3}));
  EXPECT_EQ(host_reduce("sum_to", x, s, {}, DType::f64, {2, 1}, true), (std::vector<double>{2, -2}));
  EXPECT_EQ(host_reduce("sum_to", x, s, {}, DType::f64, {3}, true), (std::vector<double>{5, -2, -3}));
}

TEST(ReduceKnownValues, TorchSemantics) {
  // NaN propagates through amax and wins argmax/argmin; ties go to the first index.
  const std::vector<double> x{1, NAN, 3, 3};
  EXPECT_TRUE(std::isnan(host_reduce("amax", x, {4}, {})[0]));
  EXPECT_TRUE(std::isnan(host_reduce("sum", x, {4}, {})[0]));
  EXPECT_EQ(host_reduce("argmax", x, {4}, {}, DType::i64)[0], 1);
  EXPECT_EQ(host_reduce("argmin", x, {4}, {}, DType::i64)[0], 1);
  EXPECT_EQ(host_reduce("argmax", {1, 3, 3, 0}, {4}, {}, DType::i64)[0], 1);
  EXPECT_EQ(host_reduce("argmin", {2, 0, 5, 0}, {4}, {}, DType::i64)[0], 1);
  // logsumexp of -inf everywhere is -inf; of +inf is +inf.
  EXPECT_EQ(host_reduce("logsumexp", {-INFINITY, -INFINITY}, {2}, {})[0], -INFINITY);
  EXPECT_EQ(host_reduce("logsumexp", {1, INFINITY}, {2}, {})[0], INFINITY);
  // Empty reductions: the identity where there is one.
  EXPECT_EQ(host_reduce("sum", {}, {0, 3}, {{"dims", 1}}), (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(host_reduce("prod", {}, {0}, {}), std::vector<double>{1});
  EXPECT_TRUE(std::isnan(host_reduce("mean", {}, {0}, {})[0]));
  EXPECT_EQ(host_reduce("all", {}, {0}, {})[0], 1);
  // var of one element with Bessel's correction: NaN (0 / 0), as torch.
  EXPECT_TRUE(std::isnan(host_reduce("var", {2}, {1}, {})[0]));
  // argmax over several axes: the row-major index over those axes.
  const std::vector<double> y{0, 1, 2, 3, 4, 5, 6, 7, 12, 8, 10, 11};  // [2, 3, 2]; max 12 at (1, 1, 0)
  EXPECT_EQ(host_reduce("argmax", y, {2, 3, 2}, {}, DType::i64)[0], 8);
  // Over axes 0 and 1: k = 0 peaks at (1, 1) -> 4, k = 1 at (1, 2) -> 5.
  EXPECT_EQ(host_reduce("argmax", y, {2, 3, 2}, {{"dims", 3}}, DType::i64), (std::vector<double>{4, 5}));
}

/// grad_input of `<op>_backward` on the host for grad_output 1 over a whole-tensor reduction.
std::vector<double> host_grad(const std::string& op, std::vector<double> x, const Attrs& attrs = {}) {
  const Shape shape{int64_t(x.size())};
  std::vector<double> g{1}, y = host_reduce(op, x, shape, attrs), dx(x.size(), NAN);
  TensorView in[3] = {*TensorView::contiguous(g.data(), DType::f64, {}), *TensorView::contiguous(x.data(), DType::f64, shape),
                      *TensorView::contiguous(y.data(), DType::f64, {})};
  auto out = *TensorView::contiguous(dx.data(), DType::f64, shape);
  auto desc = infer(op + "_backward", {{DType::f64, {}}, {DType::f64, shape}, {DType::f64, {}}}, attrs);
  EXPECT_TRUE(desc) << desc.status().to_string();
  if (!desc) return dx;
  auto plan = select(Stream::host(), *desc);
  EXPECT_TRUE(plan) << plan.status().to_string();
  if (!plan) return dx;
  std::vector<char> ws((*plan)->workspace_size());
  Status s = (*plan)->run(Stream::host(), Workspace{ws.data(), ws.size()}, OpArgs{in, std::span(&out, 1)});
  EXPECT_TRUE(s) << s.to_string();
  return dx;
}

/// torch's subgradients: amax/amin/norm(+-inf) split evenly among ties; prod
/// at zeros gives the product of the others (one zero) or nothing (two).
TEST(ReduceKnownValues, GradientsAtTiesAndZeros) {
  EXPECT_EQ(host_grad("amax", {1, 3, -2, 3}), (std::vector<double>{0, 0.5, 0, 0.5}));
  EXPECT_EQ(host_grad("amin", {-2, 3, -2, -2}), (std::vector<double>{1. / 3, 0, 1. / 3, 1. / 3}));
  EXPECT_EQ(host_grad("amax", {4, 1}), (std::vector<double>{1, 0}));
  EXPECT_EQ(host_grad("norm", {-3, 1, 3}, {{"p", INFINITY}}), (std::vector<double>{-0.5, 0, 0.5}));
  EXPECT_EQ(host_grad("norm", {-3, 1, -1}, {{"p", -INFINITY}}), (std::vector<double>{0, 0.5, -0.5}));
  EXPECT_EQ(host_grad("prod", {2, 3, 4}), (std::vector<double>{12, 8, 6}));
  EXPECT_EQ(host_grad("prod", {2, 0, 4}), (std::vector<double>{0, 8, 0}));
  EXPECT_EQ(host_grad("prod", {0, 5, 0}), (std::vector<double>{0, 0, 0}));
  // A NaN extreme: no element equals it, no gradient.
  EXPECT_EQ(host_grad("amax", {1, NAN, 2})[2], 0);
}

/// Every reduction gradient against central differences of sum(g * forward(x)) on the host.
/// Integer sums and products wrap around modulo 2^bits, as torch's do
/// (signed overflow would be undefined behaviour in C++): reductions,
/// scans and the elementwise add / sub / mul / neg / abs / square on the
/// host reference (neg and abs of the minimum give the minimum, as torch).
TEST(IntegerKnownValues, OverflowWrapsAsTorch) {
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max(), kMin64 = std::numeric_limits<int64_t>::min();
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max(), kMin32 = std::numeric_limits<int32_t>::min();
  auto run = [](const std::string& op, std::vector<TensorView> in, TensorView out, const Attrs& attrs = {}) {
    Status s = run_op(Stream::host(), op, in, std::span(&out, 1), attrs);
    EXPECT_TRUE(s) << op << ": " << s.to_string();
  };
  const Shape two{2}, scalar{};
  std::vector<int64_t> big{kMax64, 1}, pow{int64_t(1) << 62, 4}, r64(2);
  int64_t one = 0;
  run("sum", {*TensorView::contiguous(big.data(), DType::i64, two)}, *TensorView::contiguous(&one, DType::i64, scalar));
  EXPECT_EQ(one, kMin64);
  run("prod", {*TensorView::contiguous(pow.data(), DType::i64, two)}, *TensorView::contiguous(&one, DType::i64, scalar));
  EXPECT_EQ(one, 0);
  run("cumsum", {*TensorView::contiguous(big.data(), DType::i64, two)}, *TensorView::contiguous(r64.data(), DType::i64, two),
      {{"dim", 0}});
  EXPECT_EQ(r64, (std::vector<int64_t>{kMax64, kMin64}));
  run("cumprod", {*TensorView::contiguous(pow.data(), DType::i64, two)}, *TensorView::contiguous(r64.data(), DType::i64, two),
      {{"dim", 0}});
  EXPECT_EQ(r64, (std::vector<int64_t>{int64_t(1) << 62, 0}));
  std::vector<int32_t> a{kMax32, kMin32, 65536}, b{1, 1, 65536}, r32(3);
  const Shape three{3};
  auto a_view = *TensorView::contiguous(a.data(), DType::i32, three), b_view = *TensorView::contiguous(b.data(), DType::i32, three);
  auto r_view = *TensorView::contiguous(r32.data(), DType::i32, three);
  run("add", {a_view, b_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{kMin32, kMin32 + 1, 131072}));
  run("sub", {a_view, b_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{kMax32 - 1, kMax32, 0}));
  run("mul", {a_view, b_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{kMax32, kMin32, 0}));
  run("neg", {a_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{kMin32 + 1, kMin32, -65536}));
  run("abs", {a_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{kMax32, kMin32, 65536}));
  run("square", {a_view}, r_view);
  EXPECT_EQ(r32, (std::vector<int32_t>{1, 0, 0}));
  // min / -1 overflows (x86 traps on it): the quotient wraps to min and the
  // modulo is 0, as torch's; other divisors by -1 and by 0 around it.
  std::vector<int32_t> num{kMin32, kMin32, 7, -7, kMin32}, den{-1, 0, -1, -1, 2};
  const Shape five{5};
  auto num_view = *TensorView::contiguous(num.data(), DType::i32, five);
  auto den_view = *TensorView::contiguous(den.data(), DType::i32, five);
  std::vector<int32_t> q(5);
  auto q_view = *TensorView::contiguous(q.data(), DType::i32, five);
  run("floor_divide", {num_view, den_view}, q_view);
  EXPECT_EQ(q, (std::vector<int32_t>{kMin32, 0, -7, 7, kMin32 / 2}));
  run("fmod", {num_view, den_view}, q_view);
  EXPECT_EQ(q, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  run("remainder", {num_view, den_view}, q_view);
  EXPECT_EQ(q, (std::vector<int32_t>{0, 0, 0, 0, 0}));
  std::vector<int64_t> num64{kMin64, -9}, den64{-1, 4}, q64(2);
  auto num64_view = *TensorView::contiguous(num64.data(), DType::i64, two);
  auto den64_view = *TensorView::contiguous(den64.data(), DType::i64, two);
  auto q64_view = *TensorView::contiguous(q64.data(), DType::i64, two);
  run("floor_divide", {num64_view, den64_view}, q64_view);
  EXPECT_EQ(q64, (std::vector<int64_t>{kMin64, -3}));
  run("remainder", {num64_view, den64_view}, q64_view);
  EXPECT_EQ(q64, (std::vector<int64_t>{0, 3}));
  run("fmod", {num64_view, den64_view}, q64_view);
  EXPECT_EQ(q64, (std::vector<int64_t>{0, -1}));
}

TEST(ReduceFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-2, 2);
  const Shape s{3, 4};
  for (const OpInfo& op : registry()) {
    if (op.category != OpCategory::reduce || op.direction != Direction::backward) continue;
    for (const Attrs& attrs : op.sample_attrs) {
      auto shapes = op.sample_shapes(DType::f64, s, attrs);
      if (!shapes) continue;
      const Shape& ys = shapes->inputs[0];
      const bool sum_to = op.gradient == "sum_to";
      std::vector<double> x(12), g(std::max<int64_t>(TensorSpec{DType::f64, ys}.numel(), 1));
      for (auto& v : x) v = u(rng);
      for (auto& v : g) v = u(rng);
      auto forward = [&](const std::vector<double>& xs) {
        return host_reduce(op.gradient, xs, s, attrs, DType::f64, ys, sum_to);
      };
      std::vector<std::vector<double>> in{g, x};
      if (op.input_names.size() > 2) in.push_back(forward(x));
      // Run the backward plan.
      std::vector<TensorSpec> specs{{DType::f64, ys}, {DType::f64, s}};
      if (in.size() > 2) specs.push_back({DType::f64, ys});
      auto desc = infer(op.name, specs, attrs);
      ASSERT_TRUE(desc) << op.name << ": " << desc.status().to_string();
      std::vector<double> dx(12, NAN);
      std::vector<TensorView> views;
      for (size_t i = 0; i < in.size(); ++i) views.push_back(*TensorView::contiguous(in[i].data(), DType::f64, specs[i].shape));
      auto out = *TensorView::contiguous(dx.data(), DType::f64, s);
      auto plan = select(Stream::host(), *desc);
      ASSERT_TRUE(plan) << plan.status().to_string();
      std::vector<char> ws((*plan)->workspace_size() + 1);
      ASSERT_TRUE((*plan)->run(Stream::host(), Workspace{ws.data(), ws.size()}, OpArgs{views, std::span(&out, 1)}));
      auto loss = [&](const std::vector<double>& xs) { return weighted_sum(g, forward(xs)); };
      for (int i : {0, 5, 11}) EXPECT_NEAR(dx[i], central_difference(loss, x, i), 1e-5) << op.name << " " << i;
    }
  }
}

TEST(ReduceErrors, BadDescriptorsAreNamed) {
  auto err = [](const std::string& op, Shape shape, Attrs attrs) {
    auto d = infer(op, {{DType::f32, shape}}, attrs);
    EXPECT_FALSE(d) << op;
    return d ? std::string() : d.status().message();
  };
  EXPECT_NE(err("sum", {2, 3}, {{"dims", 4}}).find("names axis 2 but the input has rank 2"), std::string::npos);
  EXPECT_NE(err("sum", {2, 3}, {{"dims", -3}}).find("'dims'"), std::string::npos);
  EXPECT_NE(err("amax", {0, 3}, {{"dims", 1}}).find("no identity"), std::string::npos);
  EXPECT_NE(err("argmax", {4}, {{"index_dtype", 3}}).find("index_dtype"), std::string::npos);
  EXPECT_NE(err("trace", {2, 3, 4}, {}).find("rank 2"), std::string::npos);
  auto i = infer("mean", {{DType::i32, {4}}});
  ASSERT_FALSE(i);
  EXPECT_NE(i.status().message().find("i32"), std::string::npos);
  auto to = find_op("sum_to")->infer(OpDesc{"sum_to", {{DType::f32, {2, 3}}}, {{DType::f32, {2}}}, {}});
  ASSERT_FALSE(to);
  EXPECT_NE(to.status().message().find("does not broadcast"), std::string::npos);
  // Overlapping output and input.
  std::vector<float> buf(8, 1.0f);
  const Shape eight{8}, scalar{};
  auto in = *TensorView::contiguous(buf.data(), DType::f32, eight);
  auto out = *TensorView::contiguous(buf.data() + 2, DType::f32, scalar);
  Status s = run_op(Stream::host(), "sum", std::span(&in, 1), std::span(&out, 1));
  EXPECT_FALSE(s);
  EXPECT_NE(s.message().find("overlaps input 'input'"), std::string::npos) << s.message();
  // Too small a workspace is refused with the sizes.
}

TEST(ReduceErrors, ShortWorkspaceIsRefusedWithSizes) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  auto desc = infer("sum", {{DType::f32, {1 << 22}}});
  ASSERT_TRUE(desc);
  auto plan = select(Stream::cuda(), *desc);
  ASSERT_TRUE(plan);
  ASSERT_GT((*plan)->workspace_size(), 0u) << "a full reduction of 4M elements should split";
  const Shape big{1 << 22}, scalar{};
  auto in = *TensorView::contiguous(reinterpret_cast<void*>(256), DType::f32, big);
  auto out = *TensorView::contiguous(reinterpret_cast<void*>(1 << 30), DType::f32, scalar);
  std::array<TensorView, 1> ins{in}, outs{out};
  Status s = (*plan)->run(Stream::cuda(), Workspace{nullptr, 16}, OpArgs{ins, outs});
  EXPECT_EQ(s.kind(), ErrorKind::workspace_too_small) << s.to_string();
}

#ifdef BARACUDA_HAS_CUDA
/// The same reduction twice on the GPU gives the same bits (splits merged in order).
// Contiguous rows that fill the GPU take no split at run time, whatever the
// plan chose from the shapes: 8600 rows (8448 warps fill an H100) of 2052
// elements take a warp a row; 1100 rows (eight blocks an SM on 132 SMs) of
// 8195 elements and 1200 of 16389 a block of 256 a row, with rows starting
// off 16-byte alignment; over one outer dim (the rank-1 offsets) or two;
// exact small integers (sums exact in f32, and bf16 rounds them as the host
// does), outputs poisoned.
TEST(CudaReduce, UnsplitRowsMatchHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (const Shape& shape : {Shape{2, 4300, 2052}, Shape{1100, 8195}, Shape{3, 400, 16389}}) {
    const std::vector<double> x = small_ints(numel(shape), rng);
    for (DType dtype : {DType::f32, DType::bf16})
      for (const char* op : {"sum", "mean", "amax", "argmax"}) {
        const Attrs attrs{{"dims", double(1 << (shape.size() - 1))}};  // the last axis
        auto gpu = exec(Backend::bespoke_cuda, op, {{x, shape, dtype}}, attrs);
        auto host = exec(Backend::host_reference, op, {{x, shape, dtype}}, attrs);
        ASSERT_TRUE(gpu) << op << ": " << gpu.status().to_string();
        ASSERT_TRUE(host) << op << ": " << host.status().to_string();
        ASSERT_EQ((*gpu)[0].size(), (*host)[0].size());
        int64_t bad = 0;
        for (size_t i = 0; i < (*host)[0].size(); ++i) {
          const double a = (*gpu)[0][i], b = (*host)[0][i];
          bad += !(std::abs(a - b) <= 1e-6 * std::abs(b));  // NaN (unwritten) counts
        }
        EXPECT_EQ(bad, 0) << op << " " << dtype_name(dtype) << " " << shape_str(shape);
      }
  }
}

TEST(CudaReduce, BitwiseDeterministicRunToRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const char* op : {"sum", "var", "logsumexp", "norm"}) {
    for (Shape shape : {Shape{1 << 22}, Shape{64, 65536}, Shape{65536, 64}}) {
      for (double dims : {-1.0, 1.0}) {
        Attrs attrs{{"dims", dims}};
        auto desc = infer(op, {{DType::f32, shape}}, attrs);
        ASSERT_TRUE(desc);
        auto plan = select(Stream::cuda(), *desc);
        ASSERT_TRUE(plan) << plan.status().to_string();
        const int64_t n = desc->inputs[0].numel(), m = std::max<int64_t>(desc->outputs[0].numel(), 1);
        std::vector<float> host(n);
        std::mt19937 rng(7);
        std::uniform_real_distribution<float> u(-1, 1);
        for (auto& v : host) v = u(rng);
        void *x = nullptr, *y = nullptr, *ws = nullptr;
        ASSERT_EQ(cudaMalloc(&x, n * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&y, m * 4), cudaSuccess);
        ASSERT_EQ(cudaMalloc(&ws, std::max<size_t>((*plan)->workspace_size(), 1)), cudaSuccess);
        cudaMemcpy(x, host.data(), n * 4, cudaMemcpyHostToDevice);
        std::array<TensorView, 1> in{*TensorView::contiguous(x, DType::f32, shape)};
        std::array<TensorView, 1> out{*TensorView::contiguous(y, DType::f32, desc->outputs[0].shape)};
        std::vector<float> first(m), again(m);
        ASSERT_TRUE((*plan)->run(Stream::cuda(), Workspace{ws, (*plan)->workspace_size()}, OpArgs{in, out}));
        cudaMemcpy(first.data(), y, m * 4, cudaMemcpyDeviceToHost);
        for (int rep = 0; rep < 3; ++rep) {
          cudaMemset(y, 0xFF, m * 4);
          ASSERT_TRUE((*plan)->run(Stream::cuda(), Workspace{ws, (*plan)->workspace_size()}, OpArgs{in, out}));
          cudaMemcpy(again.data(), y, m * 4, cudaMemcpyDeviceToHost);
          EXPECT_EQ(std::memcmp(first.data(), again.data(), m * 4), 0) << op << " " << shape_str(shape);
        }
        cudaFree(x);
        cudaFree(y);
        cudaFree(ws);
      }
    }
  }
}
#endif

}  // namespace
