// group_norm / instance_norm beyond the generic sweep (tests/test_rows.cpp
// runs every norm op there): closed forms, backward against finite
// differences on the host in f64, strided views against contiguous ones on
// every backend, the running-stat update (in place too), and bad input.
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

std::vector<double> uniform(int64_t n, std::mt19937_64& rng, double lo = -2, double hi = 2) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& e : v) e = u(rng);
  return v;
}

std::vector<std::vector<double>> run_host(const std::string& op, const std::vector<Operand>& in, const Attrs& attrs = {}) {
  auto r = exec(Backend::host_reference, op, in, attrs);
  EXPECT_TRUE(r) << op << ": " << r.status().to_string();
  return r ? *r : std::vector<std::vector<double>>{};
}

TEST(GroupNormKnownValues, ClosedForms) {
  // One group over both channels: mean 4, variance 5.
  const Operand x{{1, 3, 5, 7}, {1, 2, 2}}, w{{1, 2}, {2}}, b{{0, 1}, {2}};
  auto gn = run_host("group_norm", {x, w, b}, {{"num_groups", 1}, {"eps", 0}});
  const double r = 1 / std::sqrt(5.0);
  const std::vector<double> want{-3 * r, -1 * r, 2 * r + 1, 6 * r + 1};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(gn[0][i], want[i], 1e-14) << i;
  EXPECT_DOUBLE_EQ(gn[1][0], 4);
  EXPECT_NEAR(gn[2][0], r, 1e-15);
  // Two groups (one channel each) = instance norm: each channel [-1, 1].
  auto g2 = run_host("group_norm_noaffine", {x}, {{"num_groups", 2}, {"eps", 0}});
  auto in = run_host("instance_norm_noaffine", {x}, {{"eps", 0}});
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(g2[0][i], i % 2 ? 1 : -1, 1e-15) << i;
    EXPECT_EQ(g2[0][i], in[0][i]) << i;
  }
  EXPECT_EQ(in[1], (std::vector<double>{2, 6}));
  // A constant group has exactly zero deviation: out = bias.
  auto c = run_host("group_norm", {{{3, 3, 3, 3}, {1, 2, 2}}, w, b}, {{"num_groups", 1}});
  EXPECT_EQ(c[0], (std::vector<double>{0, 0, 1, 1}));
}

TEST(GroupNormFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(11);
  const Shape xs{2, 4, 3};
  for (const std::string op : {"group_norm", "group_norm_noaffine", "instance_norm", "instance_norm_noaffine"}) {
    const bool affine = op.find("noaffine") == std::string::npos, instance = op.rfind("instance", 0) == 0;
    const Attrs attrs = instance ? Attrs{{"eps", 1e-5}} : Attrs{{"num_groups", 2}, {"eps", 1e-5}};
    auto x = uniform(24, rng), w = uniform(4, rng), b = uniform(4, rng), g = uniform(24, rng);
    auto forward = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      std::vector<Operand> in{{xv, xs}};
      if (affine) in.push_back({wv, {4}}), in.push_back({bv, {4}});
      return run_host(op, in, attrs);
    };
    auto loss = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
      return weighted_sum(g, forward(xv, wv, bv)[0]);
    };
    auto fwd = forward(x, w, b);
    const int64_t G = instance ? 4 : 2;
    std::vector<Operand> bin{{g, xs}, {x, xs}, {fwd[1], {2, G}}, {fwd[2], {2, G}}};
    if (affine) bin.push_back({w, {4}});
    auto grads = run_host(op + "_backward", bin);
    auto by_x = [&](const std::vector<double>& v) { return loss(v, w, b); };
    auto by_w = [&](const std::vector<double>& v) { return loss(x, v, b); };
    auto by_b = [&](const std::vector<double>& v) { return loss(x, w, v); };
    for (int i : {0, 5, 13, 23}) EXPECT_NEAR(grads[0][i], central_difference(by_x, x, i), 1e-5) << op << " dx " << i;
    if (affine)
      for (int c : {0, 3}) {
        EXPECT_NEAR(grads[1][c], central_difference(by_w, w, c), 1e-5) << op << " dw " << c;
        EXPECT_NEAR(grads[2][c], central_difference(by_b, b, c), 1e-5) << op << " db " << c;
      }
  }
}

/// Channels-last input, reversed-stride weight and gradient views: the same
/// values as contiguous operands on every backend (host and CUDA when present).
TEST(GroupNormStrided, ViewsMatchContiguous) {
  std::mt19937_64 rng(3);
  const Shape xs{3, 8, 5, 6};
  const Shape channels_last{8 * 5 * 6, 1, 6 * 8, 8}, padded{8 * 5 * 6 * 2, 5 * 6 * 2, 6 * 2, 2};
  const int64_t n = 3 * 8 * 5 * 6;
  auto x = uniform(n, rng), w = uniform(8, rng), b = uniform(8, rng), g = uniform(n, rng);
  for (Backend backend : host_and_cuda_backends())
    for (DType t : {DType::f64, DType::f32, DType::bf16}) {
      const double tol = t == DType::f64 ? 1e-12 : t == DType::f32 ? 1e-5 : 2e-2;
      const Attrs attrs{{"num_groups", 4}};
      auto plain = exec(backend, "group_norm", {{x, xs, t}, {w, {8}, t}, {b, {8}, t}}, attrs);
      auto strided = exec(backend, "group_norm", {{x, xs, t, channels_last}, {w, {8}, t, {-1}}, {b, {8}, t, {2}}}, attrs);
      ASSERT_TRUE(plain && strided) << (plain ? strided.status() : plain.status()).to_string();
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR((*strided)[0][i], (*plain)[0][i], tol) << i;
      for (size_t i = 0; i < (*plain)[1].size(); ++i) ASSERT_NEAR((*strided)[1][i], (*plain)[1][i], tol) << i;
      const DType st = t == DType::f64 ? DType::f64 : DType::f32;
      const Operand mean{(*plain)[1], {3, 4}, st}, rstd{(*plain)[2], {3, 4}, st};
      auto bw = exec(backend, "group_norm_backward", {{g, xs, t}, {x, xs, t}, mean, rstd, {w, {8}, t}});
      auto bws = exec(backend, "group_norm_backward",
                      {{g, xs, t, padded}, {x, xs, t, channels_last}, {(*plain)[1], {3, 4}, st, {1, 3}}, rstd, {w, {8}, t}});
      ASSERT_TRUE(bw && bws) << (bw ? bws.status() : bw.status()).to_string();
      for (size_t k = 0; k < 3; ++k)
        for (size_t i = 0; i < (*bw)[k].size(); ++i)
          ASSERT_NEAR((*bws)[k][i], (*bw)[k][i], tol * (k ? 8 : 1)) << backend_name(backend) << " output " << k << " " << i;
    }
}

/// Groups too long for the shared-memory kernel take the three-step CUDA path
/// (the sweep's small shapes all fit): CUDA against the host reference.
TEST(GroupNormLongGroups, CudaMatchesHost) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937_64 rng(4);
  const Shape xs{2, 4, 30000};  // f32 groups of 120000 elements: 480 KB
  const int64_t n = 2 * 4 * 30000;
  auto x = uniform(n, rng), w = uniform(4, rng), b = uniform(4, rng), g = uniform(n, rng);
  const Shape strided{4 * 30000 * 2, 30000 * 2, 2};
  for (const Shape& st : {Shape{}, strided}) {
    std::vector<Operand> in{{x, xs, DType::f32, st}, {w, {4}, DType::f32}, {b, {4}, DType::f32}};
    auto host = exec(Backend::host_reference, "group_norm", in, {{"num_groups", 1}});
    auto cuda = exec(Backend::bespoke_cuda, "group_norm", in, {{"num_groups", 1}});
    ASSERT_TRUE(host && cuda) << (host ? cuda.status() : host.status()).to_string();
    for (size_t k = 0; k < 3; ++k)
      for (size_t i = 0; i < (*host)[k].size(); ++i) ASSERT_NEAR((*cuda)[k][i], (*host)[k][i], 1e-4) << k << " " << i;
    std::vector<Operand> bin{{g, xs, DType::f32, st}, {x, xs, DType::f32}, {(*host)[1], {2, 1}, DType::f32},
                             {(*host)[2], {2, 1}, DType::f32}, {w, {4}, DType::f32}};
    auto hb = exec(Backend::host_reference, "group_norm_backward", bin);
    auto cb = exec(Backend::bespoke_cuda, "group_norm_backward", bin);
    ASSERT_TRUE(hb && cb) << (hb ? cb.status() : hb.status()).to_string();
    for (size_t k = 0; k < 3; ++k)
      for (size_t i = 0; i < (*hb)[k].size(); ++i)
        ASSERT_NEAR((*cb)[k][i], (*hb)[k][i], k ? 2e-2 : 1e-4) << "backward " << k << " " << i;
  }
}

/// f32 weight and bias with half inputs: the same numbers as half parameters
/// holding the same (exactly representable) values; gradients come back in f32.
TEST(GroupNormMixedParams, F32WeightsWithHalfInput) {
  std::mt19937_64 rng(9);
  const Shape xs{2, 4, 6};
  auto x = uniform(48, rng), g = uniform(48, rng);
  const std::vector<double> w{0.5, -1.25, 2, 3}, b{0.25, 0, -1, 1.5};
  for (Backend backend : host_and_cuda_backends())
    for (DType t : {DType::bf16, DType::f16}) {
      const Attrs attrs{{"num_groups", 2}};
      auto same = exec(backend, "group_norm", {{x, xs, t}, {w, {4}, t}, {b, {4}, t}}, attrs);
      auto mixed = exec(backend, "group_norm", {{x, xs, t}, {w, {4}, DType::f32}, {b, {4}, DType::f32}}, attrs);
      ASSERT_TRUE(same && mixed) << (same ? mixed.status() : same.status()).to_string();
      EXPECT_EQ((*same)[0], (*mixed)[0]);
      const Operand mean{(*same)[1], {2, 2}, DType::f32}, rstd{(*same)[2], {2, 2}, DType::f32};
      auto bw = exec(backend, "group_norm_backward", {{g, xs, t}, {x, xs, t}, mean, rstd, {w, {4}, DType::f32}});
      auto bs = exec(backend, "group_norm_backward", {{g, xs, t}, {x, xs, t}, mean, rstd, {w, {4}, t}});
      ASSERT_TRUE(bw && bs) << (bw ? bs.status() : bw.status()).to_string();
      EXPECT_EQ((*bw)[0], (*bs)[0]);
      for (size_t k = 1; k < 3; ++k)
        for (size_t c = 0; c < 4; ++c) EXPECT_NEAR((*bw)[k][c], (*bs)[k][c], 2e-2 * (1 + std::abs((*bw)[k][c])));
    }
  auto d = infer("group_norm_backward", {{DType::bf16, {2, 4, 6}}, {DType::bf16, {2, 4, 6}}, {DType::f32, {2, 2}},
                                         {DType::f32, {2, 2}}, {DType::f32, {4}}});
  ASSERT_TRUE(d) << d.status().to_string();
  EXPECT_EQ(d->outputs[1].dtype, DType::f32);
  auto bad = infer("group_norm", {{DType::bf16, {2, 4, 6}}, {DType::f32, {4}}, {DType::bf16, {4}}}, {{"num_groups", 2}});
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("'bias' dtype bf16, expected f32"), std::string::npos) << bad.status().message();
}

TEST(InstanceNormRunningStats, UpdateMatchesTorchFormula) {
  std::mt19937_64 rng(8);
  const Shape xs{3, 2, 4};
  auto x = uniform(24, rng);
  auto fwd = run_host("instance_norm_noaffine", {{x, xs}}, {{"eps", 1e-5}});
  const std::vector<double> rm{0.5, -1}, rv{2, 0.25};
  const Attrs attrs{{"momentum", 0.2}, {"eps", 1e-5}, {"spatial", 4}};
  auto up = run_host("instance_norm_running_stats", {{rm, {2}}, {rv, {2}}, {fwd[1], {3, 2}}, {fwd[2], {3, 2}}}, attrs);
  for (int c = 0; c < 2; ++c) {
    double mean = 0, var = 0;
    for (int n = 0; n < 3; ++n) {
      double m = 0, v = 0;
      for (int s = 0; s < 4; ++s) m += x[(n * 2 + c) * 4 + s] / 4;
      for (int s = 0; s < 4; ++s) v += std::pow(x[(n * 2 + c) * 4 + s] - m, 2) / 3;  // unbiased
      mean += m / 3, var += v / 3;
    }
    EXPECT_NEAR(up[0][c], 0.8 * rm[c] + 0.2 * mean, 1e-12) << c;
    EXPECT_NEAR(up[1][c], 0.8 * rv[c] + 0.2 * var, 1e-10) << c;
  }
  // In place: the running tensors given as the outputs.
  std::vector<double> m = rm, v = rv, mean = fwd[1], rstd = fwd[2];
  std::vector<TensorView> in{*TensorView::contiguous(m.data(), DType::f64, Shape{2}),
                             *TensorView::contiguous(v.data(), DType::f64, Shape{2}),
                             *TensorView::contiguous(mean.data(), DType::f64, Shape{3, 2}),
                             *TensorView::contiguous(rstd.data(), DType::f64, Shape{3, 2})};
  ASSERT_TRUE(run_op(Stream::host(), "instance_norm_running_stats", in, std::span(in.data(), 2), attrs));
  EXPECT_EQ(m, up[0]);
  EXPECT_EQ(v, up[1]);
}

// Instance norm of no channels (found by the fuzz: a division by the zero group count on the host)
// plans, runs and writes nothing, forward and backward, on every backend.
TEST(GroupNormEmpty, NoChannelsRunsAsANoOp) {
  for (Backend backend : host_and_cuda_backends())
    for (DType t : {DType::f32, DType::bf16}) {
      const Operand x{{}, {2, 0, 6}, t}, w{{}, {0}, t}, stats{{}, {2, 0}, DType::f32};
      auto fwd = exec(backend, "instance_norm", {x, w, w});
      ASSERT_TRUE(fwd) << backend_name(backend) << ": " << fwd.status().to_string();
      for (const auto& out : *fwd) EXPECT_TRUE(out.empty());
      auto bwd = exec(backend, "instance_norm_backward", {x, x, stats, stats, w});
      ASSERT_TRUE(bwd) << backend_name(backend) << ": " << bwd.status().to_string();
      for (const auto& out : *bwd) EXPECT_TRUE(out.empty());
    }
}

TEST(GroupNormErrors, BadDescriptorsAreNamed) {
  auto msg = [](const std::string& op, std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer(op, std::move(in), attrs);
    EXPECT_FALSE(r) << op;
    return r ? std::string() : r.status().message();
  };
  const TensorSpec x{DType::f32, {2, 6, 5}}, w{DType::f32, {6}};
  std::string m = msg("group_norm", {x, w, w}, {{"num_groups", 4}});
  EXPECT_TRUE(has(m, "num_groups 4 must divide the channels C = 6 of 'input' [2, 6, 5]")) << m;
  m = msg("group_norm", {x, {DType::f32, {5}}, w}, {{"num_groups", 2}});
  EXPECT_TRUE(has(m, "'weight' shape [5], expected [6] (one per channel)")) << m;
  m = msg("group_norm", {x, w, {DType::f16, {6}}}, {{"num_groups", 2}});
  EXPECT_TRUE(has(m, "'bias' dtype f16, expected f32")) << m;
  m = msg("group_norm_noaffine", {{DType::f32, {6}}});
  EXPECT_TRUE(has(m, "'input' must be [N, C, *] (rank >= 2), got shape [6]")) << m;
  m = msg("group_norm_noaffine", {x}, {{"num_groups", 0}});
  EXPECT_TRUE(has(m, "'num_groups' must be a positive integer")) << m;
  m = msg("instance_norm_noaffine", {{DType::f32, {2, 6}}});
  EXPECT_TRUE(has(m, "rank >= 3; instance norm needs spatial dims")) << m;
  m = msg("instance_norm_noaffine", {{DType::f32, {2, 6, 1}}});
  EXPECT_TRUE(has(m, "expected more than 1 spatial element")) << m;
  m = msg("group_norm_backward", {x, x, {DType::bf16, {2, 3}}, {DType::f32, {2, 3}}, w});
  EXPECT_TRUE(has(m, "'mean' dtype bf16, expected f32")) << m;
  m = msg("group_norm_backward", {x, x, {DType::f32, {2, 4}}, {DType::f32, {2, 4}}, w});
  EXPECT_TRUE(has(m, "num_groups 4 must divide")) << m;
  m = msg("group_norm_noaffine", {{DType::i32, {2, 6}}});
  EXPECT_TRUE(has(m, "dtype i32 is not supported")) << m;
  m = msg("instance_norm_running_stats", {w, w, {DType::f32, {2, 6}}, {DType::f32, {2, 6}}});
  EXPECT_TRUE(has(m, "'spatial'")) << m;
  m = msg("instance_norm_running_stats", {w, w, {DType::f32, {2, 5}}, {DType::f32, {2, 5}}}, {{"spatial", 4}});
  EXPECT_TRUE(has(m, "'mean' shape [2, 5], expected [N, 6]")) << m;
}

}  // namespace
