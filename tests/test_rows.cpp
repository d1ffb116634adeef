// Row families (softmax, norm): every op x dtype x dim x shape x layout
// against the host reference in f64, backward against finite differences of
// the forward on the host, closed forms, and bad input; gumbel_softmax's
// noise against Philox written out here, its sample statistics, and the
// same sample on every backend and layout.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "gradcheck.hpp"
#include "harness.hpp"
#include "sweep.hpp"

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

BARACUDA_SWEEP_SUITE(Softmax, ops_of(OpCategory::softmax));

BARACUDA_SWEEP_SUITE(Norm, ops_of(OpCategory::norm));

/// Runs each op of `names` on the CUDA backend over `shapes`, in `dtypes`
/// (empty: every dtype of the op) and every layout (quick runs: `quick_layout`
/// and contiguous), against the host reference; returns the cases run.
int cuda_cases(std::initializer_list<const char*> names, const std::vector<DType>& dtypes,
               const std::vector<Shape>& shapes, LayoutKind quick_layout) {
  int ran = 0;
  for (const char* name : names) {
    const OpInfo& op = *find_op(name);
    for (DType dtype : dtypes.empty() ? op.dtypes : dtypes)
      for (const Shape& shape : shapes)
        for (LayoutKind layout : kAllLayouts) {
          if (quick() && layout != LayoutKind::contiguous && layout != quick_layout) continue;
          CaseSpec spec{&op, dtype, shape, op.sample_attrs.front(), layout};
          RunOptions opt;
          opt.backend = Backend::bespoke_cuda;
          const CaseOutcome r = run_case(spec, opt);
          if (r.skipped) continue;
          ++ran;
          EXPECT_TRUE(r.passed) << spec.to_string() << ": " << r.message;
          EXPECT_FALSE(r.reference_all_zero) << spec.to_string();
        }
  }
  return ran;
}

// Rows of 1024 elements to 1024 vectors take the one-pass backward (Note
// [Fused norm backward]): every block width (128 to 1024 threads), rows that
// are not whole vectors (element loads), many rows a split, a rank-2 outer
// shape, and the sweep's layouts (strided, transposed, in place, poisoned
// outputs). Rows up to 8 x 1024 vectors take it over a cluster (Note [Norm
// backward over a cluster]): 2 to 8 ranks, a last rank part empty, rows of
// element loads (20001), and 10 to 28 rows a split (600 x 12000: the
// exchange's four slots go round and their barriers change parity); the
// longer rows take the column pass (split partials merged). Half rows of
// 257 to 512 vectors (the 512-thread block): one vector past 256 (2056), a
// last thread's vector past the row (3000), whole (4096, many rows a
// split), and element loads (4090).
TEST(NormCuda, OnePassBackwardAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{5, 1024},   {300, 1030}, {700, 2048}, {3, 2, 4096}, {2, 8192},  {1500, 1536},
                                  {1, 1100},   {37, 16384}, {9, 20001},  {4, 65536},   {600, 12000}, {5, 2056},
                                  {300, 3000}, {1000, 4096}, {9, 4090}};
  const int ran = cuda_cases({"layer_norm_backward", "rms_norm_backward"}, {}, shapes, LayoutKind::strided);
  EXPECT_GT(ran, 50);
}

// Narrow rows: the forward held by 1 to 32 lanes of a warp (Note [Norm rows
// in registers]), the backward with parameters in one pass, 1 to 64 threads
// a row, several rows a block (Note [Narrow norm backward rows]): every lane
// count, a block's last groups past the end (130 and 129 rows), a thread's
// last vector past the row (24, 40, 200), many rows a group (20000 x 8),
// rows not in whole vectors (100 half, 20: the two-pass backward), a rank-2
// outer shape, and the sweep's layouts (strided and transposed rows keep the
// other kernels). f64 keeps the two passes.
TEST(NormCuda, NarrowRowsAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{130, 4},  {130, 8},   {129, 16},   {37, 24},  {33, 40},  {70, 64},
                                  {9, 100},  {17, 128},  {11, 200},   {7, 256},  {5, 512},  {3, 20},
                                  {20000, 8}, {3, 50, 64}, {2, 1000}};
  const int ran = cuda_cases({"layer_norm", "rms_norm", "layer_norm_backward", "rms_norm_backward"}, {}, shapes,
                             LayoutKind::strided);
  EXPECT_GT(ran, quick() ? 200 : 400);
}

// Long layer_norm / rms_norm forward rows in whole vectors take the cluster
// kernel on sm_90 (src/norm/cluster_forward.cuh): 2 to 16 ranks, both
// vector counts a thread (262144 f32: eight vectors at 16 ranks; none past
// that here), ragged last ranks, rank-2 outer shapes, with and without the
// affine parameters, statistics checked; other layouts keep the rows kernel.
TEST(NormCuda, ClusterForwardAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{3, 16388}, {5, 32768}, {2, 40000}, {2, 3, 20000}, {4, 65540}, {1, 262144}};
  const int ran = cuda_cases({"layer_norm", "rms_norm", "layer_norm_noaffine", "rms_norm_noaffine"},
                             {DType::f32, DType::bf16, DType::f16}, shapes, LayoutKind::inplace);
  EXPECT_GT(ran, quick() ? 100 : 150);  // quick runs: two layouts of five
}

// Forward rows of up to 16384 elements in whole vectors are held in
// registers (Note [Norm rows in registers]): every block shape (a warp a row
// with four rows a block and a last block part empty, then 128 to 1024
// threads a row), rows a thread's last vectors miss (100, 1000, 1032, 3000,
// 5120, 12296), rows not in whole vectors (1030 f32, 1028 half: the rows
// kernel), 16384 (half held, f32 on the cluster kernel) and just past it,
// rank-2 outer shapes, with and without the affine parameters, the residual
// form (a warp a row, or the fewest whole warps: 64 to 1024 threads of
// four vectors each of two operands, 160 and 320 among them), statistics checked; strided rows
// keep the rows kernel; in place rows (the output over the input) are held.
TEST(NormCuda, HeldForwardAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{5, 64},    {9, 100},   {7, 512},     {3, 1000},  {3, 1028},  {7, 1032},
                                  {5, 2048},  {4, 2052},  {33, 3000},   {2, 3, 4096}, {2, 1030}, {5, 5120},
                                  {3, 8192},  {2, 12296}, {2, 16384},   {3, 16392}};
  const int ran = cuda_cases(
      {"layer_norm", "rms_norm", "layer_norm_noaffine", "rms_norm_noaffine", "add_layer_norm", "add_rms_norm"},
      {DType::f32, DType::bf16, DType::f16}, shapes, LayoutKind::inplace);
  EXPECT_GT(ran, quick() ? 450 : 750);
}

// Long rows in whole vectors take the cluster kernel on sm_90 (Note
// [Softmax over a cluster]): 2 to 16 ranks (past 8: the non-portable
// sizes), both vector counts a thread (262144: f32 backward at eight, f32
// forward at 16 ranks), a last rank mostly past the row (16388, 65540),
// rank-2 outer shapes, and the sweep's layouts (strided and transposed rows
// keep the rows kernel; in place and poisoned outputs reach both).
TEST(SoftmaxCuda, ClusterRowsAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{3, 16388}, {5, 32768}, {2, 40000}, {2, 3, 20000}, {4, 65540}, {1, 262144}};
  const int ran = cuda_cases({"softmax", "log_softmax", "softmin", "softmax_backward", "log_softmax_backward",
                              "softmin_backward"},
                             {DType::f32, DType::bf16, DType::f16}, shapes, LayoutKind::inplace);
  EXPECT_GT(ran, 200);
}

// Forward rows of up to 512 x 4 vectors in whole vectors, and backward rows
// of up to 32 x 2, are held in registers (Note [Softmax rows in registers]):
// every row width (1 to 32 lanes of a warp, with 4 to 128 rows a block and a last block part empty:
// 130 rows of one vector, 129 of two lanes; then 128 to 512 threads), rows
// a thread's last vectors miss (24, 40, 100, 136, 200, 1000, 1032, 3000,
// 5120, 12296), rows not in whole vectors (1030 f32, 4, 100 and 1028 half:
// the rows kernel), 8192 and 16384 (f32: the rows kernel) and just past it,
// rank-2 outer shapes; strided rows keep the rows kernel; in place rows are
// held.
TEST(SoftmaxCuda, HeldRowsAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Shape> shapes{{130, 4},  {130, 8},   {129, 16},  {37, 24},   {33, 40},     {70, 64},
                                  {9, 100},  {17, 136},  {11, 200},  {7, 512},   {3, 1000},    {3, 1028},
                                  {7, 1032}, {5, 2048},  {4, 2052},  {33, 3000}, {2, 3, 4096}, {2, 1030},
                                  {5, 5120}, {3, 8192},  {2, 12296}, {2, 16384}, {3, 16392}};
  const int ran = cuda_cases({"softmax", "log_softmax", "softmin", "softmax_backward", "log_softmax_backward",
                              "softmin_backward"},
                             {DType::f32, DType::bf16, DType::f16}, shapes, LayoutKind::inplace);
  EXPECT_GT(ran, quick() ? 500 : 800);
}

/// Rows of normal(0, 3) values for the special-value tests below.
std::vector<double> normal_rows(int64_t rows, int64_t cols, unsigned seed) {
  std::vector<double> x(size_t(rows * cols));
  std::mt19937 rng(seed);
  std::normal_distribution<double> n(0, 3);
  for (auto& v : x) v = n(rng);
  return x;
}

/// Runs softmax-family `op` over x on CUDA and on the host and expects no
/// element to differ by more than tol (relative past 1); NaN matches NaN.
void expect_cuda_matches_host(const char* op, const std::vector<double>& x, const Shape& shape, DType dtype,
                              double tol) {
  auto gpu = exec(Backend::bespoke_cuda, op, {{x, shape, dtype}});
  auto host = exec(Backend::host_reference, op, {{x, shape, dtype}});
  ASSERT_TRUE(gpu) << gpu.status().to_string();
  ASSERT_TRUE(host) << host.status().to_string();
  int64_t bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double a = (*gpu)[0][i], b = (*host)[0][i];
    const bool close = a == b || std::abs(a - b) <= tol * std::max(1.0, std::abs(b));
    bad += !((std::isnan(a) && std::isnan(b)) || close);
  }
  EXPECT_EQ(bad, 0) << op << " " << dtype_name(dtype) << ", rows of " << shape.back();
}

// Special values on held rows (4096 and 104 elements, f32 and bf16) against
// the host: -inf entries, a row of -inf (NaN, as torch), a NaN, a +inf (NaN
// row), and a huge spread.
TEST(SoftmaxCuda, HeldRowsSpecialValues) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (const int64_t cols : {int64_t(4096), int64_t(104)}) {
    std::vector<double> x = normal_rows(5, cols, 7);
    for (int64_t c = 0; c < cols; c += 3) x[c] = -INFINITY;      // row 0: every third -inf
    for (int64_t c = 0; c < cols; ++c) x[cols + c] = -INFINITY;  // row 1: all -inf
    x[2 * cols + cols / 2] = NAN;                                 // row 2: a NaN
    x[3 * cols + 7] = INFINITY;                                   // row 3: +inf
    x[4 * cols + 1] = 80, x[4 * cols + 2] = -80;                  // row 4: a huge spread
    for (DType dtype : {DType::f32, DType::bf16})
      for (const char* op : {"softmax", "log_softmax", "softmin"})
        expect_cuda_matches_host(op, x, {5, cols}, dtype, dtype == DType::f32 ? 1e-5 : 1e-2);
  }
}

// The cluster kernel's special rows against the host: -inf entries (a
// thread's whole share -inf: its part weighs 0), a row of -inf (NaN, as
// torch), a NaN, a +inf (NaN row), and huge spreads.
TEST(SoftmaxCuda, ClusterRowsSpecialValues) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t cols = 32768;
  std::vector<double> x = normal_rows(5, cols, 5);
  for (int64_t c = 0; c < cols; c += 3) x[c] = -INFINITY;              // row 0: every third -inf
  for (int64_t c = 0; c < 8192 + 100; ++c) x[cols + c] = -INFINITY;     // row 1: the first rank's share and more
  for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] = -INFINITY;       // row 2: all -inf
  x[3 * cols + 20000] = NAN;                                            // row 3: a NaN
  x[4 * cols + 7] = INFINITY;                                           // row 4: +inf
  for (const char* op : {"softmax", "log_softmax", "softmin"})
    expect_cuda_matches_host(op, x, {5, cols}, DType::f32, 1e-5);
}

/// Runs `op` on the host over contiguous f64 operands; returns output 0.
std::vector<double> host_run(const std::string& op, std::vector<std::vector<double>> inputs, const Shape& shape,
                             const Attrs& attrs) {
  std::vector<TensorSpec> specs(inputs.size(), TensorSpec{DType::f64, shape});
  auto desc = infer(op, specs, attrs);
  EXPECT_TRUE(desc) << desc.status().to_string();
  std::vector<double> out(desc->outputs[0].numel(), NAN);
  std::vector<TensorView> in;
  for (auto& v : inputs) in.push_back(*TensorView::contiguous(v.data(), DType::f64, shape));
  auto out_view = *TensorView::contiguous(out.data(), DType::f64, shape);
  Status s = run_op(Stream::host(), op, in, std::span(&out_view, 1), attrs);
  EXPECT_TRUE(s) << s.to_string();
  return out;
}

TEST(SoftmaxKnownValues, ClosedForms) {
  const Shape s{2, 3};
  const std::vector<double> x{0, 1, 2, -1, -1, -1};
  const double z = 1 + std::exp(1.0) + std::exp(2.0);
  auto y = host_run("softmax", {x}, s, {});
  EXPECT_NEAR(y[0], 1 / z, 1e-15);
  EXPECT_NEAR(y[2], std::exp(2.0) / z, 1e-15);
  EXPECT_NEAR(y[4], 1.0 / 3, 1e-15);
  auto ly = host_run("log_softmax", {x}, s, {});
  EXPECT_NEAR(ly[1], 1 - std::log(z), 1e-15);
  auto my = host_run("softmin", {x}, s, {});
  EXPECT_NEAR(my[0], 1 / (1 + std::exp(-1.0) + std::exp(-2.0)), 1e-15);
  // dim 0: columns of [2, 3].
  auto c = host_run("softmax", {x}, s, {{"dim", 0}});
  EXPECT_NEAR(c[0], 1 / (1 + std::exp(-1.0)), 1e-15);
  // Large values do not overflow (max subtracted first).
  auto big = host_run("softmax", {{1000, 1000}}, {2}, {});
  EXPECT_DOUBLE_EQ(big[0], 0.5);
}

/// sum(g * f(x)) differentiated numerically along a few coordinates.
TEST(SoftmaxFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<double> u(-2, 2);
  const Shape s{3, 5};
  for (const char* name : {"softmax", "log_softmax", "softmin"}) {
    for (double dim : {-1.0, 0.0}) {
      std::vector<double> x(15), g(15);
      for (auto& v : x) v = u(rng);
      for (auto& v : g) v = u(rng);
      const Attrs attrs{{"dim", dim}};
      auto y = host_run(name, {x}, s, attrs);
      auto dx = host_run(std::string(name) + "_backward", {g, y}, s, attrs);
      auto loss = [&](const std::vector<double>& xs) { return weighted_sum(g, host_run(name, {xs}, s, attrs)); };
      for (int i : {0, 4, 7, 14})
        EXPECT_NEAR(dx[i], central_difference(loss, x, i), 1e-6) << name << " dim " << dim << " i " << i;
    }
  }
}

TEST(SoftmaxErrors, BadDescriptorsAreNamed) {
  auto d = infer("softmax", {{DType::f32, {2, 3}}}, {{"dim", 2}});
  ASSERT_FALSE(d);
  EXPECT_NE(d.status().message().find("dim 2 is out of range for rank 2"), std::string::npos);
  auto b = infer("softmax_backward", {{DType::f32, {2, 3}}, {DType::f32, {2, 4}}});
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("'output' shape [2, 4] != 'grad_output' shape [2, 3]"), std::string::npos);
  auto t = infer("log_softmax", {{DType::i32, {4}}});
  ASSERT_FALSE(t);
  EXPECT_NE(t.status().message().find("i32"), std::string::npos);
}

/// Runs a norm op on the host over contiguous f64 operands of the given shapes.
std::vector<std::vector<double>> host_norm(const std::string& op, std::vector<std::vector<double>> inputs,
                                           const std::vector<Shape>& shapes, const Attrs& attrs = {}) {
  std::vector<TensorSpec> specs;
  for (const Shape& s : shapes) specs.push_back({DType::f64, s});
  auto desc = infer(op, specs, attrs);
  EXPECT_TRUE(desc) << desc.status().to_string();
  if (!desc) return {};
  std::vector<std::vector<double>> outs;
  std::vector<TensorView> in, out;
  for (size_t i = 0; i < inputs.size(); ++i) in.push_back(*TensorView::contiguous(inputs[i].data(), DType::f64, shapes[i]));
  for (const auto& o : desc->outputs) outs.emplace_back(o.numel(), NAN);
  for (size_t j = 0; j < outs.size(); ++j)
    out.push_back(*TensorView::contiguous(outs[j].data(), DType::f64, desc->outputs[j].shape));
  Status st = run_op(Stream::host(), op, in, out, attrs);
  EXPECT_TRUE(st) << st.to_string();
  return outs;
}

// ---------------------------------------------------------------- sparsemax

TEST(SparsemaxKnownValues, ClosedForms) {
  // [1, 0.5, -1]: support {1, 0.5}, tau = (1.5 - 1) / 2 = 0.25.
  EXPECT_EQ(host_run("sparsemax", {{1, 0.5, -1}}, {3}, {}), (std::vector<double>{0.75, 0.25, 0}));
  EXPECT_EQ(host_run("sparsemax", {{0, 0, 0, 0}}, {4}, {}), (std::vector<double>{0.25, 0.25, 0.25, 0.25}));
  EXPECT_EQ(host_run("sparsemax", {{3, 1, 0}}, {3}, {}), (std::vector<double>{1, 0, 0}));  // a gap >= 1: one-hot
  auto two = host_run("sparsemax", {{0.1, 0.2}}, {2}, {});  // tau = -0.35
  EXPECT_NEAR(two[0], 0.45, 1e-15);
  EXPECT_NEAR(two[1], 0.55, 1e-15);
  // dim 0 of [3, 2]: the columns [1, 0.5, -1] and [0, 0, 0].
  EXPECT_EQ(host_run("sparsemax", {{1, 0, 0.5, 0, -1, 0}}, {3, 2}, {{"dim", 0}}),
            (std::vector<double>{0.75, 1.0 / 3, 0.25, 1.0 / 3, 0, 1.0 / 3}));
  // The backward on the support {0, 1}: g - mean(g over it); zero elsewhere.
  EXPECT_EQ(host_run("sparsemax_backward", {{1, 3, 5}, {0.75, 0.25, 0}}, {3}, {}), (std::vector<double>{-1, 1, 0}));
}

/// The projection's optimality conditions on long rows, every backend and
/// dtype: out >= 0, sum 1, and z - out is one constant tau on the support
/// with z <= tau off it.
TEST(Sparsemax, LongRowsSatisfyKkt) {
  std::mt19937_64 rng(11);
  std::normal_distribution<double> n(0, 1);
  for (Backend b : host_and_cuda_backends()) {
    for (int64_t cols : {5, 1000, 40000, 120000}) {
      for (DType dtype : {DType::f32, DType::f64}) {
        std::vector<double> x(2 * cols);
        for (auto& v : x) v = std::round(n(rng) * 3 * 1024) / 1024;  // exact in f32
        auto r = exec(b, "sparsemax", {{x, {2, cols}, dtype}});
        ASSERT_TRUE(r) << r.status().to_string();
        const double tol = dtype == DType::f64 ? 1e-12 : 2e-5;
        for (int row = 0; row < 2; ++row) {
          double sum = 0, tau = NAN;
          int support = 0;
          for (int64_t c = 0; c < cols; ++c) {
            const double y = (*r)[0][row * cols + c], z = x[row * cols + c];
            ASSERT_GE(y, 0);
            sum += y;
            if (y > 0) {
              if (std::isnan(tau)) tau = z - y;
              EXPECT_NEAR(z - y, tau, tol) << cols;
              ++support;
            }
          }
          EXPECT_NEAR(sum, 1, tol * 10) << backend_name(b) << " cols " << cols;
          for (int64_t c = 0; c < cols; ++c)
            if ((*r)[0][row * cols + c] == 0) {
              EXPECT_LE(x[row * cols + c], tau + tol);
            }
          EXPECT_GE(support, 1);
        }
      }
    }
  }
}

TEST(SparsemaxFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<double> u(-1, 1);
  const Shape s{3, 6};
  for (double dim : {-1.0, 0.0}) {
    std::vector<double> x(18), g(18);
    for (auto& v : x) v = u(rng);
    for (auto& v : g) v = u(rng);
    const Attrs attrs{{"dim", dim}};
    auto y = host_run("sparsemax", {x}, s, attrs);
    auto dx = host_run("sparsemax_backward", {g, y}, s, attrs);
    auto loss = [&](const std::vector<double>& xs) { return weighted_sum(g, host_run("sparsemax", {xs}, s, attrs)); };
    for (int i = 0; i < 18; ++i)
      EXPECT_NEAR(dx[i], central_difference(loss, x, i, 1e-7), 1e-6) << "dim " << dim << " i " << i;
  }
}

// ---------------------------------------------------------------- gumbel_softmax

/// Philox-4x32-10 and the documented noise (Note [Gumbel noise]).
double gumbel_noise(uint64_t seed, uint64_t offset, uint64_t row, uint64_t col) {
  const uint64_t q = col / 4;
  uint32_t c0 = uint32_t(q), c1 = uint32_t(q >> 32), c2 = uint32_t(offset + row), c3 = uint32_t((offset + row) >> 32);
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int i = 0; i < 10; ++i) {
    const uint64_t p0 = uint64_t(0xD2511F53u) * c0, p1 = uint64_t(0xCD9E8D57u) * c2;
    const uint32_t n0 = uint32_t(p1 >> 32) ^ c1 ^ k0, n2 = uint32_t(p0 >> 32) ^ c3 ^ k1;
    c1 = uint32_t(p1), c3 = uint32_t(p0), c0 = n0, c2 = n2;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  const uint32_t word[4] = {c0, c1, c2, c3};
  const double u = (2.0 * (word[col % 4] >> 9) + 1) / 16777216.0;
  return -std::log(-std::log(u));
}

/// gumbel_softmax's outputs (out, soft) on the host in f64.
std::vector<std::vector<double>> gumbel(const std::vector<double>& x, const Shape& shape, const Attrs& attrs) {
  return host_norm("gumbel_softmax", {x}, {shape}, attrs);
}

TEST(GumbelSoftmaxKnownValues, NoiseIsTheDocumentedPhilox) {
  const Shape s{3, 4};
  const std::vector<double> x{0, 1, 2, 3, -1, 0, 1, 0.5, 2, 2, 2, 2};
  for (double dim : {-1.0, 0.0}) {
    const Attrs attrs{{"dim", dim}, {"tau", 0.5}, {"seed", 1234567}, {"offset", 9}};
    auto r = gumbel(x, s, attrs);
    const int rows = dim < 0 ? 3 : 4, cols = dim < 0 ? 4 : 3;
    for (int row = 0; row < rows; ++row) {
      auto at = [&](int c) { return dim < 0 ? row * 4 + c : c * 4 + row; };
      double z[4], max = -INFINITY, sum = 0;
      for (int c = 0; c < cols; ++c) z[c] = (x[at(c)] + gumbel_noise(1234567, 9, row, c)) / 0.5, max = std::max(max, z[c]);
      for (int c = 0; c < cols; ++c) sum += std::exp(z[c] - max);
      for (int c = 0; c < cols; ++c) {
        EXPECT_NEAR(r[1][at(c)], std::exp(z[c] - max) / sum, 1e-14) << "dim " << dim << " row " << row << " col " << c;
        EXPECT_EQ(r[0][at(c)], r[1][at(c)]);  // not hard: out is the soft sample
      }
    }
  }
}

TEST(GumbelSoftmax, ReproducibleHardAndSameOnEveryBackendAndLayout) {
  std::mt19937_64 rng(8);
  std::uniform_real_distribution<double> u(-2, 2);
  const int64_t R = 37, C = 300;
  std::vector<double> x(R * C), xt(R * C);
  for (auto& v : x) v = u(rng);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < C; ++c) xt[c * R + r] = x[r * C + c];
  const Attrs attrs{{"hard", 1}, {"seed", 42}, {"offset", 5}};
  auto a = gumbel(x, {R, C}, attrs), again = gumbel(x, {R, C}, attrs);
  EXPECT_EQ(a, again);
  Attrs other = attrs;
  EXPECT_NE(gumbel(x, {R, C}, other.set("seed", 43))[1], a[1]);
  EXPECT_NE(gumbel(x, {R, C}, Attrs(attrs).set("offset", 6))[1], a[1]);
  // Rows 1.. with offset + 1 draw the same noise as before.
  auto shifted = gumbel(std::vector<double>(x.begin() + C, x.end()), {R - 1, C}, Attrs(attrs).set("offset", 6));
  EXPECT_EQ(shifted[1], std::vector<double>(a[1].begin() + C, a[1].end()));
  for (int64_t r = 0; r < R; ++r) {
    int64_t arg = 0;
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) {
      sum += a[1][r * C + c];
      if (a[1][r * C + c] > a[1][r * C + arg]) arg = c;
    }
    EXPECT_NEAR(sum, 1, 1e-12);
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(a[0][r * C + c], c == arg ? 1.0 : 0.0) << r << " " << c;
  }
  // The same sample from the transposed memory along dim 0, strided views and every backend.
  for (Backend b : host_and_cuda_backends()) {
    for (DType dtype : {DType::f64, DType::f32}) {
      auto t = exec(b, "gumbel_softmax", {{xt, {C, R}, dtype}}, Attrs(attrs).set("dim", 0));
      auto s = exec(b, "gumbel_softmax", {{x, {R, C}, dtype, {1, R}}}, attrs);  // column-major memory
      ASSERT_TRUE(t && s) << (t ? s.status() : t.status()).to_string();
      const double tol = dtype == DType::f64 ? 1e-12 : 1e-5;
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) {
          EXPECT_EQ((*t)[0][c * R + r], a[0][r * C + c]) << backend_name(b);
          EXPECT_NEAR((*t)[1][c * R + r], a[1][r * C + c], tol) << backend_name(b);
          EXPECT_EQ((*s)[0][r * C + c], a[0][r * C + c]) << backend_name(b);
          EXPECT_NEAR((*s)[1][r * C + c], a[1][r * C + c], tol) << backend_name(b);
        }
    }
  }
}

/// The CUDA kernel's blocks loop over rows by the grid (Note [Gumbel rows in a
/// pipeline]): enough rows that every row shape takes several turns, cached
/// and uncached, vector and scalar rows, against the host's sample.
TEST(GumbelSoftmaxCuda, RowsTakenByTheGridMatchHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-3, 3);
  // cols: rows of 32 x 8, 32 x 4, 128, 512 and 1024 threads; odd widths take the scalar path;
  // 32768 f32 fills the 128 KiB cache, 60000 f32 (240 KB) runs uncached.
  const std::pair<int64_t, int64_t> shapes[] = {{40000, 100}, {12000, 1001}, {4000, 4096}, {1500, 16383},
                                                {300, 32768}, {140, 60000}};
  for (auto [R, C] : shapes) {
    std::vector<double> x(size_t(R * C));
    for (auto& e : x) e = u(rng);
    const Attrs attrs{{"hard", 1}, {"tau", 0.7}, {"seed", 99}, {"offset", 3}};
    for (DType dtype : {DType::f32, DType::bf16}) {
      SCOPED_TRACE(std::to_string(R) + "x" + std::to_string(C) + " " + dtype_name(dtype));
      auto host = exec(Backend::host_reference, "gumbel_softmax", {{x, {R, C}, dtype}}, attrs);
      auto got = exec(Backend::bespoke_cuda, "gumbel_softmax", {{x, {R, C}, dtype}}, attrs);
      ASSERT_TRUE(host && got) << (host ? got.status() : host.status()).to_string();
      const auto& want = *host;
      const double tol = dtype == DType::f32 ? 1e-5 : 1e-2;
      int64_t off_soft = 0, bad_hot = 0;
      for (int64_t r = 0; r < R; ++r) {
        int64_t arg = 0;
        for (int64_t c = 0; c < C; ++c) {
          const size_t i = size_t(r * C + c);
          off_soft += std::abs((*got)[1][i] - want[1][i]) > tol * std::max(1.0, std::abs(want[1][i]));
          if ((*got)[1][i] > (*got)[1][size_t(r * C + arg)]) arg = c;
        }
        // out is the one-hot of the sample's first argmax (bf16 rounding may tie several).
        for (int64_t c = 0; c < C; ++c) {
          const double hot = (*got)[0][size_t(r * C + c)];
          bad_hot += dtype == DType::f32 ? hot != (c == arg ? 1.0 : 0.0)
                                         : hot != 0.0 && (*got)[1][size_t(r * C + c)] != (*got)[1][size_t(r * C + arg)];
        }
      }
      EXPECT_EQ(off_soft, 0);
      EXPECT_EQ(bad_hot, 0);
    }
  }
}

/// The argmax of logits + Gumbel noise is a sample of softmax(logits): over
/// N rows each frequency is within 5 standard deviations sqrt(p (1 - p) / N).
TEST(GumbelSoftmax, ArgmaxFrequenciesFollowSoftmax) {
  const std::vector<double> logits{1, 0, -1, 0.5, 2};
  const int64_t N = 20000, C = 5;
  std::vector<double> x;
  for (int64_t r = 0; r < N; ++r) x.insert(x.end(), logits.begin(), logits.end());
  double z = 0;
  for (double l : logits) z += std::exp(l);
  for (double tau : {1.0, 0.3}) {
    auto r = gumbel(x, {N, C}, {{"hard", 1}, {"tau", tau}, {"seed", 2024}});
    for (int64_t c = 0; c < C; ++c) {
      double count = 0;
      for (int64_t i = 0; i < N; ++i) count += r[0][i * C + c];
      const double p = std::exp(logits[c]) / z, sd = std::sqrt(p * (1 - p) / N);
      EXPECT_NEAR(count / N, p, 5 * sd) << "tau " << tau << " class " << c;  // tau does not change the argmax
    }
  }
}

/// Straight-through: the backward of out (hard or not) is the soft sample's.
TEST(GumbelSoftmaxFiniteDifferences, BackwardMatchesSoftForward) {
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<double> u(-2, 2);
  const Shape s{3, 5};
  for (double dim : {-1.0, 0.0}) {
    for (double tau : {1.0, 0.7}) {
      std::vector<double> x(15), g(15);
      for (auto& v : x) v = u(rng);
      for (auto& v : g) v = u(rng);
      const Attrs fwd{{"dim", dim}, {"tau", tau}, {"seed", 99}, {"offset", 1}, {"hard", 1}};
      auto y = gumbel(x, s, fwd);
      auto dx = host_run("gumbel_softmax_backward", {g, y[1]}, s, {{"dim", dim}, {"tau", tau}});
      auto loss = [&](const std::vector<double>& xs) { return weighted_sum(g, gumbel(xs, s, fwd)[1]); };
      for (int i = 0; i < 15; ++i)
        EXPECT_NEAR(dx[i], central_difference(loss, x, i), 1e-6) << "dim " << dim << " tau " << tau << " i " << i;
    }
  }
}

TEST(SoftmaxFamilyErrors, GumbelAndSparsemaxAttributes) {
  auto message = [](const std::string& op, const Attrs& attrs, size_t inputs = 1) {
    auto d = infer(op, std::vector<TensorSpec>(inputs, TensorSpec{DType::f32, {2, 3}}), attrs);
    return d ? std::string("accepted") : d.status().message();
  };
  EXPECT_NE(message("gumbel_softmax", {{"tau", 0}}).find("'tau' must be finite and > 0, got 0"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax", {{"tau", -1}}).find("'tau' must be finite and > 0"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax_backward", {{"tau", 0}}, 2).find("'tau' must be finite and > 0"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax", {{"hard", 2}}).find("'hard' must be 0 or 1, got 2"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax", {{"seed", -1}}).find("'seed' must be a whole number"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax", {{"offset", 0.5}}).find("'offset' must be a whole number"), std::string::npos);
  EXPECT_NE(message("gumbel_softmax", {{"dim", -3}}).find("dim -3 is out of range for rank 2"), std::string::npos);
  EXPECT_NE(message("sparsemax", {{"dim", 2}}).find("dim 2 is out of range for rank 2"), std::string::npos);
  auto b = infer("sparsemax_backward", {{DType::f32, {2, 3}}, {DType::f32, {3, 2}}});
  ASSERT_FALSE(b);
  EXPECT_NE(b.status().message().find("'output' shape [3, 2] != 'grad_output' shape [2, 3]"), std::string::npos);
  auto g = infer("gumbel_softmax_backward", {{DType::f32, {2, 3}}, {DType::f16, {2, 3}}});
  ASSERT_FALSE(g);
  EXPECT_NE(g.status().message().find("'soft' dtype f16 != 'grad_output' dtype f32"), std::string::npos);
  auto ints = infer("sparsemax", {{DType::i32, {4}}});  // fp8 is taken (computed in f32), integers are not
  ASSERT_FALSE(ints);
  EXPECT_NE(ints.status().message().find("i32"), std::string::npos);
  EXPECT_TRUE(infer("sparsemax", {{DType::fp8_e4m3, {4}}}));
  // Two outputs, both like the logits.
  auto two = infer("gumbel_softmax", {{DType::bf16, {2, 3}}});
  ASSERT_TRUE(two);
  EXPECT_EQ(two->outputs.size(), 2u);
}

TEST(NormKnownValues, ClosedForms) {
  // Row [1, 2, 3, 6]: mean 3, biased var (4 + 1 + 0 + 9) / 4 = 3.5.
  const std::vector<double> x{1, 2, 3, 6}, w{1, 2, 1, 1}, b{0, 0, 1, 0};
  auto ln = host_norm("layer_norm", {x, w, b}, {{1, 4}, {4}, {4}}, {{"eps", 0}});
  const double rstd = 1 / std::sqrt(3.5);
  EXPECT_NEAR(ln[0][0], -2 * rstd, 1e-12);
  EXPECT_NEAR(ln[0][1], -1 * rstd * 2, 1e-12);
  EXPECT_NEAR(ln[0][2], 1.0, 1e-12);
  EXPECT_NEAR(ln[1][0], 3.0, 1e-12);
  EXPECT_NEAR(ln[2][0], rstd, 1e-12);
  auto rn = host_norm("rms_norm", {x, w}, {{1, 4}, {4}}, {{"eps", 0}});
  const double rr = 1 / std::sqrt((1 + 4 + 9 + 36) / 4.0);
  EXPECT_NEAR(rn[0][1], 2 * rr * 2, 1e-12);
  EXPECT_NEAR(rn[1][0], rr, 1e-12);
  // The fused residual form equals add then norm, and returns the sum.
  auto fused = host_norm("add_rms_norm", {x, {1, 1, 1, 1}, w}, {{1, 4}, {1, 4}, {4}}, {{"eps", 0}});
  auto plain = host_norm("rms_norm", {{2, 3, 4, 7}, w}, {{1, 4}, {4}}, {{"eps", 0}});
  EXPECT_EQ(fused[1], (std::vector<double>{2, 3, 4, 7}));
  for (int c = 0; c < 4; ++c) EXPECT_DOUBLE_EQ(fused[0][c], plain[0][c]);
  // torch's rms_norm default eps is the dtype's epsilon: f64 2^-52.
  auto d = host_norm("rms_norm_noaffine", {{0, 0}}, {{1, 2}});
  EXPECT_NEAR(d[1][0], 1 / std::sqrt(2.220446049250313e-16), 1);
}

// An empty batch: grad_input is empty and grad_weight / grad_bias are sums
// over no rows, zeros as in torch (they were left unwritten), also when laid
// out with a stride of 2 or -1; on every backend, with short rows and with
// rows of the fused kernels (2048), f32 and bf16.
TEST(NormKnownValues, EmptyBatchGivesZeroParameterGradients) {
  for (Backend backend : host_and_cuda_backends())
    for (DType dtype : {DType::f32, DType::bf16})
      for (int64_t cols : {8, 2048})
        for (bool rms : {false, true}) {
          const Shape rows{0, cols};
          const DType stat = DType::f32;  // the statistics of f32 and half rows
          std::vector<Operand> in{{{}, rows, dtype}, {{}, rows, dtype}};
          if (!rms) in.push_back({{}, {0}, stat});
          in.push_back({{}, {0}, stat});
          in.push_back({std::vector<double>(size_t(cols), 1.0), {cols}, dtype});
          const std::vector<Shape> strides = rms ? std::vector<Shape>{{}, {-1}} : std::vector<Shape>{{}, {2}, {-1}};
          const std::string op = rms ? "rms_norm_backward" : "layer_norm_backward";
          auto out = exec(backend, op, in, {}, {}, strides);
          ASSERT_TRUE(out) << op << ": " << out.status().to_string();
          ASSERT_EQ(out->size(), rms ? 2u : 3u);
          EXPECT_TRUE((*out)[0].empty());
          for (size_t j = 1; j < out->size(); ++j)
            EXPECT_EQ((*out)[j], std::vector<double>(size_t(cols), 0.0))
                << op << " " << dtype_name(dtype) << " cols " << cols << " output " << j << " on "
                << backend_name(backend);
        }
}

// layer_norm's statistics on CUDA (sums of h - h[0], then of (h - mean)^2):
// rows whose first element is an outlier (1e4 among U(-1, 1)), rows far
// from zero (1000 + U(-1, 1): a sum of squares about zero would cancel),
// constant rows (exactly zero deviation: the output is the bias, bit for
// bit) and plain rows, f32, at every block shape of the rows kernel (32 x 8,
// 32 x 4, 128, 512 and 1024 threads a row) and the cluster kernel (16384),
// in whole vectors, in elements (1030, 4099, 20001) and with a residual.
// The mean may be off by a few float32 ulps of |mean| + std + |h[0] - mean|
// (the shifted values' scale; 6e-7 is 5 ulps: the outlier rows' mean at
// 16384 was measured 1.1e-3 off, the tolerance there is 6e-3), and an
// output by that error times rstd |weight|, besides its rstd's (2e-5).
TEST(NormCuda, LayerNormStatisticsStayPrecise) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(29);
  std::uniform_real_distribution<double> u(-1, 1);
  auto f32 = [](double v) { return double(float(v)); };
  for (const int64_t cols : {100, 1000, 1030, 4096, 4099, 8192, 16384, 20001}) {
    const int64_t rows = 8;
    std::vector<double> x(rows * cols), res(rows * cols), w(cols), b(cols);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int kind = int(r % 4);  // 0 outlier first, 1 far from zero, 2 constant, 3 plain
        x[r * cols + c] = f32(kind == 2 ? 0.1 : kind == 1 ? 1000 + u(rng) : kind == 0 && c == 0 ? 1e4 : u(rng));
        res[r * cols + c] = kind == 2 ? 0 : f32(u(rng) * 0.25);
      }
    for (int64_t c = 0; c < cols; ++c) w[c] = f32(1 + 0.5 * u(rng)), b[c] = f32(u(rng));
    for (const bool residual : {false, true}) {
      const std::string op = residual ? "add_layer_norm" : "layer_norm";
      const std::string what = op + " " + std::to_string(rows) + "x" + std::to_string(cols);
      std::vector<Operand> in{Operand{x, {rows, cols}, DType::f32, {}}};
      std::vector<std::vector<double>> ref_in{x};
      std::vector<Shape> shapes{{rows, cols}};
      if (residual) in.push_back(Operand{res, {rows, cols}, DType::f32, {}}), ref_in.push_back(res), shapes.push_back({rows, cols});
      in.push_back(Operand{w, {cols}, DType::f32, {}}), in.push_back(Operand{b, {cols}, DType::f32, {}});
      ref_in.push_back(w), ref_in.push_back(b), shapes.push_back({cols}), shapes.push_back({cols});
      if (residual)  // the reference sees the residual sum as the kernel forms it: in f32
        for (size_t e = 0; e < x.size(); ++e) ref_in[0][e] = f32(x[e] + res[e]), ref_in[1][e] = 0;
      const auto want = host_norm(op, ref_in, shapes);
      auto got = exec(Backend::bespoke_cuda, op, in);
      ASSERT_TRUE(got) << what << ": " << got.status().to_string();
      ASSERT_EQ(got->size(), want.size()) << what;
      const size_t mean = residual ? 2 : 1, rstd = mean + 1;
      for (int64_t r = 0; r < rows; ++r) {
        const double m = want[mean][r], s = want[rstd][r];
        const double mean_tol = 6e-7 * (std::abs(m) + 1 / s + std::abs(ref_in[0][r * cols] - m));
        EXPECT_NEAR((*got)[mean][r], m, mean_tol) << what << " row " << r << " mean";
        EXPECT_NEAR((*got)[rstd][r], s, 2e-5 * s) << what << " row " << r << " rstd";
        if (r % 4 == 2) {
          EXPECT_EQ((*got)[mean][r], f32(0.1)) << what << " constant row " << r << ": the mean is the value";
          for (int64_t c = 0; c < cols; ++c)
            if ((*got)[0][r * cols + c] != b[c]) {
              ADD_FAILURE() << what << " constant row " << r << " element " << c << ": " << (*got)[0][r * cols + c]
                            << ", the bias is " << b[c];
              break;
            }
        }
        int bad = 0;
        for (int64_t c = 0; c < cols; ++c) {
          const double want_y = want[0][r * cols + c], y = (*got)[0][r * cols + c];
          if (!(std::abs(y - want_y) <= 2e-5 * (1 + std::abs(want_y)) + mean_tol * s * std::abs(w[c])) && bad++ < 3)
            ADD_FAILURE() << what << " row " << r << " element " << c << ": got " << y << ", expected " << want_y;
        }
      }
    }
  }
}

/// n values uniform in [-2, 2].
std::vector<double> uniform_values(std::mt19937_64& rng, int n) {
  std::uniform_real_distribution<double> u(-2, 2);
  std::vector<double> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

/// Loss sum(g * out) differentiated numerically through each input.
TEST(NormFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(5);
  const int rows = 3, cols = 5;
  auto rnd = [&](int n) { return uniform_values(rng, n); };
  for (const char* name : {"layer_norm", "layer_norm_noaffine", "rms_norm", "rms_norm_noaffine"}) {
    const std::string op = name;
    const bool rms = op.rfind("rms", 0) == 0, affine = op.find("noaffine") == std::string::npos;
    const Shape xs{rows, cols}, ws{cols}, ss{rows};
    auto x = rnd(rows * cols), w = rnd(cols), b = rnd(cols), g = rnd(rows * cols);
    auto forward = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      std::vector<std::vector<double>> in{xv};
      std::vector<Shape> shapes{xs};
      if (affine) in.push_back(wv), shapes.push_back(ws);
      if (affine && !rms) in.push_back(bv), shapes.push_back(ws);
      return host_norm(op, in, shapes, {{"eps", 1e-5}});
    };
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      return weighted_sum(g, forward(xv, wv, bv)[0]);
    };
    auto fwd = forward(x, w, b);
    std::vector<std::vector<double>> bin{g, x};
    std::vector<Shape> bshapes{xs, xs};
    if (!rms) bin.push_back(fwd[1]), bshapes.push_back(ss);
    bin.push_back(fwd[rms ? 1 : 2]), bshapes.push_back(ss);
    if (affine) bin.push_back(w), bshapes.push_back(ws);
    auto grads = host_norm(op + "_backward", bin, bshapes);
    auto by_x = [&](const std::vector<double>& v) { return loss(v, w, b); };
    auto by_w = [&](const std::vector<double>& v) { return loss(x, v, b); };
    auto by_b = [&](const std::vector<double>& v) { return loss(x, w, v); };
    for (int i : {0, 6, 14}) EXPECT_NEAR(grads[0][i], central_difference(by_x, x, i), 1e-5) << op << " dx " << i;
    if (affine)
      for (int c : {0, 3}) {
        EXPECT_NEAR(grads[1][c], central_difference(by_w, w, c), 1e-5) << op << " dw " << c;
        if (!rms) {
          EXPECT_NEAR(grads[2][c], central_difference(by_b, b, c), 1e-5) << op << " db " << c;
        }
      }
  }
}

/// The fused residual forms: L = sum(g * out) + sum(gr * residual_out) over
/// add_*_norm(input, residual, ...); grad_input (the gradient of both input
/// and residual), grad_weight and grad_bias against central differences; and
/// grad_residual_out given as [0] (none).
TEST(NormFiniteDifferences, ResidualBackwardMatchesForward) {
  std::mt19937_64 rng(7);
  const int rows = 3, cols = 6;
  auto rnd = [&](int n) { return uniform_values(rng, n); };
  for (const std::string op : {"add_rms_norm", "add_layer_norm"}) {
    const bool rms = op == "add_rms_norm";
    const Shape xs{rows, cols}, ws{cols}, ss{rows};
    auto x = rnd(rows * cols), r = rnd(rows * cols), w = rnd(cols), b = rnd(cols);
    auto g = rnd(rows * cols), gr = rnd(rows * cols);
    for (bool with_residual_grad : {true, false}) {
      auto forward = [&](const std::vector<double>& xv, const std::vector<double>& rv, const std::vector<double>& wv,
                         const std::vector<double>& bv) {
        std::vector<std::vector<double>> in{xv, rv, wv};
        std::vector<Shape> shapes{xs, xs, ws};
        if (!rms) in.push_back(bv), shapes.push_back(ws);
        return host_norm(op, in, shapes, {{"eps", 1e-5}});
      };
      auto loss = [&](const std::vector<double>& xv, const std::vector<double>& rv, const std::vector<double>& wv,
                      const std::vector<double>& bv) {
        auto y = forward(xv, rv, wv, bv);
        return weighted_sum(g, y[0]) + (with_residual_grad ? weighted_sum(gr, y[1]) : 0.0);
      };
      auto fwd = forward(x, r, w, b);  // out, residual_out, [mean], rstd
      std::vector<std::vector<double>> bin{g, with_residual_grad ? gr : std::vector<double>{}, fwd[1]};
      std::vector<Shape> bshapes{xs, with_residual_grad ? xs : Shape{0}, xs};
      if (!rms) bin.push_back(fwd[2]), bshapes.push_back(ss);
      bin.push_back(fwd[rms ? 2 : 3]), bshapes.push_back(ss);
      bin.push_back(w), bshapes.push_back(ws);
      auto grads = host_norm(op + "_backward", bin, bshapes);
      ASSERT_EQ(grads.size(), rms ? 2u : 3u) << op;
      const std::string what = cat(op, with_residual_grad ? "" : " without grad_residual_out");
      for (int i : {0, 7, 17}) {
        EXPECT_NEAR(grads[0][i], central_difference([&](const auto& v) { return loss(v, r, w, b); }, x, i), 1e-5)
            << what << " d input " << i;
        EXPECT_NEAR(grads[0][i], central_difference([&](const auto& v) { return loss(x, v, w, b); }, r, i), 1e-5)
            << what << " d residual " << i;
      }
      for (int c : {0, 5}) {
        EXPECT_NEAR(grads[1][c], central_difference([&](const auto& v) { return loss(x, r, v, b); }, w, c), 1e-5)
            << what << " d weight " << c;
        if (!rms) {
          EXPECT_NEAR(grads[2][c], central_difference([&](const auto& v) { return loss(x, r, w, v); }, b, c), 1e-5)
              << what << " d bias " << c;
        }
      }
    }
  }
}

/// The residual backward on CUDA against the host (the sweep covers it too), and
/// grad_input written over grad_residual_out refused.
TEST(NormCuda, ResidualBackwardAgainstHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (const std::string op : {"add_rms_norm_backward", "add_layer_norm_backward"}) {
    const bool rms = op == "add_rms_norm_backward";
    for (const Shape& xs : {Shape{7, 40}, Shape{33, 4096}, Shape{5, 3, 130}})
      for (DType t : {DType::bf16, DType::f32}) {
        const Shape rows(xs.begin(), xs.end() - 1), ws{xs.back()};
        const int64_t n = numel(xs);
        std::vector<Operand> in{{small_ints(n, rng), xs, t}, {small_ints(n, rng), xs, t}, {small_ints(n, rng), xs, t}};
        if (!rms) in.push_back({std::vector<double>(numel(rows), 0.25), rows, DType::f32});
        in.push_back({std::vector<double>(numel(rows), 0.5), rows, DType::f32});
        in.push_back({small_ints(xs.back(), rng), ws, t});
        auto want = exec(Backend::host_reference, op, in);
        auto got = exec(Backend::bespoke_cuda, op, in);
        ASSERT_TRUE(want && got) << op << ": " << (want ? got.status() : want.status()).to_string();
        for (size_t j = 0; j < want->size(); ++j)
          for (size_t i = 0; i < (*want)[j].size(); ++i)
            ASSERT_NEAR((*got)[j][i], (*want)[j][i], 2e-2 * (1 + std::abs((*want)[j][i])))
                << op << " " << dtype_name(t) << " " << shape_str(xs) << " output " << j << " element " << i;
      }
  }
}

TEST(NormErrors, ResidualBackwardBadInputIsNamed) {
  const DType f = DType::f32;
  auto message = [](const std::string& op, std::vector<TensorSpec> in) {
    auto r = infer(op, std::move(in), {});
    return error_message(r);
  };
  std::string m = message("add_rms_norm_backward", {{f, {2, 8}}, {f, {2, 7}}, {f, {2, 8}}, {f, {2}}, {f, {8}}});
  EXPECT_NE(m.find("add_rms_norm_backward: 'grad_residual_out' shape [2, 7], expected [2, 8] (residual_out's) or [0]"),
            std::string::npos) << m;
  m = message("add_rms_norm_backward", {{f, {2, 8}}, {DType::f64, {2, 8}}, {f, {2, 8}}, {f, {2}}, {f, {8}}});
  EXPECT_NE(m.find("'grad_residual_out' dtype f64, expected f32"), std::string::npos) << m;
  m = message("add_layer_norm_backward", {{f, {2, 8}}, {f, {0}}, {f, {2, 8}}, {f, {2}}, {f, {3}}, {f, {8}}});
  EXPECT_NE(m.find("add_layer_norm_backward: 'rstd' shape [3], expected [2]"), std::string::npos) << m;
  m = message("add_layer_norm_backward", {{f, {2, 8}}, {f, {0}}, {f, {2, 9}}, {f, {2}}, {f, {2}}, {f, {8}}});
  EXPECT_NE(m.find("'grad_output' shape [2, 8], expected [2, 9]"), std::string::npos) << m;
  m = message("add_layer_norm_backward", {{f, {2, 8}}, {f, {0}}, {f, {1, 1, 1, 1, 1, 1, 1, 2, 8}}, {f, {2}}, {f, {2}},
                                          {f, {8}}});
  EXPECT_NE(m.find("add_layer_norm_backward: 'residual_out' has rank 9, the maximum is 8"), std::string::npos) << m;
  m = message("add_rms_norm_backward", {{f, {2, 8}}, {f, {2, 8}}, {f, {2, 8}}, {f, {2}}});
  EXPECT_NE(m.find("add_rms_norm_backward: expected 5 inputs, got 4"), std::string::npos) << m;
  // grad_input over grad_residual_out: written before grad_residual_out is read.
  const OpDesc desc =
      check(infer("add_rms_norm_backward", {{f, {2, 4}}, {f, {2, 4}}, {f, {2, 4}}, {f, {2}}, {f, {4}}}, {}));
  auto plan = check(select(Stream::host(), desc, {}));
  std::vector<float> buf(4 * 8, 1.f);
  const Shape x{2, 4}, r{2}, w{4};
  auto view = [&](int64_t at, const Shape& shape) { return check(TensorView::contiguous(buf.data() + at, f, shape)); };
  const TensorView g = view(0, x), gr = view(8, x), h = view(16, x), rs = view(24, r), wt = view(26, w);
  std::vector<float> gw(4);
  const TensorView ins[5] = {g, gr, h, rs, wt}, outs[2] = {gr, check(TensorView::contiguous(gw.data(), f, w))};
  const Status st = plan->can_implement(OpArgs{ins, outs});
  EXPECT_NE(st.message().find("output 'grad_input' overlaps input 'grad_residual_out'"), std::string::npos)
      << st.message();
  EXPECT_EQ(find_op("add_rms_norm")->gradient, "add_rms_norm_backward");
  EXPECT_EQ(find_op("add_layer_norm_backward")->gradient, "add_layer_norm");
}

TEST(NormErrors, BadDescriptorsAreNamed) {
  auto w = infer("layer_norm", {{DType::f32, {2, 8}}, {DType::f32, {4}}, {DType::f32, {4}}});
  ASSERT_FALSE(w);
  EXPECT_NE(w.status().message().find("'weight' shape [4], expected [8] (the normalized shape)"), std::string::npos)
      << w.status().message();
  auto k = infer("rms_norm_noaffine", {{DType::f32, {2, 8}}}, {{"normalized_dims", 3}});
  ASSERT_FALSE(k);
  EXPECT_NE(k.status().message().find("normalized shape must cover 1 to 2 trailing dims"), std::string::npos);
  auto st = infer("rms_norm_backward", {{DType::bf16, {2, 8}}, {DType::bf16, {2, 8}}, {DType::bf16, {2}}, {DType::bf16, {8}}});
  ASSERT_FALSE(st);
  EXPECT_NE(st.status().message().find("'rstd' dtype bf16, expected f32"), std::string::npos) << st.status().message();
}

}  // namespace
