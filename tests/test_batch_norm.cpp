// batch_norm and batch_norm_backward beyond the generic sweep (test_rows.cpp
// runs the registry sweep for the whole norm category): closed forms, the
// running-stat update (in place), eval mode, finite differences on the host
// in f64, same-dtype half parameters, large and channels-last problems on
// CUDA against the host, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#include "exec.hpp"
#include "gradcheck.hpp"

using namespace baracuda;
using namespace baracuda::testing_support;

namespace {

using Outs = std::vector<std::vector<double>>;

Operand f64(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::f64, {}}; }
Operand absent(DType d = DType::f64) { return {{}, {0}, d, {}}; }

Outs host(const std::string& op, const std::vector<Operand>& in, const Attrs& attrs) {
  auto r = exec(Backend::host_reference, op, in, attrs);
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : Outs{};
}

std::vector<double> random_values(int64_t n, std::mt19937_64& rng, double lo = -2, double hi = 2) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

TEST(BatchNormKnownValues, TrainingStatisticsAndRunningUpdate) {
  // x [N=2, C=2, S=2]: channel 0 holds {1, 3, 5, 7} (mean 4, biased var 5,
  // unbiased 20/3), channel 1 holds {2, 2, 2, 2} (var 0).
  const std::vector<double> x{1, 3, 2, 2, 5, 7, 2, 2};
  auto o = host("batch_norm", {f64(x, {2, 2, 2}), f64({2, 1}, {2}), f64({0.5, -1}, {2}), f64({1, 0}, {2}), f64({2, 3}, {2})},
                {{"training", 1}, {"momentum", 0.25}, {"eps", 1e-300}});
  const double is0 = 1 / std::sqrt(5.0);
  EXPECT_NEAR(o[0][0], (1 - 4) * is0 * 2 + 0.5, 1e-12);
  EXPECT_NEAR(o[0][5], (7 - 4) * is0 * 2 + 0.5, 1e-12);
  EXPECT_NEAR(o[0][2], -1, 1e-12);  // zero deviation: bias only
  EXPECT_NEAR(o[1][0], 4, 1e-12);   // save_mean
  EXPECT_NEAR(o[1][1], 2, 1e-12);
  EXPECT_NEAR(o[2][0], is0, 1e-12);  // save_invstd
  EXPECT_NEAR(o[3][0], 0.75 * 1 + 0.25 * 4, 1e-12);        // running_mean_out
  EXPECT_NEAR(o[3][1], 0.25 * 2, 1e-12);
  EXPECT_NEAR(o[4][0], 0.75 * 2 + 0.25 * 20.0 / 3, 1e-12);  // unbiased variance
  EXPECT_NEAR(o[4][1], 0.75 * 3, 1e-12);
  // No parameters, no running stats: plain standardisation; running outputs are [0].
  auto p = host("batch_norm", {f64(x, {2, 2, 2}), absent(), absent(), absent(), absent()}, {{"training", 1}});
  EXPECT_NEAR(p[0][0], -3 / std::sqrt(5 + 1e-5), 1e-12);
  EXPECT_TRUE(p[3].empty() && p[4].empty());
  // [N, C] input (no spatial dims): statistics down the columns.
  auto q = host("batch_norm", {f64({1, 10, 3, 30}, {2, 2}), absent(), absent(), absent(), absent()},
                {{"training", 1}, {"eps", 0}});
  EXPECT_NEAR(q[0][0], -1, 1e-12);
  EXPECT_NEAR(q[0][3], 1, 1e-12);
  EXPECT_NEAR(q[1][1], 20, 1e-12);
}

TEST(BatchNormKnownValues, EvalUsesRunningStats) {
  const std::vector<double> x{1, 3, 2, 2, 5, 7, 2, 2};
  auto o = host("batch_norm", {f64(x, {2, 2, 2}), f64({2, 1}, {2}), f64({0.5, -1}, {2}), f64({1, 0}, {2}), f64({3, 8}, {2})},
                {{"training", 0}, {"eps", 1}});
  EXPECT_NEAR(o[0][0], (1 - 1) / 2.0 * 2 + 0.5, 1e-12);
  EXPECT_NEAR(o[0][5], (7 - 1) / 2.0 * 2 + 0.5, 1e-12);
  EXPECT_NEAR(o[0][2], 2 / 3.0 - 1, 1e-12);
  EXPECT_NEAR(o[1][0], 1, 1e-12);    // save_mean: the running mean used
  EXPECT_NEAR(o[2][1], 1 / 3.0, 1e-12);  // save_invstd: 1 / sqrt(8 + 1)
  EXPECT_EQ(o[3], (std::vector<double>{1, 0}));  // running stats unchanged
  EXPECT_EQ(o[4], (std::vector<double>{3, 8}));
  // Backward in eval: grad_input = g * weight * invstd.
  auto b = host("batch_norm_backward",
                {f64({1, 1, 1, 1, 2, 2, 2, 2}, {2, 2, 2}), f64(x, {2, 2, 2}), f64({2, 1}, {2}), absent(), absent(),
                 f64({1, 0}, {2}), f64({3, 8}, {2})},
                {{"training", 0}, {"eps", 1}});
  EXPECT_NEAR(b[0][0], 1 * 2 / 2.0, 1e-12);
  EXPECT_NEAR(b[0][6], 2 * 1 / 3.0, 1e-12);
  EXPECT_NEAR(b[2][0], 6, 1e-12);  // grad_bias = sum g
  EXPECT_NEAR(b[1][0], (0 + 2 + 2 * 4 + 2 * 6) / 2.0, 1e-12);  // sum g * (x - mean) * invstd
}

TEST(BatchNormRunningStats, UpdatedInPlace) {
  std::vector<double> x{1, 3, 2, 2, 5, 7, 2, 2}, out(8), save_mean(2), save_invstd(2);
  std::vector<double> rm{1, 0}, rv{2, 3};
  auto v = [](std::vector<double>& d, Shape s) { return *TensorView::contiguous(d.data(), DType::f64, s); };
  std::vector<double> none;
  const TensorView empty = *TensorView::contiguous(none.data(), DType::f64, Shape{0});
  const TensorView in[] = {v(x, {2, 2, 2}), empty, empty, v(rm, {2}), v(rv, {2})};
  const TensorView outs[] = {v(out, {2, 2, 2}), v(save_mean, {2}), v(save_invstd, {2}), v(rm, {2}), v(rv, {2})};
  for (int step = 0; step < 2; ++step)
    ASSERT_TRUE(run_op(Stream::host(), "batch_norm", in, outs, {{"training", 1}, {"momentum", 0.5}}));
  // Two steps of running = 0.5 running + 0.5 batch.
  EXPECT_NEAR(rm[0], 0.25 * 1 + 0.75 * 4, 1e-12);
  EXPECT_NEAR(rm[1], 0.75 * 2, 1e-12);
  EXPECT_NEAR(rv[0], 0.25 * 2 + 0.75 * 20.0 / 3, 1e-12);
  EXPECT_NEAR(rv[1], 0.25 * 3, 1e-12);
}

/// sum(g * out) differentiated numerically through input, weight and bias.
TEST(BatchNormFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(11);
  const Shape xs{3, 2, 4}, cs{2};
  const int64_t n = 24;
  for (double training : {1.0, 0.0}) {
    auto x = random_values(n, rng), g = random_values(n, rng), w = random_values(2, rng), b = random_values(2, rng);
    const std::vector<double> rm{0.3, -0.2}, rv{0.7, 1.6};
    const Attrs attrs{{"training", training}, {"eps", 1e-3}};
    auto forward = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      return host("batch_norm", {f64(xv, xs), f64(wv, cs), f64(bv, cs), f64(rm, cs), f64(rv, cs)}, attrs);
    };
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      return weighted_sum(g, forward(xv, wv, bv)[0]);
    };
    auto f = forward(x, w, b);
    auto grads = host("batch_norm_backward",
                      {f64(g, xs), f64(x, xs), f64(w, cs), f64(f[1], cs), f64(f[2], cs), f64(rm, cs), f64(rv, cs)}, attrs);
    auto by_x = [&](const std::vector<double>& v) { return loss(v, w, b); };
    auto by_w = [&](const std::vector<double>& v) { return loss(x, v, b); };
    auto by_b = [&](const std::vector<double>& v) { return loss(x, w, v); };
    for (int i : {0, 5, 13, 23})
      EXPECT_NEAR(grads[0][i], central_difference(by_x, x, i), 1e-6) << "training " << training << " dx " << i;
    for (int c : {0, 1}) {
      EXPECT_NEAR(grads[1][c], central_difference(by_w, w, c), 1e-6) << "training " << training << " dw " << c;
      EXPECT_NEAR(grads[2][c], central_difference(by_b, b, c), 1e-6) << "training " << training << " db " << c;
    }
  }
}

TEST(BatchNormErrors, BadInputsAreNamed) {
  auto msg = [](const std::string& op, std::vector<TensorSpec> in, const Attrs& attrs) {
    auto d = infer(op, std::move(in), attrs);
    EXPECT_FALSE(d);
    return d ? std::string() : d.status().message();
  };
  const TensorSpec none{DType::f32, {0}};
  std::string m = msg("batch_norm", {{DType::f32, {4, 8, 3}}, {DType::f32, {4}}, none, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "'weight' shape [4], expected [8] (the channel count, input dim 1) or [0] (absent)")) << m;
  m = msg("batch_norm", {{DType::f32, {4, 8}}, none, none, {DType::f32, {8}}, {DType::f32, {7}}}, {{"training", 1}});
  EXPECT_TRUE(has(m, "'running_var' shape [7], expected [8]")) << m;
  m = msg("batch_norm", {{DType::f32, {1, 3}}, none, none, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "expected more than 1 value per channel when training, got input size [1, 3]")) << m;
  m = msg("batch_norm", {{DType::f32, {1, 3, 1, 1}}, none, none, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "expected more than 1 value per channel")) << m;
  m = msg("batch_norm", {{DType::f32, {5}}, none, none, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "'input' must be [N, C, *] (rank >= 2, channels in dim 1), got shape [5]")) << m;
  m = msg("batch_norm", {{DType::f32, {4, 3}}, none, none, none, none}, {{"training", 0}});
  EXPECT_TRUE(has(m, "eval mode (training=0) needs 'running_mean' and 'running_var'")) << m;
  m = msg("batch_norm", {{DType::f32, {4, 3}}, none, none, {DType::f32, {3}}, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "give both 'running_mean' and 'running_var', or neither")) << m;
  m = msg("batch_norm", {{DType::bf16, {4, 3}}, {DType::f32, {3}}, {DType::bf16, {3}}, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "'bias' dtype bf16, expected f32 (weight, bias and running stats share one dtype)")) << m;
  m = msg("batch_norm", {{DType::f32, {4, 3}}, {DType::f16, {3}}, none, none, none}, {{"training", 1}});
  EXPECT_TRUE(has(m, "parameter dtype f16, expected f32 (input dtype f32)")) << m;
  m = msg("batch_norm_backward",
          {{DType::f32, {4, 3}}, {DType::f32, {4, 3}}, none, {DType::f32, {3}}, {DType::f32, {2}}, none, none},
          {{"training", 1}});
  EXPECT_TRUE(has(m, "'save_invstd' shape [2], expected [3]")) << m;
  m = msg("batch_norm_backward", {{DType::f32, {4, 3}}, {DType::f32, {4, 3}}, none, none, none, none, none},
          {{"training", 1}});
  EXPECT_TRUE(has(m, "training=1 needs 'save_mean' and 'save_invstd'")) << m;
  m = msg("batch_norm_backward", {{DType::f32, {4, 2}}, {DType::f32, {4, 3}}, none, none, none, none, none},
          {{"training", 1}});
  EXPECT_TRUE(has(m, "'grad_output' f32[4, 2] != 'input' f32[4, 3]")) << m;
  auto i = infer("batch_norm", {{DType::i32, {4, 3}}, none, none, none, none}, {{"training", 1}});
  ASSERT_FALSE(i);
  EXPECT_TRUE(has(i.status().message(), "dtype i32 is not supported")) << i.status().message();
}

/// `x` [N, C, H, W] laid out channels-last: strides of an NHWC buffer.
/// Inside an NHWC buffer `width` positions wide (>= W; wider: the space does
/// not coalesce into one dim, rows of W positions).
Shape channels_last_in(const Shape& s, int64_t width) { return {s[1] * s[2] * width, 1, width * s[1], s[1]}; }
Shape channels_last(const Shape& s) { return channels_last_in(s, s[3]); }

/// Every output of `op` on each backend against the host reference in f64;
/// the backends' output j laid out with output_strides[j] when given.
void check_backends(const std::string& op, const std::vector<Operand>& in, const Attrs& attrs, double tol,
                    const std::string& what, const std::vector<Shape>& output_strides = {}) {
  std::vector<Operand> ref = in;
  for (auto& o : ref) {  // the values each backend sees: rounded to the operand's dtype
    for (auto& v : o.values) {
      double buf[2];
      harness::store_double(buf, o.dtype, 0, v);
      v = harness::load_double(buf, o.dtype, 0);
    }
    o.dtype = DType::f64, o.strides = {};
  }
  auto want = host(op, ref, attrs);
  for (Backend b : host_and_cuda_backends()) {
    auto got = exec(b, op, in, attrs, {}, output_strides);
    ASSERT_TRUE(got) << what << ": " << got.status().to_string();
    ASSERT_EQ(got->size(), want.size());
    for (size_t j = 0; j < want.size(); ++j) {
      ASSERT_EQ((*got)[j].size(), want[j].size());
      int bad = 0;
      for (size_t e = 0; e < want[j].size(); ++e) {
        const double w = want[j][e], g = (*got)[j][e];
        if (!(std::abs(g - w) <= tol * (1 + std::abs(w))) && bad++ < 3)
          ADD_FAILURE() << what << " " << backend_name(b) << " output " << j << " element " << e << ": got " << g
                        << ", expected " << w;
      }
    }
  }
}

/// Large spaces (several chunks per channel on CUDA), channels-first and
/// channels-last (whole or inside a wider buffer), f32 / bf16 with bf16
/// (same-dtype) or f32 parameters.
TEST(BatchNormBackends, LargeAndChannelsLast) {
  std::mt19937_64 rng(7);
  enum Layout { nchw, nhwc, nhwc_in_wider };
  struct Case {
    Shape shape;
    Layout layout;
    DType t, p;
    double tol;
  };
  const std::vector<Case> cases = {
      {{8, 6, 33, 65}, nchw, DType::f32, DType::f32, 2e-5},  {{8, 6, 32, 64}, nchw, DType::f32, DType::f32, 2e-5},
      {{8, 40, 17, 19}, nhwc, DType::f32, DType::f32, 2e-5},   {{4, 16, 64, 64}, nchw, DType::bf16, DType::bf16, 2e-2},
      {{4, 48, 16, 16}, nhwc, DType::bf16, DType::f32, 2e-2},  {{2, 8, 48, 48}, nchw, DType::f16, DType::f16, 4e-3},
      {{3, 5, 40, 41}, nchw, DType::f64, DType::f64, 1e-11}, {{40000, 3, 1, 1}, nchw, DType::f32, DType::f32, 2e-5},
      {{512, 4, 3, 3}, nchw, DType::f32, DType::f32, 2e-5},
      // Channels-last with hundreds of splits per channel (the split merge's batched loads and its tail).
      {{32, 8, 32, 40}, nhwc, DType::f32, DType::f32, 2e-5},    {{16, 16, 40, 40}, nhwc, DType::bf16, DType::f32, 2e-2},
      // Channels-last whose space is rows of W positions (the general offset walk), vectors and scalars.
      {{4, 24, 10, 13}, nhwc_in_wider, DType::bf16, DType::f32, 2e-2},
      {{6, 40, 9, 11}, nhwc_in_wider, DType::f32, DType::f32, 2e-5},
      {{5, 5, 12, 7}, nhwc_in_wider, DType::f32, DType::f32, 2e-5},
  };
  for (const Case& k : cases) {
    const int64_t n = numel(k.shape), c = k.shape[1];
    const Shape strides = k.layout == nhwc            ? channels_last(k.shape)
                          : k.layout == nhwc_in_wider ? channels_last_in(k.shape, k.shape[3] + 3)
                                                      : Shape{};
    auto x = random_values(n, rng, 1, 3), g = random_values(n, rng);  // mean far from 0: a shifted-sum test
    auto w = random_values(c, rng), b = random_values(c, rng), rm = random_values(c, rng, -0.5, 0.5),
         rv = random_values(c, rng, 0.5, 2);
    auto vec = [&](const std::vector<double>& v) { return Operand{v, {c}, k.p, {}}; };
    // Channels-last: out / grad_input row-major (scalar walks), then in x's layout (16-byte vectors).
    std::vector<std::vector<Shape>> output_layouts{{}};
    if (k.layout != nchw) output_layouts.push_back({strides});
    for (const auto& out_strides : output_layouts) {
      for (double training : {1.0, 0.0}) {
        const Attrs attrs{{"training", training}, {"momentum", 0.2}};
        const char* layout = k.layout == nchw   ? " "
                             : k.layout == nhwc ? " channels-last "
                                                : " channels-last (wider buffer) ";
        const std::string what = shape_str(k.shape) + layout + dtype_name(k.t) + "/" + dtype_name(k.p) +
                                 (training == 1 ? " training" : " eval") + (out_strides.empty() ? "" : ", out like x");
        check_backends("batch_norm", {Operand{x, k.shape, k.t, strides}, vec(w), vec(b), vec(rm), vec(rv)}, attrs,
                       k.tol, what, out_strides);
        // Saved statistics from the f64 forward, as f32 (f64 for f64) operands.
        auto f = host("batch_norm", {f64(x, k.shape), f64(w, {c}), f64(b, {c}), f64(rm, {c}), f64(rv, {c})}, attrs);
        const DType s = k.t == DType::f64 ? DType::f64 : DType::f32;
        check_backends("batch_norm_backward",
                       {Operand{g, k.shape, k.t, strides}, Operand{x, k.shape, k.t, strides}, vec(w),
                        Operand{f[1], {c}, s, {}}, Operand{f[2], {c}, s, {}}, vec(rm), vec(rv)},
                       Attrs{{"training", training}}, k.tol * 4, what + " backward", out_strides);
      }
    }
  }
}

/// An outlier as the first element of every channel (the first element each
/// walk meets): the shifted sums must not all be taken about it, else every
/// partial's sum of squares cancels (0.9-1.7e-3 relative error in the
/// variance here by a float32 model of the walk, 1-1.5e-5 with each
/// thread's own shift; 2e-4 is the bound).
TEST(BatchNormBackends, OutlierFirstElementKeepsVariancePrecise) {
  std::mt19937_64 rng(23);
  const Shape s{16, 8, 32, 32};
  const int64_t n = numel(s), c = s[1];
  auto x = random_values(n, rng, -1, 1);
  for (int64_t k = 0; k < c; ++k) x[k * s[2] * s[3]] = 1e4;  // element (0, k, 0, 0), NCHW order
  auto w = random_values(c, rng), b = random_values(c, rng), rm = random_values(c, rng, -0.5, 0.5),
       rv = random_values(c, rng, 0.5, 2);
  auto vec = [&](const std::vector<double>& v) { return Operand{v, {c}, DType::f32, {}}; };
  for (const Shape& strides : {Shape{}, channels_last(s)}) {
    check_backends("batch_norm", {Operand{x, s, DType::f32, strides}, vec(w), vec(b), vec(rm), vec(rv)},
                   Attrs{{"training", 1}, {"momentum", 1}}, 2e-4, strides.empty() ? "NCHW" : "NHWC", {strides});
  }
}

/// The plans' kernels captured into a CUDA graph and replayed (twice) give
/// the direct run's bits, forward and backward, in both walks.
TEST(BatchNormBackends, CudaGraphReplayMatchesDirectRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(17);
  const Shape s{8, 64, 12, 12};
  const int64_t n = numel(s), c = s[1];
  auto x = random_values(n, rng), g = random_values(n, rng), w = random_values(c, rng), b = random_values(c, rng);
  for (DType t : {DType::f32, DType::bf16}) {
    for (const Shape& strides : {Shape{}, channels_last(s)}) {
      const std::string what = std::string(dtype_name(t)) + (strides.empty() ? " NCHW" : " NHWC");
      const Attrs attrs{{"training", 1}};
      const std::vector<Operand> in{Operand{x, s, t, strides}, Operand{w, {c}, DType::f32, {}},
                                    Operand{b, {c}, DType::f32, {}}, absent(DType::f32), absent(DType::f32)};
      const std::vector<Shape> out_strides{strides};
      auto direct = exec(Backend::bespoke_cuda, "batch_norm", in, attrs, {}, out_strides);
      auto graphed = exec(Backend::bespoke_cuda, "batch_norm", in, attrs, {}, out_strides, 2);
      ASSERT_TRUE(direct && graphed) << what << ": " << (direct ? graphed : direct).status().to_string();
      EXPECT_EQ(*direct, *graphed) << what;
      const std::vector<Operand> bin{Operand{g, s, t, strides}, Operand{x, s, t, strides}, Operand{w, {c}, DType::f32, {}},
                                     Operand{(*direct)[1], {c}, DType::f32, {}}, Operand{(*direct)[2], {c}, DType::f32, {}},
                                     absent(DType::f32), absent(DType::f32)};
      auto bdirect = exec(Backend::bespoke_cuda, "batch_norm_backward", bin, attrs, {}, out_strides);
      auto bgraphed = exec(Backend::bespoke_cuda, "batch_norm_backward", bin, attrs, {}, out_strides, 2);
      ASSERT_TRUE(bdirect && bgraphed) << what << " backward: " << (bdirect ? bgraphed : bdirect).status().to_string();
      EXPECT_EQ(*bdirect, *bgraphed) << what << " backward";
    }
  }
}

/// Two CUDA runs give bitwise equal results (fixed-order merges, no atomics).
TEST(BatchNormBackends, CudaIsDeterministic) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(13);
  const Shape s{16, 32, 40, 40};
  const int64_t n = numel(s);
  auto x = random_values(n, rng), g = random_values(n, rng), w = random_values(32, rng);
  for (const Shape& strides : {Shape{}, channels_last(s)}) {
    const Attrs attrs{{"training", 1}};
    const std::vector<Operand> in{Operand{x, s, DType::f32, strides}, Operand{w, {32}, DType::f32, {}}, absent(DType::f32),
                                  absent(DType::f32), absent(DType::f32)};
    auto a = exec(Backend::bespoke_cuda, "batch_norm", in, attrs), b = exec(Backend::bespoke_cuda, "batch_norm", in, attrs);
    ASSERT_TRUE(a && b);
    EXPECT_EQ(*a, *b);
    const std::vector<Operand> bin{Operand{g, s, DType::f32, strides}, Operand{x, s, DType::f32, strides},
                                   Operand{w, {32}, DType::f32, {}}, Operand{(*a)[1], {32}, DType::f32, {}},
                                   Operand{(*a)[2], {32}, DType::f32, {}}, absent(DType::f32), absent(DType::f32)};
    auto c = exec(Backend::bespoke_cuda, "batch_norm_backward", bin, attrs);
    auto d = exec(Backend::bespoke_cuda, "batch_norm_backward", bin, attrs);
    ASSERT_TRUE(c && d);
    EXPECT_EQ(*c, *d);
  }
}

}  // namespace
