// GEMM family: every op x dtype x shape x layout x attribute set against the
// host reference in f64 on every candidate (cuBLASLt and the bespoke kernel
// with a GPU); exact small-integer products written out here independently;
// gradients against finite differences of the forward; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "harness.hpp"
#include "exec.hpp"
#include "sweep.hpp"

#ifdef BARACUDA_HAS_CUDA
#include <cuda_runtime_api.h>
#endif

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

class Gemm : public testing::TestWithParam<std::string> {};
TEST_P(Gemm, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Gemm, BespokeCudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
TEST_P(Gemm, CublasLtMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // cuBLASLt serves int8 only in some shapes and layouts (GemmExact covers
  // it; select falls through to the bespoke kernel otherwise), i32/i64 never.
  OpInfo floats = *find_op(GetParam());
  if (std::find(floats.backends.begin(), floats.backends.end(), Backend::cublaslt) == floats.backends.end())
    GTEST_SKIP() << "no cuBLASLt candidate (grouped_mm)";
  floats.dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
  sweep(floats, Backend::cublaslt);
}
INSTANTIATE_TEST_SUITE_P(Ops, Gemm, testing::ValuesIn(ops_of(OpCategory::gemm)), param_name);

std::vector<Backend> backends() {
  std::vector<Backend> b{Backend::host_reference};
  if (cuda_available()) b.push_back(Backend::bespoke_cuda), b.push_back(Backend::cublaslt);
  return b;
}

/// Exact products of small integers: every dtype, operands row-major and
/// column-major (transposed views), against a triple loop written here.
TEST(GemmExact, SmallIntegerProducts) {
  std::mt19937 rng(7);
  int lt_int8_runs = 0;
  // |sums| <= 64: exact even in bf16; the second shape is cuBLASLt's int8 kind.
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{37, 45, 16}, {64, 32, 16}}) {
    const std::vector<double> a = small_ints(M * K, rng), b = small_ints(K * N, rng);
    std::vector<double> want(M * N, 0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) want[m * N + n] += a[m * K + k] * b[k * N + n];
    for (Backend backend : backends()) {
      for (DType t : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i32, DType::i64}) {
        for (bool col_major : {false, true}) {
          const Shape sa = col_major ? Shape{1, M} : Shape{}, sb = col_major ? Shape{1, K} : Shape{};
          auto r = exec(backend, "mm", {{a, {M, K}, t, sa}, {b, {K, N}, t, sb}});
          const std::string what = cat(backend_name(backend), " ", dtype_name(t), col_major ? " column-major" : "");
          if (!r && r.status().kind() == ErrorKind::unsupported && backend == Backend::cublaslt && t != DType::f32 &&
              t != DType::f16 && t != DType::bf16 && t != DType::f64) {
            continue;  // cuBLASLt takes int8 only in some layouts, i32/i64 never: the bespoke kernel serves them
          }
          ASSERT_TRUE(r) << what << ": " << r.status().to_string();
          EXPECT_EQ((*r)[0], want) << what;
          if (backend == Backend::cublaslt && t == DType::i8) ++lt_int8_runs;
        }
      }
    }
  }
  if (cuda_available()) EXPECT_GT(lt_int8_runs, 0) << "cuBLASLt ran no int8 product";
}

/// K = 0: the product is empty, out = beta * input (+ bias) as torch.
TEST(GemmExact, EmptyContraction) {
  for (Backend backend : backends()) {
    auto mm = exec(backend, "mm", {{{}, {3, 0}, DType::f32}, {{}, {0, 4}, DType::f32}});
    ASSERT_TRUE(mm) << mm.status().to_string();
    EXPECT_EQ((*mm)[0], std::vector<double>(12, 0.0)) << backend_name(backend);
    auto addmm = exec(backend, "addmm", {{{1, 2, 3, 4}, {4}, DType::f32}, {{}, {3, 0}, DType::f32}, {{}, {0, 4}, DType::f32}},
                      {{"beta", 2}});
    ASSERT_TRUE(addmm) << addmm.status().to_string();
    for (int i = 0; i < 12; ++i) EXPECT_EQ((*addmm)[0][i], 2.0 * (i % 4 + 1)) << backend_name(backend);
  }
}

/// beta = 0 does not read input: NaN there does not reach out (torch's addmm).
TEST(GemmExact, BetaZeroIgnoresInput) {
  for (Backend backend : backends()) {
    auto r = exec(backend, "addmm", {{{NAN, NAN}, {2}, DType::f32}, {{1, 2}, {1, 2}, DType::f32},
                                     {{1, 0, 0, 1}, {2, 2}, DType::f32}},
                  {{"beta", 0}});
    ASSERT_TRUE(r) << r.status().to_string();
    EXPECT_EQ((*r)[0], (std::vector<double>{1, 2})) << backend_name(backend);
  }
}

/// L = sum(g * f(a, b)) is linear in each operand, so central differences
/// with step 1 are exact in f64: the gradients of matmul (broadcast batch
/// dims and vectors included) and linear must equal them.
TEST(GemmGradients, MatchFiniteDifferences) {
  std::mt19937 rng(11);
  struct Case {
    std::string op;
    std::vector<Shape> shapes;  // forward inputs
    Attrs attrs;
  };
  const std::vector<Case> cases = {
      {"matmul", {{3, 4}, {4, 5}}, {}},       {"matmul", {{2, 3, 4}, {4, 5}}, {}},
      {"matmul", {{4}, {2, 4, 3}}, {}},       {"matmul", {{2, 1, 3, 4}, {5, 4, 2}}, {{"alpha", 0.5}}},
      {"matmul", {{4}, {4}}, {}},             {"matmul", {{3, 4}, {4}}, {}},
      {"linear", {{2, 3, 4}, {5, 4}}, {}},    {"linear", {{4}, {5, 4}}, {}},
  };
  for (const Case& c : cases) {
    std::vector<Operand> fwd;
    for (const Shape& s : c.shapes) fwd.push_back({small_ints(numel(s), rng, -3, 3), s});
    if (c.op == "linear") fwd.push_back({{}, {0}});  // no bias
    const Attrs fwd_attrs;  // alpha scales the gradients only
    auto y = exec(Backend::host_reference, c.op, fwd, fwd_attrs);
    ASSERT_TRUE(y) << y.status().to_string();
    const std::vector<double> g = small_ints(int64_t((*y)[0].size()), rng, -3, 3);
    auto loss = [&](const std::vector<Operand>& ops) {
      auto out = exec(Backend::host_reference, c.op, ops, fwd_attrs);
      double l = 0;
      for (size_t i = 0; i < g.size(); ++i) l += g[i] * (*out)[0][i];
      return l * c.attrs.get("alpha", 1);
    };
    Shape y_shape;
    {
      std::vector<TensorSpec> specs{{DType::f64, c.shapes[0]}, {DType::f64, c.shapes[1]}};
      if (c.op == "linear") specs.push_back({DType::f64, {0}});
      y_shape = check(infer(c.op, specs)).outputs[0].shape;
    }
    std::vector<Operand> bwd{{g, y_shape}, fwd[0], fwd[1]};
    Attrs bwd_attrs = c.attrs;
    if (c.op == "linear") bwd_attrs.set("bias", 0);
    auto grads = exec(Backend::host_reference, c.op + "_backward", bwd, bwd_attrs);
    ASSERT_TRUE(grads) << grads.status().to_string();
    for (int operand = 0; operand < 2; ++operand) {
      for (size_t i = 0; i < fwd[operand].values.size(); ++i) {
        std::vector<Operand> plus = fwd, minus = fwd;
        plus[operand].values[i] += 1;
        minus[operand].values[i] -= 1;
        EXPECT_DOUBLE_EQ((*grads)[operand][i], (loss(plus) - loss(minus)) / 2)
            << c.op << " " << shape_str(c.shapes[0]) << " @ " << shape_str(c.shapes[1]) << " operand " << operand << " element " << i;
      }
    }
  }
  // linear's bias gradient: the sum of grad_output over every dim but the last.
  auto lb = exec(Backend::host_reference, "linear_backward",
                 {{{1, 2, 3, 4, 5, 6}, {3, 2}}, {{1, 1, 1, 1, 1, 1}, {3, 2}}, {{1, 1, 1, 1}, {2, 2}}});
  ASSERT_TRUE(lb) << lb.status().to_string();
  EXPECT_EQ((*lb)[2], (std::vector<double>{9, 12}));
}

/// The candidates agree with each other on awkward views: negative strides
/// and broadcast operands run on the bespoke kernel; cuBLASLt either runs
/// them or says, in can_implement, which stride it cannot take.
TEST(GemmLayouts, CublasLtNamesTheStrideItCannotTake) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(3);
  const std::vector<double> a = small_ints(6 * 5, rng), b = small_ints(5 * 4, rng);
  const Operand reversed{a, {6, 5}, DType::f32, {-5, 1}}, plain_b{b, {5, 4}, DType::f32, {}};
  auto host = exec(Backend::host_reference, "mm", {reversed, plain_b});
  auto bespoke = exec(Backend::bespoke_cuda, "mm", {reversed, plain_b});
  ASSERT_TRUE(host && bespoke);
  EXPECT_EQ((*host)[0], (*bespoke)[0]);
  auto lt = exec(Backend::cublaslt, "mm", {reversed, plain_b});
  ASSERT_FALSE(lt);
  EXPECT_EQ(lt.status().kind(), ErrorKind::unsupported);
  EXPECT_NE(lt.status().message().find("A strides [-5, 1]"), std::string::npos) << lt.status().message();
}

TEST(GemmPrecision, Tf32OnlyWhenAllowed) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  OpDesc d{"mm", {{DType::f32, {64, 64}}, {DType::f32, {64, 64}}}, {}, {}};
  PlanPreference pref;
  pref.backend = Backend::cublaslt;
  auto strict = select(Stream::cuda(), d, pref);
  ASSERT_TRUE(strict) << strict.status().to_string();
  EXPECT_EQ((*strict)->precision_guarantee().math, MathPrecision::f32);
  pref.allow_tf32 = true;
  auto fast = select(Stream::cuda(), d, pref);
  ASSERT_TRUE(fast) << fast.status().to_string();
  EXPECT_EQ((*fast)->precision_guarantee().math, MathPrecision::tf32);
}

TEST(GemmErrors, BadInputIsNamed) {
  auto message = [](const std::string& op, std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer(op, std::move(in), attrs);
    return r ? std::string("(no error)") : r.status().message();
  };
  auto has = [](const std::string& m, const std::string& part) { return m.find(part) != std::string::npos; };
  const DType f = DType::f32;
  std::string m = message("mm", {{f, {2, 3}}, {f, {4, 5}}});
  EXPECT_TRUE(has(m, "'a' [2, 3] and 'b' [4, 5] cannot be multiplied (3 != 4)")) << m;
  m = message("mm", {{f, {2, 3, 4}}, {f, {4, 5}}});
  EXPECT_TRUE(has(m, "'a' must be a matrix (rank 2), got shape [2, 3, 4]")) << m;
  m = message("bmm", {{f, {2, 3, 4}}, {f, {3, 4, 5}}});
  EXPECT_TRUE(has(m, "batch sizes differ")) << m;
  m = message("matmul", {{f, {2, 3, 4}}, {f, {5, 4, 2}}});
  EXPECT_TRUE(has(m, "broadcast")) << m;
  m = message("matmul", {{f, {}}, {f, {4}}});
  EXPECT_TRUE(has(m, "at least a vector")) << m;
  m = message("mm", {{f, {2, 3}}, {DType::f16, {3, 5}}});
  EXPECT_TRUE(has(m, "'b' dtype f16, expected f32")) << m;
  m = message("linear", {{f, {2, 3}}, {f, {4, 3}}, {f, {3}}});
  EXPECT_TRUE(has(m, "'bias' must be [4] or [0]")) << m;
  m = message("linear", {{f, {2, 3}}, {f, {4, 2}}, {f, {4}}});
  EXPECT_TRUE(has(m, "'weight' must be [N, 3]")) << m;
  m = message("linear", {{f, {2, 3}}, {f, {4, 3}}, {f, {4}}}, {{"activation", 9}});
  EXPECT_TRUE(has(m, "'activation' must be")) << m;
  m = message("addmm", {{f, {3, 3}}, {f, {2, 3}}, {f, {3, 5}}});
  EXPECT_TRUE(has(m, "'input' [3, 3] does not broadcast to the product's shape [2, 5]")) << m;
  m = message("mm", {{DType::u8, {2, 3}}, {DType::u8, {3, 5}}});
  EXPECT_TRUE(has(m, "dtype u8 is not supported")) << m;
  m = message("addmm", {{DType::i32, {5}}, {DType::i8, {2, 3}}, {DType::i8, {3, 5}}}, {{"alpha", 0.5}});
  EXPECT_TRUE(has(m, "alpha and beta must be integers")) << m;
  m = message("matmul_backward", {{f, {2, 4}}, {f, {2, 3}}, {f, {3, 5}}});
  EXPECT_TRUE(has(m, "'grad_output' shape [2, 4], expected the product's [2, 5]")) << m;

  // Writing a product over its operand is refused, not raced.
  std::vector<float> buf(16, 1.0f);
  TensorView a = *TensorView::contiguous(buf.data(), f, std::vector<int64_t>{4, 4});
  OpDesc d{"mm", {{f, {4, 4}}, {f, {4, 4}}}, {}, {}};
  auto plan = select(Stream::host(), d);
  ASSERT_TRUE(plan);
  const TensorView ins[2] = {a, a};
  Status s = (*plan)->can_implement(OpArgs{ins, std::span(&a, 1)});
  EXPECT_FALSE(s);
  EXPECT_TRUE(has(s.message(), "output 'out' overlaps input 'a'")) << s.message();
}

}  // namespace
