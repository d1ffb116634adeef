// GEMM family: every op x dtype x shape x layout x attribute set against the
// host reference in f64 on every candidate (cuBLASLt, CUTLASS and the bespoke
// kernel with a GPU); exact small-integer products written out here independently;
// gradients against finite differences of the forward; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "gemm/scaled_cutlass.hpp"
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
  // It takes fp8 only with b column-major, which no sweep layout gives: ScaledMm covers it.
  if (GetParam() == "scaled_mm") GTEST_SKIP() << "ScaledMm.* covers cuBLASLt's fp8 layouts";
  OpInfo floats = *find_op(GetParam());
  if (std::find(floats.backends.begin(), floats.backends.end(), Backend::cublaslt) == floats.backends.end())
    GTEST_SKIP() << "no cuBLASLt candidate (grouped_mm)";
  floats.dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
  sweep(floats, Backend::cublaslt);
}
TEST_P(Gemm, CutlassMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // CUTLASS's fp8 GEMM takes only a row-major a and a column-major b (K contiguous in both), which no sweep layout gives.
  if (GetParam() == "scaled_mm") GTEST_SKIP() << "ScaledMm.* and ScaledMmCutlass.* cover CUTLASS's fp8 layouts";
  OpInfo halves = *find_op(GetParam());
  if (std::find(halves.backends.begin(), halves.backends.end(), Backend::cutlass) == halves.backends.end())
    GTEST_SKIP() << "no CUTLASS candidate";
  PlanPreference pref;
  pref.backend = Backend::cutlass;
  const DType t = DType::bf16;
  if (!select(Stream::cuda(), OpDesc{"grouped_mm", {{t, {8, 8}}, {t, {1, 8, 8}}, {DType::i32, {1}}}, {}, {}}, pref))
    GTEST_SKIP() << "CUTLASS not built (headers, sm_90a) or not sm_90";
  halves.dtypes = {DType::f16, DType::bf16};  // CUTLASS's grouped GEMM dtypes
  sweep(halves, Backend::cutlass);
}
INSTANTIATE_TEST_SUITE_P(Ops, Gemm, testing::ValuesIn(ops_of(OpCategory::gemm)), param_name);

/// The current device's SM version (89 = sm_89), 0 without one.
int current_sm() {
#ifdef BARACUDA_HAS_CUDA
  int device = 0, major = 0, minor = 0;
  if (!cuda_available() || cudaGetDevice(&device) != cudaSuccess) return 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  return major * 10 + minor;
#else
  return 0;
#endif
}

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
  if (cuda_available()) {
    EXPECT_GT(lt_int8_runs, 0) << "cuBLASLt ran no int8 product";
  }
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
    return error_message(r);
  };
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

// ---------------------------------------------------------------- scaled_mm

/// Whether select takes scaled_mm's CUTLASS candidate (sm_90 and a build
/// with the CUTLASS headers for sm_90a).
bool cutlass_scaled_available() {
  if (!cuda_available()) return false;
  PlanPreference pref;
  pref.backend = Backend::cutlass;
  const DType e4 = DType::fp8_e4m3, f = DType::f32;
  return bool(select(Stream::cuda(),
                     OpDesc{"scaled_mm", {{e4, {16, 16}}, {e4, {16, 16}}, {f, {16, 1}}, {f, {1, 16}}, {DType::bf16, {0}}, {f, {0}}},
                            {}, {}},
                     pref));
}

/// Exact fp8 products: small integers (exact in e4m3 and e5m2), power-of-two
/// scales != 1 and an integer bias keep every sum exact in bf16, f16 and f32.
/// Every fp8 pair and output dtype, b column-major (cuBLASLt's layout) and
/// row-major; awkward sizes on the backends that take any size.
TEST(ScaledMm, ExactSmallIntegerProducts) {
  std::mt19937 rng(5);
  int lt_runs = 0;
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{32, 48, 32}, {37, 45, 19}}) {
    const std::vector<double> a = small_ints(M * K, rng), b = small_ints(K * N, rng), bias = small_ints(N, rng);
    const double scale_a = 0.5, scale_b = 0.25;
    for (Backend backend : backends()) {
      for (auto [ta, tb] : {std::pair{DType::fp8_e4m3, DType::fp8_e4m3}, {DType::fp8_e4m3, DType::fp8_e5m2},
                            {DType::fp8_e5m2, DType::fp8_e4m3}, {DType::fp8_e5m2, DType::fp8_e5m2}}) {
        for (DType out : {DType::bf16, DType::f16, DType::f32}) {
          for (bool with_bias : {false, true}) {
            for (bool b_col_major : {true, false}) {
              const DType bias_t = out == DType::f16 ? DType::f16 : DType::bf16;
              const std::vector<Operand> in = {{a, {M, K}, ta},
                                               {b, {K, N}, tb, b_col_major ? Shape{1, K} : Shape{}},
                                               {{scale_a}, {}, DType::f32},
                                               {{scale_b}, {1}, DType::f32},
                                               {with_bias ? bias : std::vector<double>{}, {with_bias ? N : 0}, bias_t},
                                               {{}, {0}, DType::f32}};
              auto r = exec(backend, "scaled_mm", in, {{"out_dtype", double(int(out))}});
              const std::string what = cat(backend_name(backend), " ", dtype_name(ta), " x ", dtype_name(tb), " -> ",
                                           dtype_name(out), with_bias ? " bias" : "", b_col_major ? " b col-major" : "");
              if (backend == Backend::cublaslt && (M % 16 || K % 16 || !b_col_major ||
                                                   (ta == DType::fp8_e5m2 && tb == DType::fp8_e5m2))) {
                ASSERT_FALSE(r) << what << ": cuBLASLt cannot take this";
                EXPECT_EQ(r.status().kind(), ErrorKind::unsupported) << what << ": " << r.status().to_string();
                continue;
              }
              if (!r && backend == Backend::cublaslt && r.status().kind() == ErrorKind::unsupported &&
                  current_sm() < 89) {
                continue;  // fp8 GEMMs need sm_89 or newer
              }
              ASSERT_TRUE(r) << what << ": " << r.status().to_string();
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) {
                  double want = 0;
                  for (int64_t k = 0; k < K; ++k) want += a[m * K + k] * b[k * N + n];
                  want = want * scale_a * scale_b + (with_bias ? bias[n] : 0);
                  ASSERT_EQ((*r)[0][m * N + n], want) << what << " at " << m << ", " << n;
                }
              if (backend == Backend::cublaslt) ++lt_runs;
            }
          }
        }
      }
    }
  }
  if (cuda_available() && current_sm() >= 89) {
    EXPECT_GT(lt_runs, 0) << "cuBLASLt ran no fp8 product";
  }
}

/// cuBLASLt's fp8 layout rules come back as errors naming the operand.
TEST(ScaledMm, CublasLtNamesTheOperandItCannotTake) {
  if (!cuda_available() || current_sm() < 89) GTEST_SKIP() << "no CUDA device with fp8 GEMMs";
  std::mt19937 rng(9);
  const int64_t M = 32, N = 32, K = 32;
  const std::vector<double> a = small_ints(M * K, rng), b = small_ints(K * N, rng);
  const Operand sa{{1}, {}, DType::f32}, sb{{1}, {}, DType::f32}, no_bias{{}, {0}, DType::bf16};
  const Operand no_scale{{}, {0}, DType::f32};
  auto message = [&](const Operand& oa, const Operand& ob) {
    auto r = exec(Backend::cublaslt, "scaled_mm", {oa, ob, sa, sb, no_bias, no_scale});
    return error_message(r);
  };
  const DType e4 = DType::fp8_e4m3, e5 = DType::fp8_e5m2;
  std::string m = message({a, {M, K}, e4}, {b, {K, N}, e4});  // b row-major
  EXPECT_NE(m.find("'b' with K contiguous"), std::string::npos) << m;
  m = message({a, {M, K}, e4, {1, M}}, {b, {K, N}, e4, {1, K}});  // a column-major
  EXPECT_NE(m.find("'a' with K contiguous"), std::string::npos) << m;
  m = message({a, {M, K}, e5}, {b, {K, N}, e5, {1, K}});
  EXPECT_NE(m.find("fp8_e5m2 x fp8_e5m2"), std::string::npos) << m;
  m = message({a, {M, K}, e4, {K + 8, 1}}, {b, {K, N}, e4, {1, K}});  // leading dim 40
  EXPECT_NE(m.find("leading dim of 'a'"), std::string::npos) << m;
}

TEST(ScaledMm, BadInputIsNamed) {
  auto message = [](std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer("scaled_mm", std::move(in), attrs);
    return error_message(r);
  };
  const DType e4 = DType::fp8_e4m3, f = DType::f32, bf = DType::bf16;
  const TensorSpec scale{f, {}}, no_bias{bf, {0}}, none{f, {0}};
  const Attrs fp8_out{{"out_dtype", double(int(e4))}};
  std::string m = message({{f, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'a' dtype f32 is not supported")) << m;
  m = message({{e4, {4, 8}}, {DType::f16, {8, 4}}, scale, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'b' dtype f16, expected fp8_e4m3 or fp8_e5m2")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, {f, {2}}, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'scale_a' must be [] or [1] (per tensor), [4, 1] (row-wise) or [4, 1] (block-wise, 1 x 128), "
                     "got [2]")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, {bf, {}}, no_bias, none});
  EXPECT_TRUE(has(m, "'scale_b' dtype bf16, expected f32")) << m;
  // Row-wise a with a per-tensor b (torch takes both row-wise), block-wise with the wrong block count.
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, {f, {4, 1}}, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'scale_b' must be [1, 4] for row-wise 'scale_a' [4, 1], got []")) << m;
  m = message({{e4, {4, 300}}, {e4, {300, 200}}, {f, {4, 3}}, {f, {3, 1}}, no_bias, none});
  EXPECT_TRUE(has(m, "'scale_b' must be [3, 2] for block-wise 'scale_a' [4, 3], got [3, 1]")) << m;
  m = message({{e4, {4, 300}}, {e4, {300, 200}}, {f, {4, 2}}, {f, {2, 2}}, no_bias, none});
  EXPECT_TRUE(has(m, "(block-wise, 1 x 128), got [4, 2]")) << m;
  m = message({{e4, {4, 8}}, {e4, {7, 4}}, scale, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'a' [4, 8] and 'b' [7, 4] cannot be multiplied (8 != 7)")) << m;
  m = message({{e4, {2, 4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none});
  EXPECT_TRUE(has(m, "'a' must be a matrix [M, K]")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, {bf, {3}}, none});
  EXPECT_TRUE(has(m, "'bias' must be [4] or [0]")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, {f, {4}}, none});
  EXPECT_TRUE(has(m, "'bias' dtype f32, expected bf16 or f16")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none}, {{"out_dtype", double(int(DType::i32))}});
  EXPECT_TRUE(has(m, "out dtype i32 is not supported (bf16, f16, f32, fp8_e4m3, fp8_e5m2)")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none}, {{"use_fast_accum", 2}});
  EXPECT_TRUE(has(m, "'use_fast_accum' must be 0 or 1")) << m;
  // scale_result: a scalar, and only over an fp8 output (cuBLASLt's D scale).
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, scale});
  EXPECT_TRUE(has(m, "'scale_result' scales an fp8 output only (cuBLASLt's D scale), but out is bf16")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, {f, {2}}}, fp8_out);
  EXPECT_TRUE(has(m, "'scale_result' must be a scalar ([] or [1]) or [0] (none), got [2]")) << m;
  m = message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, {DType::f16, {}}}, fp8_out);
  EXPECT_TRUE(has(m, "'scale_result' dtype f16, expected f32")) << m;
  EXPECT_EQ(message({{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, {DType::f16, {4}}, scale}, fp8_out), "(no error)");
  // The output's dtype stands for out_dtype when given.
  auto given = baracuda::infer("scaled_mm", {{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none});
  ASSERT_TRUE(given) << given.status().to_string();
  EXPECT_EQ(given->outputs[0].dtype, DType::bf16);
  OpDesc d{"scaled_mm", {{e4, {4, 8}}, {e4, {8, 4}}, scale, scale, no_bias, none}, {{DType::f16, {4, 4}}}, {}};
  auto f16_out = find_op("scaled_mm")->infer(d);
  ASSERT_TRUE(f16_out) << f16_out.status().to_string();
  EXPECT_EQ(f16_out->outputs[0].dtype, DType::f16);
}

/// Row-wise and block-wise scales: small integers times power-of-two scales
/// keep every sum exact in f32 (bf16 outputs: one rounding). K = 272 and 300 span three 128-blocks (the
/// last partial), N = 160 and 45 one or two; the first shape is cuBLASLt's
/// (row-wise only: block-wise runs on the bespoke kernel).
TEST(ScaledMm, ExactRowwiseAndBlockwiseScales) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> exponent(-2, 1);
  auto powers = [&](int64_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = std::ldexp(1.0, exponent(rng));
    return v;
  };
  int lt_runs = 0, cutlass_runs = 0;
  std::vector<Backend> candidates = backends();
  if (cutlass_scaled_available()) candidates.push_back(Backend::cutlass);
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{48, 160, 272}, {37, 45, 300}}) {
    const std::vector<double> a = small_ints(M * K, rng), b = small_ints(K * N, rng);
    const int64_t kb = (K + 127) / 128, nb = (N + 127) / 128;
    for (bool block : {false, true}) {
      const Shape sa_shape = block ? Shape{M, kb} : Shape{M, 1}, sb_shape = block ? Shape{kb, nb} : Shape{1, N};
      if (numel(sa_shape) == 1 && numel(sb_shape) == 1) continue;  // one block each: read as per-tensor (cuBLASLt)
      const std::vector<double> sa = powers(numel(sa_shape)), sb = powers(numel(sb_shape));
      auto scale_a = [&](int64_t m, int64_t k) { return block ? sa[m * kb + k / 128] : sa[m]; };
      auto scale_b = [&](int64_t k, int64_t n) { return block ? sb[(k / 128) * nb + n / 128] : sb[n]; };
      for (Backend backend : candidates) {
        for (bool b_col_major : {true, false}) {
          // bf16 out: torch's row-wise form, the one cuBLASLt surely takes; its sums round once.
          for (DType out : {DType::f32, DType::bf16}) {
            // scale_a column-major: cuBLASLt still sees a contiguous vector (row-wise), the others any strides.
            const std::vector<Operand> in = {{a, {M, K}, DType::fp8_e4m3},
                                             {b, {K, N}, DType::fp8_e4m3, b_col_major ? Shape{1, K} : Shape{}},
                                             {sa, sa_shape, DType::f32, Shape{1, M}},
                                             {sb, sb_shape, DType::f32},
                                             {{}, {0}, DType::bf16},
                                             {{}, {0}, DType::f32}};
            auto r = exec(backend, "scaled_mm", in, {{"out_dtype", double(int(out))}});
            const std::string what = cat(backend_name(backend), block ? " block-wise " : " row-wise ", M, "x", N, "x",
                                         K, b_col_major ? " b col-major -> " : " -> ", dtype_name(out));
            if (backend == Backend::cublaslt && (block || M % 16 || !b_col_major)) {
              ASSERT_FALSE(r) << what << ": cuBLASLt cannot take this";
              EXPECT_EQ(r.status().kind(), ErrorKind::unsupported) << what << ": " << r.status().to_string();
              continue;
            }
            if (!r && backend == Backend::cublaslt && r.status().kind() == ErrorKind::unsupported) {
              std::printf("%s: %s\n", what.c_str(), r.status().message().c_str());  // lt_runs below needs one to run
              continue;
            }
            // CUTLASS: TN only, K and N (of the output's 16 bytes) aligned; the second shape is neither.
            if (backend == Backend::cutlass && (!b_col_major || K % 16 || N % 8)) {
              ASSERT_FALSE(r) << what << ": CUTLASS cannot take this";
              EXPECT_EQ(r.status().kind(), ErrorKind::unsupported) << what << ": " << r.status().to_string();
              continue;
            }
            ASSERT_TRUE(r) << what << ": " << r.status().to_string();
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                double want = 0;
                for (int64_t k = 0; k < K; ++k) want += a[m * K + k] * scale_a(m, k) * b[k * N + n] * scale_b(k, n);
                char rounded[8];
                store_double(rounded, out, 0, want);
                ASSERT_EQ((*r)[0][m * N + n], load_double(rounded, out, 0)) << what << " at " << m << ", " << n;
              }
            if (backend == Backend::cublaslt) ++lt_runs;
            if (backend == Backend::cutlass) ++cutlass_runs;
          }
        }
      }
    }
  }
  if (cutlass_scaled_available()) {
    EXPECT_EQ(cutlass_runs, 4) << "CUTLASS ran both forms of the first shape to f32 and bf16";
  }
  // cuBLASLt 13.0 refuses outer-vector scales on H100 (INVALID_VALUE, a named unsupported); Blackwell takes them.
  if (cuda_available() && current_sm() >= 100) {
    EXPECT_GT(lt_runs, 0) << "cuBLASLt ran no row-wise fp8 product";
  }
}

/// fp8 outputs: out = scale_result * (sums + bias), saturated to the largest
/// finite value (+-448 e4m3, +-57344 e5m2) as cuBLASLt and torch do; NaN stays
/// NaN. The bias (16) adds before the scale: (16 + 16) * 0.5 = 16, not 16 * 0.5 + 16.
TEST(ScaledMm, Fp8OutputSaturatesAndKeepsNaN) {
  const int64_t M = 16, N = 16, K = 16;
  std::vector<double> a(M * K, 0), b(K * N, 8);
  for (int64_t k = 0; k < K; ++k) a[0 * K + k] = 8, a[1 * K + k] = -8, a[2 * K + k] = k == 0 ? NAN : 1, a[3 * K + k] = 0.125;
  int lt_runs = 0;
  for (DType out : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    const bool e4 = out == DType::fp8_e4m3;
    const double scale_result = e4 ? 0.5 : 64, top = e4 ? 448 : 57344;
    for (Backend backend : backends()) {
      for (bool with_bias : {false, true}) {
        const std::vector<Operand> in = {{a, {M, K}, DType::fp8_e4m3},
                                         {b, {K, N}, DType::fp8_e4m3, Shape{1, K}},
                                         {{1}, {}, DType::f32},
                                         {{1}, {1}, DType::f32},
                                         {with_bias ? std::vector<double>(N, 16) : std::vector<double>{}, {with_bias ? N : 0}, DType::bf16},
                                         {{scale_result}, {}, DType::f32}};
        auto r = exec(backend, "scaled_mm", in, {{"out_dtype", double(int(out))}});
        const std::string what = cat(backend_name(backend), " -> ", dtype_name(out), with_bias ? " bias" : "");
        // cuBLASLt 13.0 has no e4m3 x e4m3 -> e5m2 kernel on H100 (its heuristics find none: a named unsupported).
        if (!r && backend == Backend::cublaslt && r.status().kind() == ErrorKind::unsupported &&
            (current_sm() < 89 || out == DType::fp8_e5m2))
          continue;
        ASSERT_TRUE(r) << what << ": " << r.status().to_string();
        const double bias = with_bias ? 16 : 0;
        for (int64_t n = 0; n < N; ++n) {
          EXPECT_EQ((*r)[0][0 * N + n], top) << what << " (saturated) at " << n;
          EXPECT_EQ((*r)[0][1 * N + n], -top) << what << " (saturated) at " << n;
          EXPECT_TRUE(std::isnan((*r)[0][2 * N + n])) << what << " (NaN) at " << n << ": " << (*r)[0][2 * N + n];
          EXPECT_EQ((*r)[0][3 * N + n], (16 + bias) * scale_result) << what << " at " << n;
          EXPECT_EQ((*r)[0][4 * N + n], bias * scale_result) << what << " at " << n;
        }
        if (backend == Backend::cublaslt) ++lt_runs;
      }
    }
  }
  if (cuda_available() && current_sm() >= 89) {
    EXPECT_GT(lt_runs, 0) << "cuBLASLt ran no fp8-output product";
  }
}

/// How the CUTLASS candidate takes a problem's views, and what it refuses
/// with the operand named (host logic, no device).
TEST(ScaledMmCutlass, Fits) {
  alignas(16) static char buffer[64];
  const auto rowwise = gemm::CutlassScales::rowwise, blockwise = gemm::CutlassScales::blockwise;
  auto fits = [&](const gemm::Problem& p, gemm::CutlassScales form = gemm::CutlassScales::rowwise) {
    Status s = gemm::cutlass_scaled_fits(p, form);
    return s ? std::string("ok") : s.message();
  };
  gemm::Problem p;
  p.in_dtype = DType::fp8_e4m3, p.out_dtype = DType::bf16;
  p.m = 200, p.n = 264, p.k = 272;
  p.a.data = buffer, p.a.row_stride = 272, p.a.col_stride = 1;  // [M, K] row-major
  p.b.data = buffer, p.b.row_stride = 1, p.b.col_stride = 288;  // [K, N] column-major, leading dim 288
  p.d.data = buffer, p.d.row_stride = 264, p.d.col_stride = 1;  // [M, N] row-major
  p.scale_a = {buffer, 1, 0, 1};
  p.scale_b = {buffer, 1, 0, 1};
  EXPECT_EQ(fits(p), "ok");
  p.scale_a = {buffer, 1, 200, 1}, p.scale_b = {buffer, 1, 3, gemm::kScaleBlock};  // block-wise: any strides (repacked)
  EXPECT_EQ(fits(p, blockwise), "ok");
  p.scale_a = {buffer, 3, 1, 1};  // [M, 3] row-major: repacked, still fits
  EXPECT_EQ(fits(p, blockwise), "ok");
  EXPECT_TRUE(has(fits(p, rowwise), "row-wise scales must be contiguous")) << fits(p, rowwise);
  p.scale_a = {buffer, 1, 0, 1};
  gemm::Problem q = p;
  q.k = 264;  // not a multiple of 16
  EXPECT_TRUE(has(fits(q), "K (264) to be a multiple of 16")) << fits(q);
  q = p, q.k = 0;
  EXPECT_TRUE(has(fits(q), "K is 0")) << fits(q);
  q = p, q.b.row_stride = 264, q.b.col_stride = 1;  // b row-major
  EXPECT_TRUE(has(fits(q), "'b' column-major [K, N]")) << fits(q);
  q = p, q.a.row_stride = 1, q.a.col_stride = 200;  // a column-major
  EXPECT_TRUE(has(fits(q), "'a' row-major [M, K]")) << fits(q);
  q = p, q.a.row_stride = 280;  // 280 bytes: not 16-byte rows
  EXPECT_TRUE(has(fits(q), "leading dim of 'a' (280 elements)")) << fits(q);
  q = p, q.a.data = buffer + 8;
  EXPECT_TRUE(has(fits(q), "'a' 16-byte aligned")) << fits(q);
  q = p, q.n = 260, q.d.row_stride = 264;  // 520 bytes of bf16: not whole 16-byte vectors
  EXPECT_TRUE(has(fits(q), "N (260) to be a multiple of 8 for a bf16 'out'")) << fits(q);
  q.out_dtype = DType::f32, q.d.row_stride = 260;  // f32 takes N % 4
  EXPECT_EQ(fits(q), "ok");
  q = p, q.d.row_stride = 1, q.d.col_stride = 200;  // column-major out
  EXPECT_TRUE(has(fits(q), "'out' row-major [M, N]")) << fits(q);
  q = p, q.bias.data = buffer, q.bias.col_stride = 2;
  EXPECT_TRUE(has(fits(q), "contiguous 'bias'")) << fits(q);
  q = p, q.m = 1, q.a.row_stride = 7;  // one row: its leading dim is never used
  EXPECT_EQ(fits(q), "ok");
  EXPECT_EQ(gemm::cutlass_leading_dim(7, 1, 40), 48);
  EXPECT_EQ(gemm::cutlass_leading_dim(64, 2, 40), 64);
}

/// The CUTLASS candidate, forced, for both scale forms at sizes that are
/// not tile multiples (M, N; K = 128 k + 16), every output dtype, with and
/// without a bias, scale_a M- or K-major: small integers and power-of-two
/// scales keep every sum exact in f32 (one rounding to the output), so the
/// host reference in f64 must match exactly. Then random fp8 values against
/// the f64 reference within the fp8 GEMM's f32-accumulation tolerance.
TEST(ScaledMmCutlass, AwkwardSizesMatchReference) {
  if (!cutlass_scaled_available()) GTEST_SKIP() << "no CUTLASS fp8 kernel (needs sm_90 and the CUTLASS headers)";
  std::mt19937 rng(13);
  std::uniform_int_distribution<int> exponent(-2, 1);
  auto powers = [&](int64_t n) {
    std::vector<double> v(n);
    for (double& x : v) x = std::ldexp(1.0, exponent(rng));
    return v;
  };
  const DType e4 = DType::fp8_e4m3;
  for (bool block : {false, true}) {
    // The sku names the CUTLASS kernel of the form.
    PlanPreference pref;
    pref.backend = Backend::cutlass;
    const Shape sa0 = block ? Shape{64, 3} : Shape{64, 1}, sb0 = block ? Shape{3, 2} : Shape{1, 136};
    auto plan = select(Stream::cuda(),
                       OpDesc{"scaled_mm", {{e4, {64, 272}}, {e4, {272, 136}}, {DType::f32, sa0}, {DType::f32, sb0},
                                            {DType::bf16, {0}}, {DType::f32, {0}}}, {}, {}},
                       pref);
    ASSERT_TRUE(plan) << plan.status().to_string();
    EXPECT_NE(std::string((*plan)->sku().kernel).find(block ? "cutlass_sm90_fp8_blockwise" : "cutlass_sm90_fp8_rowwise"),
              std::string::npos)
        << (*plan)->sku().to_string();
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{200, 264, 272}, {37, 136, 144}, {1, 128, 16}, {130, 8, 400}}) {
      const int64_t kb = (K + 127) / 128, nb = (N + 127) / 128;
      const std::vector<double> a = small_ints(M * K, rng), b = small_ints(K * N, rng), bias = small_ints(N, rng);
      const Shape sa_shape = block ? Shape{M, kb} : Shape{M, 1}, sb_shape = block ? Shape{kb, nb} : Shape{1, N};
      if (numel(sa_shape) == 1 && numel(sb_shape) == 1) continue;  // one block each: read as per-tensor (cuBLASLt)
      const std::vector<double> sa = powers(numel(sa_shape)), sb = powers(numel(sb_shape));
      auto scale_a = [&](int64_t m, int64_t k) { return block ? sa[m * kb + k / 128] : sa[m]; };
      auto scale_b = [&](int64_t k, int64_t n) { return block ? sb[(k / 128) * nb + n / 128] : sb[n]; };
      std::vector<double> exact(M * N, 0);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t k = 0; k < K; ++k) exact[m * N + n] += a[m * K + k] * scale_a(m, k) * b[k * N + n] * scale_b(k, n);
      for (DType out : {DType::bf16, DType::f16, DType::f32}) {
        for (bool with_bias : {false, true}) {
          for (bool sa_m_major : {false, true}) {
            const DType bias_t = out == DType::f16 ? DType::f16 : DType::bf16;
            const std::vector<Operand> in = {{a, {M, K}, e4},
                                             {b, {K, N}, e4, Shape{1, K}},
                                             {sa, sa_shape, DType::f32, sa_m_major ? Shape{1, M} : Shape{}},
                                             {sb, sb_shape, DType::f32},
                                             {with_bias ? bias : std::vector<double>{}, {with_bias ? N : 0}, bias_t},
                                             {{}, {0}, DType::f32}};
            auto r = exec(Backend::cutlass, "scaled_mm", in, {{"out_dtype", double(int(out))}});
            const std::string what = cat(block ? "block-wise " : "row-wise ", M, "x", N, "x", K, " -> ", dtype_name(out),
                                         with_bias ? " bias" : "", sa_m_major ? " scale_a M-major" : "");
            ASSERT_TRUE(r) << what << ": " << r.status().to_string();
            for (int64_t m = 0; m < M; ++m)
              for (int64_t n = 0; n < N; ++n) {
                char rounded[8];
                store_double(rounded, out, 0, exact[m * N + n] + (with_bias ? bias[n] : 0));
                ASSERT_EQ((*r)[0][m * N + n], load_double(rounded, out, 0)) << what << " at " << m << ", " << n;
              }
          }
        }
      }
    }
  }
  // Random e4m3 values, scales in [0.5, 1.5], f32 out: the fp8 tensor cores add
  // in less than f32 precision between CUTLASS's f32 promotions.
  const int64_t M = 130, N = 200, K = 1040, kb = (K + 127) / 128, nb = (N + 127) / 128;
  std::uniform_real_distribution<double> value(-2, 2), factor(0.5, 1.5);
  auto fp8_values = [&](int64_t n) {
    std::vector<double> v(n);
    char buf[8];
    for (double& x : v) store_double(buf, e4, 0, value(rng)), x = load_double(buf, e4, 0);
    return v;
  };
  const std::vector<double> a = fp8_values(M * K), b = fp8_values(K * N);
  for (bool block : {false, true}) {
    const Shape sa_shape = block ? Shape{M, kb} : Shape{M, 1}, sb_shape = block ? Shape{kb, nb} : Shape{1, N};
    std::vector<double> sa(numel(sa_shape)), sb(numel(sb_shape));
    for (double& x : sa) x = float(factor(rng));
    for (double& x : sb) x = float(factor(rng));
    auto scale_a = [&](int64_t m, int64_t k) { return block ? sa[m * kb + k / 128] : sa[m]; };
    auto scale_b = [&](int64_t k, int64_t n) { return block ? sb[(k / 128) * nb + n / 128] : sb[n]; };
    const std::vector<Operand> in = {{a, {M, K}, e4},        {b, {K, N}, e4, Shape{1, K}}, {sa, sa_shape, DType::f32},
                                     {sb, sb_shape, DType::f32}, {{}, {0}, DType::bf16},       {{}, {0}, DType::f32}};
    auto r = exec(Backend::cutlass, "scaled_mm", in, {{"out_dtype", double(int(DType::f32))}});
    ASSERT_TRUE(r) << r.status().to_string();
    std::vector<double> want(M * N, 0);
    double top = 0;
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n) {
        double& w = want[m * N + n];
        for (int64_t k = 0; k < K; ++k) w += a[m * K + k] * scale_a(m, k) * b[k * N + n] * scale_b(k, n);
        top = std::max(top, std::abs(w));
      }
    for (int64_t i = 0; i < M * N; ++i)
      ASSERT_NEAR((*r)[0][i], want[i], 1e-3 * top) << (block ? "block-wise" : "row-wise") << " random at " << i;
  }
}

// ---------------------------------------------------------------- cuBLASLt plans

/// workspace_size() is what the chosen algorithms need: never more than the
/// preference allows, and a plan allowed none still runs.
TEST(GemmWorkspace, IsWhatTheAlgorithmNeeds) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  OpDesc d{"mm", {{DType::bf16, {1024, 1024}}, {DType::bf16, {1024, 1024}}}, {}, {}};
  PlanPreference pref;
  pref.backend = Backend::cublaslt;
  auto plan = select(Stream::cuda(), d, pref);
  ASSERT_TRUE(plan) << plan.status().to_string();
  EXPECT_LE((*plan)->workspace_size(), size_t(32) << 20);
  pref.max_workspace_bytes = 0;
  auto none = select(Stream::cuda(), d, pref);
  ASSERT_TRUE(none) << none.status().to_string();
  EXPECT_EQ((*none)->workspace_size(), 0u);
  std::mt19937 rng(13);
  const std::vector<double> a = small_ints(96 * 64, rng), b = small_ints(64 * 80, rng);
  auto host = exec(Backend::host_reference, "mm", {{a, {96, 64}, DType::bf16}, {b, {64, 80}, DType::bf16}});
  auto lt = exec(Backend::cublaslt, "mm", {{a, {96, 64}, DType::bf16}, {b, {64, 80}, DType::bf16}}, {}, pref);
  ASSERT_TRUE(host && lt) << (lt ? host.status() : lt.status()).to_string();
  EXPECT_EQ((*host)[0], (*lt)[0]);
}

/// linear_backward's grad_bias: fused into the grad_weight GEMM by cuBLASLt
/// (sku().epilogue = bias_grad) where its heuristics offer it, the reduction
/// elsewhere (the bespoke and host plans, views split into several GEMMs);
/// exact small-integer values either way.
TEST(GemmBiasGrad, FusedAndReducedAgree) {
  std::mt19937 rng(17);
  const int64_t B = 3, S = 16, N = 32, K = 48;
  const std::vector<double> g = small_ints(B * S * N, rng), x = small_ints(B * S * K, rng), w = small_ints(N * K, rng);
  for (DType t : {DType::bf16, DType::f16, DType::f32}) {
    const std::vector<Operand> contiguous = {{g, {B, S, N}, t}, {x, {B, S, K}, t}, {w, {N, K}, t}};
    // x with its batch dim outermost in memory but S and K swapped: the
    // grad_weight GEMM is one call per batch (a reduction loop).
    const std::vector<Operand> looped = {{g, {B, S, N}, t}, {x, {B, S, K}, t, {S * K, 1, S}}, {w, {N, K}, t}};
    auto want = exec(Backend::host_reference, "linear_backward", contiguous);
    ASSERT_TRUE(want) << want.status().to_string();
    for (Backend backend : backends()) {
      OpDesc d{"linear_backward", {{t, {B, S, N}}, {t, {B, S, K}}, {t, {N, K}}}, {}, {}};
      PlanPreference pref;
      pref.backend = backend;
      auto plan = select(backend == Backend::host_reference ? Stream::host() : Stream::cuda(), d, pref);
      ASSERT_TRUE(plan) << plan.status().to_string();
      const Epilogue epilogue = (*plan)->sku().epilogue;
      if (backend != Backend::cublaslt) {
        EXPECT_EQ(epilogue, Epilogue::none) << backend_name(backend);
      } else if (t != DType::f32) {
        EXPECT_EQ(epilogue, Epilogue::bias_grad) << dtype_name(t) << ": cuBLASLt offered no bias-gradient epilogue";
      }
      for (const auto* in : {&contiguous, &looped}) {
        auto r = exec(backend, "linear_backward", *in);
        ASSERT_TRUE(r) << backend_name(backend) << " " << dtype_name(t) << ": " << r.status().to_string();
        for (int j = 0; j < 3; ++j)
          EXPECT_EQ((*r)[j], (*want)[j]) << backend_name(backend) << " " << dtype_name(t) << " output " << j
                                         << (in == &looped ? " (looped)" : "");
      }
    }
  }
}

/// The fused bias gradient is bitwise reproducible: two runs of a product
/// large enough for many tiles along K give the same bits.
TEST(GemmBiasGrad, FusedIsDeterministic) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(19);
  std::uniform_real_distribution<double> unit(-1, 1);
  const int64_t M = 4096, N = 512, K = 256;
  std::vector<double> g(M * N), x(M * K), w(N * K);
  for (auto* v : {&g, &x, &w})
    for (double& e : *v) e = unit(rng);
  const std::vector<Operand> in = {{g, {M, N}, DType::bf16}, {x, {M, K}, DType::bf16}, {w, {N, K}, DType::bf16}};
  auto first = exec(Backend::cublaslt, "linear_backward", in);
  auto second = exec(Backend::cublaslt, "linear_backward", in);
  ASSERT_TRUE(first && second) << (first ? second.status() : first.status()).to_string();
  for (int j = 0; j < 3; ++j) EXPECT_EQ((*first)[j], (*second)[j]) << "output " << j;
}

}  // namespace
