// linear_cross_entropy: the composition linear -> cross_entropy and finite
// differences on the host in f64, and the fp8 forward on every backend (the
// generic sweep in test_loss.cpp covers every dtype on small shapes; bad
// input is there too).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/errors.hpp"  // BARACUDA_TRY, which exec.hpp uses
#include "exec.hpp"

using namespace baracuda;
using namespace baracuda::testing_support;

namespace {

Operand f64(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::f64}; }
Operand idx(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::i64}; }

std::vector<std::vector<double>> must(Result<std::vector<std::vector<double>>> r) {
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : std::vector<std::vector<double>>{};
}

Result<std::vector<std::vector<double>>> host_exec(const std::string& op, const std::vector<Operand>& inputs,
                                                   const Attrs& attrs = {}) {
  return exec(Backend::host_reference, op, inputs, attrs);
}

/// Deterministic pseudo-random values in [lo, hi].
std::vector<double> uniform(size_t n, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST(LinearCrossEntropy, MatchesLinearThenCrossEntropy) {
  const int64_t N = 5, H = 4, V = 6;
  const auto x = uniform(N * H, -1, 1, 1), w = uniform(V * H, -1, 1, 2), b = uniform(V, -1, 1, 3);
  const std::vector<double> t{2, -100, 0, 5, 3};
  for (bool biased : {true, false})
    for (bool weighted : {false, true}) {
    const Operand bias = biased ? f64(b, {V}) : f64({}, {0});
    const Operand cls_w = weighted ? f64(uniform(V, 0.5, 2, 8), {V}) : f64({}, {0});  // torch's class weights
    for (const Attrs& attrs : {Attrs{{"reduction", 1}}, Attrs{{"reduction", 2}, {"label_smoothing", 0.3}},
                               Attrs{{"reduction", 0}, {"label_smoothing", 0.1}}, Attrs{{"reduction", 1}, {"label_smoothing", 0.2}}}) {
      const bool none = attrs.get("reduction", 1) == 0;
      // The composition: logits = linear(x, w, b), then cross_entropy and both backwards.
      auto z = must(host_exec("linear", {f64(x, {N, H}), f64(w, {V, H}), bias}));
      auto ce = must(host_exec("cross_entropy", {f64(z[0], {N, V}), idx(t, {N}), cls_w}, attrs));
      auto ours = must(host_exec("linear_cross_entropy", {f64(x, {N, H}), f64(w, {V, H}), idx(t, {N}), bias, cls_w}, attrs));
      ASSERT_EQ(ours[0].size(), ce[0].size());
      for (size_t i = 0; i < ce[0].size(); ++i) EXPECT_NEAR(ours[0][i], ce[0][i], 1e-12) << i;
      const Operand g = none ? f64(uniform(N, -1, 1, 4), {N}) : f64({0.7}, {});
      auto dz = must(host_exec("cross_entropy_backward", {g, f64(z[0], {N, V}), idx(t, {N}), cls_w, f64(ce[1], {N})}, attrs));
      auto lin = must(host_exec("linear_backward", {f64(dz[0], {N, V}), f64(x, {N, H}), f64(w, {V, H})},
                                biased ? Attrs{} : Attrs{{"bias", 0}}));
      auto grads = must(host_exec("linear_cross_entropy_backward", {g, f64(x, {N, H}), f64(w, {V, H}), idx(t, {N}), bias, cls_w}, attrs));
      for (int k = 0; k < 2; ++k)
        for (size_t i = 0; i < lin[k].size(); ++i) EXPECT_NEAR(grads[k][i], lin[k][i], 1e-12) << "grad " << k << " " << i;
      if (biased)  // grad_bias: the column sums of dlogits
        for (int64_t v = 0; v < V; ++v) {
          double sum = 0;
          for (int64_t r = 0; r < N; ++r) sum += dz[0][r * V + v];
          EXPECT_NEAR(grads[2][v], sum, 1e-12) << v;
        }
      if (none) continue;
      // The fused op: the loss and the gradients for grad_output = 1.
      auto fused = must(host_exec("linear_cross_entropy_fused", {f64(x, {N, H}), f64(w, {V, H}), idx(t, {N}), bias, cls_w}, attrs));
      EXPECT_NEAR(fused[0][0], ce[0][0], 1e-12);
      for (int k = 0; k < (biased ? 3 : 2); ++k)
        for (size_t i = 0; i < grads[k].size(); ++i) EXPECT_NEAR(fused[k + 1][i] * 0.7, grads[k][i], 1e-12) << k << " " << i;
    }
  }
  // Every row ignored: the mean is 0 / 0 (NaN, as torch) and the gradients 0.
  auto all = must(host_exec("linear_cross_entropy_fused", {f64(x, {N, H}), f64(w, {V, H}), idx(std::vector<double>(N, -100), {N}),
                                                           f64({}, {0}), f64({}, {0})}));
  EXPECT_TRUE(std::isnan(all[0][0]));
  for (double v : all[2]) EXPECT_EQ(v, 0.0);
}

TEST(LinearCrossEntropy, FiniteDifferences) {
  const int64_t N = 3, H = 2, V = 4;
  auto x = uniform(N * H, -1, 1, 5), w = uniform(V * H, -1, 1, 6), b = uniform(V, -1, 1, 7);
  const std::vector<double> t{1, 3, -1};
  const Operand cls = f64({0.5, 1.5, 0.8, 2.0}, {V});
  for (const Attrs& attrs : {Attrs{{"reduction", 1}, {"ignore_index", -1}, {"label_smoothing", 0.2}},
                             Attrs{{"reduction", 0}, {"ignore_index", -1}}, Attrs{{"reduction", 2}, {"ignore_index", -1}}})
    for (bool weighted : {false, true}) {
    const Operand cls_w = weighted ? cls : f64({}, {0});
    const bool none = attrs.get("reduction", 1) == 0;
    const Operand g = none ? f64({0.3, -1.2, 0.8}, {N}) : f64({1.5}, {});
    auto objective = [&](const std::vector<double>& xs, const std::vector<double>& ws, const std::vector<double>& bs) {
      auto f = must(host_exec("linear_cross_entropy", {f64(xs, {N, H}), f64(ws, {V, H}), idx(t, {N}), f64(bs, {V}), cls_w}, attrs));
      double l = 0;
      for (size_t i = 0; i < g.values.size(); ++i) l += g.values[i] * f[0][i];
      return l;
    };
    auto grads = must(host_exec("linear_cross_entropy_backward", {g, f64(x, {N, H}), f64(w, {V, H}), idx(t, {N}), f64(b, {V}), cls_w}, attrs));
    const double h = 1e-6;
    std::vector<double>* params[3] = {&x, &w, &b};
    for (int k = 0; k < 3; ++k)
      for (size_t i = 0; i < params[k]->size(); ++i) {
        const double keep = (*params[k])[i];
        (*params[k])[i] = keep + h;
        const double up = objective(x, w, b);
        (*params[k])[i] = keep - h;
        const double down = objective(x, w, b);
        (*params[k])[i] = keep;
        EXPECT_NEAR(grads[k][i], (up - down) / (2 * h), 1e-6)
            << "reduction " << attrs.get("reduction", 1) << " weighted " << weighted << " grad " << k << " i " << i;
      }
  }
}

/// fp8 storage (the forward only, Note [fp8 linear CE]): every backend against the host reference
/// on the fp8-rounded operands, over chunks with a tail, bias, class weights and smoothing; H 64 takes
/// cuBLASLt's fp8 product on the GPU, H 40 (not a multiple of 16) and a transposed weight the bespoke one.
TEST(LinearCrossEntropy, Fp8ForwardOnEveryBackend) {
  const int64_t N = 300, V = 1000;
  for (DType dt : {DType::fp8_e4m3, DType::fp8_e5m2})
    for (int64_t H : {64, 40})
      for (bool transposed : {false, true}) {
        auto rounded = [&](std::vector<double> v) {
          for (auto& x : v) {
            double buffer = 0;
            store_double(&buffer, dt, 0, x);
            x = load_double(&buffer, dt, 0);
          }
          return v;
        };
        const auto x = rounded(uniform(N * H, -1, 1, 21)), w = rounded(uniform(V * H, -0.5, 0.5, 22));
        const auto b = rounded(uniform(V, -1, 1, 23)), cls = rounded(uniform(V, 0.5, 2, 24));
        std::vector<double> t(N);
        for (int64_t r = 0; r < N; ++r) t[r] = r % 17 == 0 ? -100 : double((r * 37) % V);
        Operand weight = f64(w, {V, H});
        if (transposed) weight.strides = {1, V};  // the same logical [V, H] weight stored [H, V]
        for (const Attrs& attrs : {Attrs{{"reduction", 1}, {"chunk_rows", 128}}, Attrs{{"reduction", 0}, {"label_smoothing", 0.1}},
                                   Attrs{{"reduction", 2}, {"chunk_rows", 77}}}) {
          const std::vector<Operand> ref{f64(x, {N, H}), weight, idx(t, {N}), f64(b, {V}), f64(cls, {V})};
          const auto want = must(host_exec("linear_cross_entropy", ref, attrs));
          std::vector<Operand> in = ref;
          for (size_t k : {0, 1, 3, 4}) in[k].dtype = dt;
          // The loss is rounded to fp8 once: half an ulp is 2^-4 (e4m3) or 2^-3 (e5m2) of it.
          const double tol = dt == DType::fp8_e4m3 ? 0.07 : 0.13;
          for (Backend backend : host_and_cuda_backends()) {
            const auto got = must(exec(backend, "linear_cross_entropy", in, attrs));
            if (got.empty()) continue;
            ASSERT_EQ(got[0].size(), want[0].size());
            int64_t checked = 0;
            for (size_t i = 0; i < want[0].size(); ++i) {
              const std::string where = cat(dtype_name(dt), " H ", H, " transposed ", transposed, " ", backend_name(backend),
                                            " reduction ", attrs.get("reduction", 1), " row ", i);
              // A sum past e4m3's 448 rounds to NaN (no infinity in e4m3), as torch's cast does.
              if (std::isnan(rounded({want[0][i]})[0])) {
                EXPECT_TRUE(std::isnan(got[0][i])) << where << ": " << got[0][i];
                ++checked;
                continue;
              }
              checked += want[0][i] != 0;
              EXPECT_NEAR(got[0][i], want[0][i], tol * std::abs(want[0][i]) + 1e-6) << where;
            }
            EXPECT_GT(checked, 0);
          }
        }
      }
}

}  // namespace
