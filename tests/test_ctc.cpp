// ctc_loss: the loss against a brute-force sum over every alignment (tiny
// T), reductions and zero_infinity, the backward against finite differences
// on the host in f64, every backend, dtype (fp8: the forward) and target
// layout against the host reference, and bad input. (The generic sweep in test_loss.cpp covers
// padded i64 targets over every dtype and layout.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "core/errors.hpp"  // BARACUDA_TRY, which exec.hpp uses
#include "exec.hpp"

using namespace baracuda;
using namespace baracuda::testing_support;

namespace {

/// -log of the sum over every path of I classes that collapses to `target`.
double brute_force_nll(const std::vector<double>& lp, int64_t C, int64_t I, const std::vector<int64_t>& target,
                       int64_t blank) {
  int64_t paths = 1;
  for (int64_t t = 0; t < I; ++t) paths *= C;
  double total = 0;
  for (int64_t code = 0; code < paths; ++code) {
    std::vector<int64_t> path(I), collapsed;
    double logp = 0;
    for (int64_t t = 0, v = code; t < I; ++t, v /= C) path[t] = v % C, logp += lp[t * C + path[t]];
    for (int64_t t = 0; t < I; ++t)
      if (path[t] != blank && (t == 0 || path[t] != path[t - 1])) collapsed.push_back(path[t]);
    if (collapsed == target) total += std::exp(logp);
  }
  return -std::log(total);
}

std::vector<double> random_log_probs(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<double> u(-2.5, -0.1);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

/// Each row of C values shifted to a log-softmax (normalised log-probabilities).
std::vector<double> normalised(std::vector<double> v, int64_t C) {
  for (size_t r = 0; r < v.size() / size_t(C); ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, v[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(v[r * C + c] - m);
    for (int64_t c = 0; c < C; ++c) v[r * C + c] -= m + std::log(s);
  }
  return v;
}

Operand f64(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::f64}; }
Operand ints(std::vector<double> v, Shape s, DType d = DType::i64) { return {std::move(v), std::move(s), d}; }

std::vector<std::vector<double>> must(Result<std::vector<std::vector<double>>> r) {
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : std::vector<std::vector<double>>{};
}

Attrs reduction(double r, double blank = 0, double zero_infinity = 0) {
  return Attrs{{"reduction", r}, {"blank", blank}, {"zero_infinity", zero_infinity}};
}

TEST(CtcKnownValues, MatchesBruteForceOverAlignments) {
  std::mt19937 rng(7);
  const int64_t T = 5, C = 3;
  // (input length, target): repeats, empty, a blank other than 0, infeasible, shorter than T.
  struct Case {
    int64_t I;
    std::vector<int64_t> target;
    int64_t blank;
  };
  const std::vector<Case> cases{{5, {1, 2}, 0}, {5, {1, 1}, 0}, {4, {2, 2, 1}, 0}, {5, {}, 0},
                                {3, {0, 0}, 2},  {2, {1, 1}, 0}, {0, {}, 0},       {1, {2}, 0}};
  for (const Case& c : cases) {
    const auto lp = random_log_probs(T * C, rng);
    std::vector<double> tg(3, 1);
    for (size_t k = 0; k < c.target.size(); ++k) tg[k] = double(c.target[k]);
    auto out = must(exec(Backend::host_reference, "ctc_loss",
                         {f64(lp, {T, 1, C}), ints(tg, {1, 3}), ints({double(c.I)}, {1}),
                          ints({double(c.target.size())}, {1})},
                         reduction(0, double(c.blank))));
    const double want = c.I == 0 ? (c.target.empty() ? 0.0 : INFINITY) : brute_force_nll(lp, C, c.I, c.target, c.blank);
    if (std::isinf(want)) EXPECT_EQ(out[0][0], want) << "I=" << c.I;
    else EXPECT_NEAR(out[0][0], want, 1e-12 * std::max(1.0, std::abs(want))) << "I=" << c.I;
  }
}

TEST(CtcKnownValues, ReductionsLayoutsAndZeroInfinity) {
  std::mt19937 rng(3);
  const int64_t T = 6, N = 3, C = 4;
  const auto lp = random_log_probs(T * N * C, rng);
  const std::vector<double> padded{1, 2, 3, 3, 0, 0, 2, 2, 1}, lengths{3, 1, 3}, inputs{6, 2, 4};
  auto per = must(exec(Backend::host_reference, "ctc_loss",
                       {f64(lp, {T, N, C}), ints(padded, {N, 3}), ints(inputs, {N}), ints(lengths, {N})}, reduction(0)));
  ASSERT_EQ(per.size(), 1u);
  // Sample 2 needs 4 steps for 2 2 1 (a blank between the repeats): feasible in exactly 4.
  for (int64_t b = 0; b < N; ++b) {
    std::vector<double> one(T * C);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) one[t * C + c] = lp[(t * N + b) * C + c];
    std::vector<int64_t> target;
    for (int64_t k = 0; k < int64_t(lengths[b]); ++k) target.push_back(int64_t(padded[b * 3 + k]));
    EXPECT_NEAR(per[0][b], brute_force_nll(one, C, int64_t(inputs[b]), target, 0), 1e-11) << "sample " << b;
  }
  double sum = 0, mean = 0;
  for (int64_t b = 0; b < N; ++b) sum += per[0][b], mean += per[0][b] / lengths[b] / N;
  const std::vector<Operand> in{f64(lp, {T, N, C}), ints(padded, {N, 3}), ints(inputs, {N}), ints(lengths, {N})};
  EXPECT_NEAR(must(exec(Backend::host_reference, "ctc_loss", in, reduction(2)))[0][0], sum, 1e-12);
  EXPECT_NEAR(must(exec(Backend::host_reference, "ctc_loss", in, reduction(1)))[0][0], mean, 1e-12);
  // Concatenated i32 targets and i32 lengths give the same losses.
  auto cat = must(exec(Backend::host_reference, "ctc_loss",
                       {f64(lp, {T, N, C}), ints({1, 2, 3, 3, 2, 2, 1}, {7}, DType::i32), ints(inputs, {N}, DType::i32),
                        ints(lengths, {N}, DType::i32)},
                       reduction(0)));
  for (int64_t b = 0; b < N; ++b) EXPECT_EQ(cat[0][b], per[0][b]) << "sample " << b;
  // Infeasible sample 1 (input length 1 for target 3 3): inf, or 0 with zero_infinity.
  const std::vector<Operand> infeasible{f64(lp, {T, N, C}), ints({1, 0, 0, 3, 3, 0, 2, 0, 0}, {N, 3}),
                                        ints({6, 1, 5}, {N}), ints({1, 2, 1}, {N})};
  auto inf = must(exec(Backend::host_reference, "ctc_loss", infeasible, reduction(0)));
  EXPECT_EQ(inf[0][1], INFINITY);
  auto zeroed = must(exec(Backend::host_reference, "ctc_loss", infeasible, reduction(0, 0, 1)));
  EXPECT_EQ(zeroed[0][1], 0.0);
  EXPECT_EQ(zeroed[0][0], inf[0][0]);
  auto grad = must(exec(Backend::host_reference, "ctc_loss_backward",
                        {f64({1, 1, 1}, {N}), infeasible[0], infeasible[1], infeasible[2], infeasible[3]},
                        reduction(0, 0, 1)));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) EXPECT_EQ(grad[0][(t * N + 1) * C + c], 0.0);
  // Unbatched: [T, C], targets [S], scalar lengths.
  std::vector<double> first(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) first[t * C + c] = lp[(t * N) * C + c];
  auto single = must(exec(Backend::host_reference, "ctc_loss",
                          {f64(first, {T, C}), ints({1, 2, 3}, {3}), ints({6}, {}), ints({3}, {})}, reduction(0)));
  EXPECT_EQ(single[0][0], per[0][0]);
}

TEST(CtcFiniteDifferences, BackwardMatchesForward) {
  std::mt19937 rng(11);
  const int64_t T = 7, N = 3, C = 5;
  const std::vector<double> targets{1, 2, 2, 3, 0, 0, 4, 1, 4}, inputs{7, 4, 6}, lengths{3, 1, 3};
  for (double r : {0.0, 1.0, 2.0}) {
    for (double blank : {0.0, 2.0}) {
      std::vector<double> tg = targets;
      if (blank == 2)
        for (auto& v : tg) v = v == 2 ? 0 : v;
      const auto lp = normalised(random_log_probs(T * N * C, rng), C);
      const std::vector<double> go = r == 0 ? std::vector<double>{0.7, -1.3, 0.4} : std::vector<double>{0.8};
      const Shape go_shape = r == 0 ? Shape{N} : Shape{};
      auto grad = must(exec(Backend::host_reference, "ctc_loss_backward",
                            {f64(go, go_shape), f64(lp, {T, N, C}), ints(tg, {N, 3}), ints(inputs, {N}), ints(lengths, {N})},
                            reduction(r, blank)));
      auto loss = [&](const std::vector<double>& x) {
        auto out = must(exec(Backend::host_reference, "ctc_loss",
                             {f64(x, {T, N, C}), ints(tg, {N, 3}), ints(inputs, {N}), ints(lengths, {N})},
                             reduction(r, blank)));
        double v = 0;
        for (size_t i = 0; i < out[0].size(); ++i) v += go[i] * out[0][i];
        return v;
      };
      const double h = 1e-6;
      for (int64_t i = 0; i < T * N * C; ++i) {
        auto up = lp, down = lp;
        up[i] += h, down[i] -= h;
        // torch's gradient is that of the logits of a log_softmax producing lp (lp normalised here):
        // the finite difference goes through that normalisation.
        const double fd = (loss(normalised(up, C)) - loss(normalised(down, C))) / (2 * h);
        EXPECT_NEAR(grad[0][i], fd, 1e-6) << "reduction " << r << " blank " << blank << " element " << i;
      }
    }
  }
}

/// Every backend against the host reference in f64, outputs NaN-poisoned by exec:
/// padded and concatenated targets, i32 and i64, unbatched, strided log_probs.
TEST(CtcBackends, MatchTheHostReference) {
  std::mt19937 rng(5);
  const int64_t T = 40, N = 5, C = 9, S = 6;
  std::uniform_int_distribution<int> label(1, int(C) - 1), len(0, int(S));
  std::vector<double> tl(N), il(N), padded(N * S, 1), concat;
  for (int64_t b = 0; b < N; ++b) {
    tl[b] = len(rng);
    il[b] = T - 3 * b;
    for (int64_t k = 0; k < int64_t(tl[b]); ++k) padded[b * S + k] = label(rng), concat.push_back(padded[b * S + k]);
  }
  tl[1] = 2, padded[1 * S] = padded[1 * S + 1] = 3;  // a repeat
  concat.clear();
  for (int64_t b = 0; b < N; ++b)
    for (int64_t k = 0; k < int64_t(tl[b]); ++k) concat.push_back(padded[b * S + k]);
  const auto lp = random_log_probs(T * N * C, rng);
  const std::vector<double> go{0.5, -1, 2, 0.25, 1.5};
  struct Variant {
    const char* name;
    std::vector<Operand> in;  // log_probs, targets, input_lengths, target_lengths
  };
  Operand strided = f64(lp, {T, N, C});
  strided.strides = {1, T * C, T};  // [T, N, C] read through a permuted layout
  std::vector<double> first(T * C);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) first[t * C + c] = lp[(t * N) * C + c];
  std::vector<Variant> variants{
      {"padded i64", {f64(lp, {T, N, C}), ints(padded, {N, S}), ints(il, {N}), ints(tl, {N})}},
      {"concatenated i32",
       {f64(lp, {T, N, C}), ints(concat, {int64_t(concat.size())}, DType::i32), ints(il, {N}, DType::i32),
        ints(tl, {N}, DType::i32)}},
      {"strided", {strided, ints(padded, {N, S}), ints(il, {N}), ints(tl, {N})}},
      {"unbatched",
       {f64(first, {T, C}), ints(std::vector<double>(padded.begin(), padded.begin() + S), {S}), ints({il[0]}, {}),
        ints({tl[0]}, {})}},
  };
  for (const Variant& v : variants) {
    const bool batched = v.in[0].shape.size() == 3;
    for (double r : {0.0, 1.0, 2.0}) {
      const Attrs attrs = reduction(r);
      std::vector<Operand> bin = v.in;
      const Shape go_shape = r == 0 && batched ? Shape{N} : Shape{};
      bin.insert(bin.begin(), f64(std::vector<double>(go.begin(), go.begin() + (go_shape.empty() ? 1 : N)), go_shape));
      for (Backend backend : host_and_cuda_backends()) {
        for (DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64, DType::fp8_e4m3, DType::fp8_e5m2}) {
          auto in = v.in;
          auto gin = bin;
          in[0].dtype = gin[1].dtype = gin[0].dtype = dt;
          const bool fp8 = dt == DType::fp8_e4m3 || dt == DType::fp8_e5m2;
          // fp8: the loss is rounded to 3 (e4m3) or 2 (e5m2) mantissa bits: half an ulp is 2^-4 or 2^-3 of it.
          const double tol = dt == DType::f64 ? 1e-10 : dt == DType::f32 ? 1e-4 : dt == DType::f16 ? 2e-2
                             : dt == DType::bf16 ? 1.5e-1 : dt == DType::fp8_e4m3 ? 0.07 : 0.13;
          // Half inputs are rounded: the reference runs on the rounded values.
          auto rounded = [&](std::vector<Operand> ops, size_t k) {
            for (auto& x : ops[k].values) {
              double buffer = 0;  // room for any float dtype
              store_double(&buffer, dt, 0, x);
              x = load_double(&buffer, dt, 0);
            }
            ops[k].dtype = DType::f64;
            return ops;
          };
          const auto want = must(exec(Backend::host_reference, "ctc_loss", rounded(in, 0), attrs));
          const auto got = must(exec(backend, "ctc_loss", in, attrs));
          if (got.empty()) continue;
          for (size_t i = 0; i < want[0].size(); ++i)
            EXPECT_NEAR(got[0][i], want[0][i], tol * std::max(1.0, std::abs(want[0][i])))
                << v.name << " " << backend_name(backend) << " " << dtype_name(dt) << " r=" << r << " loss " << i;
          if (fp8) {  // fp8 forwards have no gradient: the backward says so
            auto refused = exec(backend, "ctc_loss_backward", gin, attrs);
            ASSERT_FALSE(refused) << v.name << " " << dtype_name(dt) << ": ctc_loss_backward took fp8";
            EXPECT_NE(refused.status().message().find("no gradient"), std::string::npos) << refused.status().message();
            continue;
          }
          auto gref_in = rounded(rounded(gin, 1), 0);
          const auto gwant = must(exec(Backend::host_reference, "ctc_loss_backward", gref_in, attrs));
          const auto ggot = must(exec(backend, "ctc_loss_backward", gin, attrs));
          if (ggot.empty()) continue;
          for (size_t i = 0; i < gwant[0].size(); ++i)
            EXPECT_NEAR(ggot[0][i], gwant[0][i], tol)
                << v.name << " " << backend_name(backend) << " " << dtype_name(dt) << " r=" << r << " grad " << i;
        }
      }
    }
  }
}

// The CUDA kernel keeps the first 256 target positions' repeat chains and the first 256 classes'
// log-probabilities in shared memory: targets past 256 positions (chains that cross it), more than
// 256 classes with the blank past them, and targets long enough that the rolling rows leave shared memory.
TEST(CtcBackends, LongTargetsManyClasses) {
  std::mt19937 rng(11);
  struct Case {
    int64_t T, N, C, S, blank;
  };
  for (const Case& k : {Case{700, 2, 300, 300, 299}, Case{2400, 1, 6, 1600, 0}}) {
    std::uniform_int_distribution<int> label(k.blank == 0 ? 1 : 0, k.blank == 0 ? int(k.C) - 1 : 11);  // many repeats
    std::vector<double> tg(k.N * k.S), il(k.N, double(k.T)), tl(k.N);
    for (int64_t b = 0; b < k.N; ++b) tl[b] = double(k.S - 7 * b);
    for (auto& v : tg) v = label(rng);
    const auto lp = normalised(random_log_probs(k.T * k.N * k.C, rng), k.C);
    const Attrs attrs = reduction(0, double(k.blank));
    const std::vector<Operand> in64{f64(lp, {k.T, k.N, k.C}), ints(tg, {k.N, k.S}), ints(il, {k.N}), ints(tl, {k.N})};
    std::vector<Operand> gin64 = in64;
    gin64.insert(gin64.begin(), f64(std::vector<double>(k.N, 1.0), {k.N}));
    const auto want = must(exec(Backend::host_reference, "ctc_loss", in64, attrs));
    const auto gwant = must(exec(Backend::host_reference, "ctc_loss_backward", gin64, attrs));
    for (DType dt : {DType::f32, DType::f64}) {
      const double tol = dt == DType::f64 ? 1e-9 : k.S > 1000 ? 1e-2 : 2e-3;
      std::vector<Operand> in = in64, gin = gin64;
      in[0].dtype = gin[0].dtype = gin[1].dtype = dt;
      for (Backend backend : host_and_cuda_backends()) {
        const auto got = must(exec(backend, "ctc_loss", in, attrs));
        const auto ggot = must(exec(backend, "ctc_loss_backward", gin, attrs));
        if (got.empty() || ggot.empty()) continue;
        for (size_t i = 0; i < want[0].size(); ++i)
          EXPECT_NEAR(got[0][i], want[0][i], tol * std::max(1.0, std::abs(want[0][i])))
              << "S " << k.S << " " << backend_name(backend) << " " << dtype_name(dt) << " loss " << i;
        for (size_t i = 0; i < gwant[0].size(); ++i)
          ASSERT_NEAR(ggot[0][i], gwant[0][i], tol) << "S " << k.S << " " << backend_name(backend) << " " << dtype_name(dt)
                                                    << " grad " << i;
      }
    }
  }
}

TEST(CtcErrors, BadInputIsNamed) {
  const int64_t T = 4, N = 2, C = 3;
  const std::vector<double> lp(T * N * C, -1.0);
  auto run = [&](std::vector<Operand> in, Attrs attrs = reduction(1)) {
    auto r = exec(Backend::host_reference, "ctc_loss", in, attrs);
    return r ? std::string("ok") : r.status().message();
  };
  const Operand x = f64(lp, {T, N, C});
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({5, 4}, {N}), ints({2, 1}, {N})}), "'input_lengths'[0] = 5"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({3, 1}, {N})}), "'target_lengths'[0] = 3"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, -1}, {N})}), "'target_lengths'[1] = -1"));
  EXPECT_TRUE(has(run({x, ints({1, 3, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}), "label 3"));
  EXPECT_TRUE(has(run({x, ints({1, 0, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}), "equal to blank 0"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1}, {3}), ints({4, 4}, {N}), ints({2, 2}, {N})}), "sum to 4"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}, reduction(1, 3)), "'blank'"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {3}), ints({2, 1}, {N})}), "'input_lengths' shape"));
  EXPECT_TRUE(has(run({x, f64({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}), "'targets' must be i64 or i32"));
  EXPECT_TRUE(has(run({x, ints({1, 2, 1, 1, 1, 1}, {3, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}), "'targets' must be"));
  EXPECT_TRUE(has(run({f64(lp, {T * N * C}), ints({1}, {1}), ints({4}, {}), ints({1}, {})}), "'log_probs' must be"));
  EXPECT_EQ(run({x, ints({1, 2, 1, 1}, {N, 2}), ints({4, 4}, {N}), ints({2, 1}, {N})}), "ok");
}

}  // namespace
