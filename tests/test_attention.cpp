// Attention family: every op x dtype x size x layout x option set against the
// host reference on every candidate (cuDNN and the bespoke CUDA kernels with
// a GPU); the host reference against a naive softmax written here; gradients
// against finite differences; dropout's rate and reproducibility; packed
// sequences against per-sequence dense attention; bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "attention/engine.hpp"
#include "attention/score.hpp"
#include "attention/tiles.hpp"
#include "baracuda/registry.hpp"
#include "core/errors.hpp"
#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif
#include "exec.hpp"
#include "harness.hpp"
#include "sweep.hpp"

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

/// The dense SDPA ops (packed sequences need valid offsets: AttentionVarlen
/// covers them; RoPE, the KV cache and decoding have their own tests).
std::vector<std::string> dense_ops() { return {"scaled_dot_product_attention", "scaled_dot_product_attention_backward"}; }

class Attention : public testing::TestWithParam<std::string> {};
TEST_P(Attention, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Attention, BespokeCudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
TEST_P(Attention, CudnnMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  OpInfo halves = *find_op(GetParam());
  halves.dtypes = {DType::f16, DType::bf16};
  // cuDNN refuses odd head dims, dropout (its RNG is not ours), a softcap
  // beside a band and ALiBi slopes in select: those cases are skipped; some must run.
  sweep(halves, Backend::cudnn);
}
INSTANTIATE_TEST_SUITE_P(Ops, Attention, testing::ValuesIn(dense_ops()), param_name);

/// Whether the bespoke Hopper kernels (wgmma: the forward and the backward, head dims other than 64 and
/// 128 padded to them) can run here.
bool hopper_wgmma() {
#if defined(BARACUDA_HAS_CUDA) && defined(BARACUDA_HAS_SM90A)
  return cuda_available() && current_sm_version() == 90;
#else
  return false;
#endif
}

/// The bespoke CUDA plan `select` gives for these operands' dtypes and shapes (other preferences as `pref`'s).
Result<PlanPtr> bespoke_plan(const std::string& op, const std::vector<Operand>& operands, const Attrs& attrs,
                             PlanPreference pref = {}) {
  std::vector<TensorSpec> specs;
  for (const Operand& x : operands) specs.push_back({x.dtype, x.shape});
  pref.backend = Backend::bespoke_cuda;
  return select(Stream::cuda(), OpDesc{op, specs, {}, attrs}, pref);
}

std::vector<double> uniform(int64_t n, std::mt19937& rng, double lo = -1, double hi = 1) {
  std::uniform_real_distribution<double> dist(lo, hi);
  std::vector<double> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

struct Sizes {
  int64_t b, hq, hkv, sq, skv, d, dv;
};

/// The operands of a dense attention backward (grad_output, q, k, v, out:
/// uniform in [-1, 1]; lse in [3, 6]; no mask, no ALiBi slopes), head dim
/// s.d for every operand.
std::vector<Operand> random_backward_operands(const Sizes& s, DType t, std::mt19937& rng) {
  const Shape qs{s.b, s.hq, s.sq, s.d}, ks{s.b, s.hkv, s.skv, s.d};
  const int64_t nq = s.b * s.hq * s.sq * s.d, nk = s.b * s.hkv * s.skv * s.d;
  return {{uniform(nq, rng), qs, t},
          {uniform(nq, rng), qs, t},
          {uniform(nk, rng), ks, t},
          {uniform(nk, rng), ks, t},
          {uniform(nq, rng), qs, t},
          {uniform(s.b * s.hq * s.sq, rng, 3, 6), {s.b, s.hq, s.sq}, DType::f32},
          {{}, {0}, t},
          {{}, {0}, DType::f32}};
}

/// Attention written out naively: every score, a max-subtracted softmax.
/// mask: additive values over [sq, skv] (-inf hides), shared by every head.
std::vector<double> naive(const Sizes& s, const std::vector<double>& q, const std::vector<double>& k,
                          const std::vector<double>& v, const std::vector<double>& mask, double scale, bool causal,
                          double softcap, const std::vector<double>& slopes) {
  std::vector<double> out(size_t(s.b * s.hq * s.sq * s.dv), 0.0);
  for (int64_t b = 0; b < s.b; ++b)
    for (int64_t h = 0; h < s.hq; ++h) {
      const int64_t hk = h / (s.hq / s.hkv);
      for (int64_t i = 0; i < s.sq; ++i) {
        std::vector<double> sc(size_t(s.skv));
        double mx = -INFINITY;
        for (int64_t j = 0; j < s.skv; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < s.d; ++d)
            dot += q[((b * s.hq + h) * s.sq + i) * s.d + d] * k[((b * s.hkv + hk) * s.skv + j) * s.d + d];
          double x = dot * scale;
          if (softcap > 0) x = softcap * std::tanh(x / softcap);
          if (!slopes.empty()) x -= slopes[h] * std::abs(double(i - j));
          if (!mask.empty()) x += mask[i * s.skv + j];
          if (causal && j > i) x = -INFINITY;
          sc[j] = x;
          mx = std::max(mx, x);
        }
        double sum = 0;
        for (double& x : sc) sum += (x = std::exp(x - mx));
        for (int64_t j = 0; j < s.skv; ++j)
          for (int64_t d = 0; d < s.dv; ++d)
            out[((b * s.hq + h) * s.sq + i) * s.dv + d] += sc[j] / sum * v[((b * s.hkv + hk) * s.skv + j) * s.dv + d];
      }
    }
  return out;
}

/// The host reference (and the CUDA kernels) against the naive formula: GQA,
/// causal, an additive mask, softcap and ALiBi, each on its own.
TEST(AttentionReference, MatchesNaiveSoftmax) {
  std::mt19937 rng(5);
  const Sizes s{2, 4, 2, 6, 9, 8, 5};
  const auto q = uniform(s.b * s.hq * s.sq * s.d, rng), k = uniform(s.b * s.hkv * s.skv * s.d, rng),
             v = uniform(s.b * s.hkv * s.skv * s.dv, rng), mask = uniform(s.sq * s.skv, rng, -2, 2),
             slopes_d = uniform(s.hq, rng, 0, 0.5);
  const std::vector<double> none;
  struct Case {
    const char* name;
    Attrs attrs;
    bool mask, causal, alibi;
    double softcap;
  };
  const Case cases[] = {{"plain", {}, false, false, false, 0},
                        {"scale", {{"scale", 0.3}}, false, false, false, 0},
                        {"causal", {{"causal", 1}}, false, true, false, 0},
                        {"mask", {}, true, false, false, 0},
                        {"softcap", {{"softcap", 0.7}}, false, false, false, 0.7},
                        {"alibi", {}, false, false, true, 0}};
  for (Backend backend : host_and_cuda_backends())
    for (const Case& c : cases) {
      for (DType t : {DType::f64, DType::f32}) {
        const DType lt = t == DType::f64 ? DType::f64 : DType::f32;  // lse and ALiBi slopes
        std::vector<Operand> in{{q, {s.b, s.hq, s.sq, s.d}, t},
                                {k, {s.b, s.hkv, s.skv, s.d}, t},
                                {v, {s.b, s.hkv, s.skv, s.dv}, t},
                                c.mask ? Operand{mask, {s.sq, s.skv}, t} : Operand{{}, {0}, t},
                                c.alibi ? Operand{slopes_d, {s.hq}, lt} : Operand{{}, {0}, lt}};
        std::vector<double> slopes;
        if (c.alibi)
          for (double x : slopes_d) slopes.push_back(t == DType::f64 ? x : double(float(x)));
        auto got = exec(backend, "scaled_dot_product_attention", in, c.attrs);
        ASSERT_TRUE(got) << got.status().to_string();
        const double scale = c.attrs.get("scale", 1 / std::sqrt(double(s.d)));
        const auto want = naive(s, q, k, v, c.mask ? mask : none, scale, c.causal, c.softcap, slopes);
        const double tol = t == DType::f64 ? 1e-12 : 2e-6;
        for (size_t e = 0; e < want.size(); ++e)
          ASSERT_NEAR((*got)[0][e], want[e], tol) << c.name << " " << backend_name(backend) << " element " << e;
      }
    }
}

/// A boolean mask that hides every key of a row gives that row 0 and lse -inf;
/// the window keeps exactly the keys it names.
TEST(AttentionReference, BooleanMaskAndWindow) {
  std::mt19937 rng(6);
  const Sizes s{1, 1, 1, 4, 6, 4, 4};
  const auto q = uniform(16, rng), k = uniform(24, rng), v = uniform(24, rng);
  std::vector<double> keep(24, 1.0);
  for (int j = 0; j < 6; ++j) keep[1 * 6 + j] = 0;  // row 1 sees nothing
  keep[2 * 6 + 0] = 0;                              // row 2 loses key 0
  std::vector<double> additive(24, 0.0);
  for (size_t e = 0; e < 24; ++e) additive[e] = keep[e] ? 0 : -INFINITY;
  for (Backend backend : host_and_cuda_backends()) {
    auto got = exec(backend, "scaled_dot_product_attention",
                    {{q, {1, 1, 4, 4}, DType::f64}, {k, {1, 1, 6, 4}, DType::f64}, {v, {1, 1, 6, 4}, DType::f64},
                     {keep, {4, 6}, DType::boolean}, {{}, {0}, DType::f64}});
    ASSERT_TRUE(got) << got.status().to_string();
    std::vector<double> masked = additive;
    for (int j = 0; j < 6; ++j) masked[6 + j] = 0;  // the naive formula on row 1 is undefined: compare the others
    const auto want = naive(s, q, k, v, masked, 0.5, false, 0, {});
    for (int64_t i : {0, 2, 3})
      for (int d = 0; d < 4; ++d) EXPECT_NEAR((*got)[0][i * 4 + d], want[i * 4 + d], 1e-12) << backend_name(backend);
    for (int d = 0; d < 4; ++d) EXPECT_EQ((*got)[0][4 + d], 0.0) << backend_name(backend);
    EXPECT_EQ((*got)[1][1], -INFINITY) << backend_name(backend);

    // window_left 1, window_right 0, bottom-right: query i (at i + 2) sees keys i + 1 and i + 2.
    auto win = exec(backend, "scaled_dot_product_attention",
                    {{q, {1, 1, 4, 4}, DType::f64}, {k, {1, 1, 6, 4}, DType::f64}, {v, {1, 1, 6, 4}, DType::f64},
                     {{}, {0}, DType::f64}, {{}, {0}, DType::f64}},
                    {{"window_left", 1}, {"window_right", 0}, {"bottom_right", 1}});
    ASSERT_TRUE(win) << win.status().to_string();
    std::vector<double> band(24, -INFINITY);
    for (int i = 0; i < 4; ++i) band[i * 6 + i + 1] = band[i * 6 + i + 2] = 0;
    const auto want_band = naive(s, q, k, v, band, 0.5, false, 0, {});
    for (size_t e = 0; e < want_band.size(); ++e) EXPECT_NEAR((*win)[0][e], want_band[e], 1e-12) << backend_name(backend);
  }
}

/// Backward against central differences of the host forward in f64, over the
/// options (dropout included: its mask is a fixed function of the seed).
TEST(AttentionGradients, MatchFiniteDifferences) {
  std::mt19937 rng(9);
  const Sizes s{1, 4, 2, 5, 7, 3, 4};
  struct Case {
    const char* name;
    Attrs attrs;
    bool mask, alibi;
  };
  const Case cases[] = {{"plain", {}, false, false},
                        {"causal+bottom_right", {{"causal", 1}, {"bottom_right", 1}}, false, false},
                        {"window", {{"window_left", 2}, {"window_right", 1}}, false, false},
                        {"softcap+scale", {{"softcap", 0.8}, {"scale", 0.9}}, false, false},
                        {"mask+alibi", {}, true, true},
                        {"dropout", {{"dropout_p", 0.4}, {"seed", 3}}, false, false}};
  for (const Case& c : cases) {
    std::vector<Operand> fwd{{uniform(s.b * s.hq * s.sq * s.d, rng), {s.b, s.hq, s.sq, s.d}, DType::f64},
                             {uniform(s.b * s.hkv * s.skv * s.d, rng), {s.b, s.hkv, s.skv, s.d}, DType::f64},
                             {uniform(s.b * s.hkv * s.skv * s.dv, rng), {s.b, s.hkv, s.skv, s.dv}, DType::f64},
                             c.mask ? Operand{uniform(s.sq * s.skv, rng), {s.sq, s.skv}, DType::f64}
                                    : Operand{{}, {0}, DType::f64},
                             c.alibi ? Operand{uniform(s.hq, rng, 0, 0.5), {s.hq}, DType::f64}
                                     : Operand{{}, {0}, DType::f64}};
    auto y = exec(Backend::host_reference, "scaled_dot_product_attention", fwd, c.attrs);
    ASSERT_TRUE(y) << y.status().to_string();
    const std::vector<double> g = uniform(int64_t((*y)[0].size()), rng);
    auto loss = [&](const std::vector<Operand>& ops) {
      auto out = exec(Backend::host_reference, "scaled_dot_product_attention", ops, c.attrs);
      double l = 0;
      for (size_t i = 0; i < g.size(); ++i) l += g[i] * (*out)[0][i];
      return l;
    };
    const Operand grad{g, {s.b, s.hq, s.sq, s.dv}, DType::f64}, out{(*y)[0], grad.shape, DType::f64},
        lse{(*y)[1], {s.b, s.hq, s.sq}, DType::f64};
    for (Backend backend : host_and_cuda_backends()) {
      auto grads = exec(backend, "scaled_dot_product_attention_backward", {grad, fwd[0], fwd[1], fwd[2], out, lse, fwd[3], fwd[4]},
                        c.attrs);
      ASSERT_TRUE(grads) << grads.status().to_string();
      int nonzero = 0;
      for (int operand = 0; operand < 3; ++operand)
        for (size_t i = 0; i < fwd[operand].values.size(); ++i) {
          std::vector<Operand> plus = fwd, minus = fwd;
          const double h = 1e-6;
          plus[operand].values[i] += h;
          minus[operand].values[i] -= h;
          const double fd = (loss(plus) - loss(minus)) / (2 * h);
          nonzero += std::abs(fd) > 1e-3;
          EXPECT_NEAR((*grads)[operand][i], fd, 1e-7 + 1e-6 * std::abs(fd))
              << c.name << " " << backend_name(backend) << " operand " << operand << " element " << i;
        }
      EXPECT_GT(nonzero, 20) << c.name;
    }
  }
}

/// Dropout: uniform weights over N keys and one-hot values make out[d] the
/// kept weight of key d: 1 / (N (1 - p)) or 0. The drop rate is near p, the
/// same seed and offset give the same mask, another offset another mask.
TEST(AttentionDropout, RateAndReproducibility) {
  const int64_t n = 256;
  std::vector<double> zeros(n * 8, 0.0), onehot(n * n, 0.0);
  for (int64_t j = 0; j < n; ++j) onehot[j * n + j] = 1;
  for (Backend backend : host_and_cuda_backends()) {
    auto run = [&](double offset) {
      const Attrs a{{"dropout_p", 0.25}, {"seed", 42}, {"offset", offset}};
      auto r = exec(backend, "scaled_dot_product_attention",
                    {{std::vector<double>(8, 0.0), {1, 1, 1, 8}, DType::f32}, {zeros, {1, 1, n, 8}, DType::f32},
                     {onehot, {1, 1, n, n}, DType::f32}, {{}, {0}, DType::f32}, {{}, {0}, DType::f32}},
                    a);
      EXPECT_TRUE(r) << r.status().to_string();
      return r ? (*r)[0] : std::vector<double>{};
    };
    const auto first = run(0), again = run(0), other = run(1);
    EXPECT_EQ(first, again) << backend_name(backend);
    EXPECT_NE(first, other) << backend_name(backend);
    int dropped = 0;
    for (double x : first) {
      if (x == 0) ++dropped;
      else EXPECT_NEAR(x, 1.0 / (n * 0.75), 1e-7);
    }
    EXPECT_GT(dropped, 40) << backend_name(backend);  // 64 expected
    EXPECT_LT(dropped, 90) << backend_name(backend);
  }
  // Every backend draws the same mask.
  if (cuda_available()) {
    const std::vector<Operand> in{{std::vector<double>(8, 0.0), {1, 1, 1, 8}, DType::f32}, {zeros, {1, 1, n, 8}, DType::f32},
                                  {onehot, {1, 1, n, n}, DType::f32}, {{}, {0}, DType::f32}, {{}, {0}, DType::f32}};
    const Attrs a{{"dropout_p", 0.5}, {"seed", 1234567}};
    auto host = exec(Backend::host_reference, "scaled_dot_product_attention", in, a);
    auto cuda = exec(Backend::bespoke_cuda, "scaled_dot_product_attention", in, a);
    ASSERT_TRUE(host && cuda);
    EXPECT_EQ((*host)[0], (*cuda)[0]);
  }
}

/// The grouped draws (Note [Attention dropout draws]): every score of a group
/// reads its group's one Philox call, the group's 8 scores take its 8
/// distinct 16-bit halves, and each of the 8 positions keeps at rate 1 - p;
/// the scale makes the expected weight exactly 1 for the rounded threshold.
TEST(AttentionDropout, GroupsDrawDistinctBitsAtTheRate) {
  using namespace baracuda::attn;
  Problem p;
  p.heads_q = 3, p.seed = 0x5eedULL, p.offset = 7, p.dropout_p = 0.3f;
  const uint32_t threshold = dropout_threshold(p.dropout_p);
  EXPECT_EQ(threshold, 19661u);  // round(0.3 * 65536)
  EXPECT_EQ(dropout_threshold(0.25f), 16384u);
  EXPECT_EQ(dropout_scale<double>(p), double(65536.f / float(65536 - threshold)));
  const int64_t n = 256, b = 1, h = 2;
  int64_t kept_at[8] = {}, groups = 0;
  for (int64_t i0 = 0; i0 < n; i0 += 16)
    for (int64_t i0b : {i0, i0 + 1, i0 + 7})        // group bases: bit 3 of i clear
      for (int64_t j0 = 0; j0 < n; j0 += 2)         // bits 0 and 3 of j clear
        if ((j0 & 8) == 0) {
          const PhiloxWords base = dropout_draws(p, b, h, i0b, j0);
          std::vector<uint32_t> halves, drawn;
          for (uint32_t w : base.v) halves.push_back(w & 0xffffu), halves.push_back(w >> 16);
          int slot = 0;
          for (int64_t di : {0, 8})
            for (int64_t dj : {0, 1, 8, 9}) {
              const int64_t i = i0b + di, j = j0 + dj;
              const PhiloxWords w = dropout_draws(p, b, h, i, j);
              for (int k = 0; k < 4; ++k) ASSERT_EQ(w.v[k], base.v[k]) << "score " << i << "," << j;
              const uint32_t draw = dropout_draw(w, i, j);
              drawn.push_back(draw);
              EXPECT_EQ(dropout_keep(p, b, h, i, j), draw >= threshold);
              kept_at[slot++] += draw >= threshold;
            }
          std::sort(halves.begin(), halves.end());
          std::sort(drawn.begin(), drawn.end());
          ASSERT_EQ(drawn, halves) << "group " << i0b << "," << j0 << " reads each half once";
          ++groups;
        }
  // Each slot keeps at 0.7 (3072 groups: a std of 0.0083).
  for (int slot = 0; slot < 8; ++slot) EXPECT_NEAR(double(kept_at[slot]) / double(groups), 0.7, 0.035) << slot;
  // Another head, offset or seed draws other bits.
  Problem q = p;
  q.offset = 8;
  EXPECT_NE(dropout_draws(q, b, h, 0, 0).v[0], dropout_draws(p, b, h, 0, 0).v[0]);
  q = p;
  q.seed = p.seed + 1;
  EXPECT_NE(dropout_draws(q, b, h, 0, 0).v[0], dropout_draws(p, b, h, 0, 0).v[0]);
  EXPECT_NE(dropout_draws(p, b, h + 1, 0, 0).v[0], dropout_draws(p, b, h, 0, 0).v[0]);
}

/// Packed sequences: each sequence of varlen_attention (and its backward)
/// equals dense attention over that sequence alone.
TEST(AttentionVarlen, MatchesDensePerSequence) {
  std::mt19937 rng(12);
  const std::vector<int64_t> lq{3, 0, 7, 1}, lk{5, 4, 7, 9};
  const int64_t hq = 4, hkv = 2, d = 8, dv = 6;
  std::vector<double> cq{0}, ck{0};
  for (size_t b = 0; b < lq.size(); ++b) cq.push_back(cq.back() + double(lq[b])), ck.push_back(ck.back() + double(lk[b]));
  const int64_t tq = int64_t(cq.back()), tk = int64_t(ck.back());
  const auto q = uniform(tq * hq * d, rng), k = uniform(tk * hkv * d, rng), v = uniform(tk * hkv * dv, rng),
             g = uniform(tq * hq * dv, rng);
  const Attrs attrs{{"causal", 1}, {"bottom_right", 1}, {"max_seqlen_q", 7}, {"max_seqlen_kv", 9}};
  for (Backend backend : host_and_cuda_backends()) {
    for (DType t : {DType::f64, DType::f32}) {
      const DType lt = t == DType::f64 ? DType::f64 : DType::f32;
      const std::vector<Operand> in{{q, {tq, hq, d}, t},          {k, {tk, hkv, d}, t},        {v, {tk, hkv, dv}, t},
                                    {cq, {5}, DType::i32}, {ck, {5}, DType::i32}, {{}, {0}, lt}};
      auto packed = exec(backend, "varlen_attention", in, attrs);
      ASSERT_TRUE(packed) << packed.status().to_string();
      auto grads = exec(backend, "varlen_attention_backward",
                        {{g, {tq, hq, dv}, t}, in[0], in[1], in[2], {(*packed)[0], {tq, hq, dv}, t},
                         {(*packed)[1], {hq, tq}, lt}, in[3], in[4], in[5]},
                        attrs);
      ASSERT_TRUE(grads) << grads.status().to_string();
      const double tol = t == DType::f64 ? 1e-12 : 1e-5;
      for (size_t b = 0; b < lq.size(); ++b) {
        // Sequence b as dense [1, H, S, D] views of the packed tokens (a [S, H, D] slice, transposed).
        auto slice = [&](const std::vector<double>& x, int64_t first, int64_t len, int64_t heads, int64_t dim) {
          std::vector<double> out;
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t s = 0; s < len; ++s)
              for (int64_t e = 0; e < dim; ++e) out.push_back(x[((first + s) * heads + h) * dim + e]);
          return out;
        };
        const int64_t q0 = int64_t(cq[b]), k0 = int64_t(ck[b]);
        const std::vector<Operand> dense{{slice(q, q0, lq[b], hq, d), {1, hq, lq[b], d}, t},
                                         {slice(k, k0, lk[b], hkv, d), {1, hkv, lk[b], d}, t},
                                         {slice(v, k0, lk[b], hkv, dv), {1, hkv, lk[b], dv}, t},
                                         {{}, {0}, t},
                                         {{}, {0}, lt}};
        const Attrs dense_attrs{{"causal", 1}, {"bottom_right", 1}};
        auto want = exec(Backend::host_reference, "scaled_dot_product_attention", dense, dense_attrs);
        ASSERT_TRUE(want) << want.status().to_string();
        const auto got_out = slice((*packed)[0], q0, lq[b], hq, dv);
        for (size_t e = 0; e < got_out.size(); ++e) EXPECT_NEAR(got_out[e], (*want)[0][e], tol) << "sequence " << b;
        auto want_g = exec(Backend::host_reference, "scaled_dot_product_attention_backward",
                           {{slice(g, q0, lq[b], hq, dv), {1, hq, lq[b], dv}, t}, dense[0], dense[1], dense[2],
                            {(*want)[0], {1, hq, lq[b], dv}, t}, {(*want)[1], {1, hq, lq[b]}, lt}, dense[3], dense[4]},
                           dense_attrs);
        ASSERT_TRUE(want_g) << want_g.status().to_string();
        const std::vector<double> got[3] = {slice((*grads)[0], q0, lq[b], hq, d), slice((*grads)[1], k0, lk[b], hkv, d),
                                            slice((*grads)[2], k0, lk[b], hkv, dv)};
        for (int o = 0; o < 3; ++o)
          for (size_t e = 0; e < got[o].size(); ++e)
            EXPECT_NEAR(got[o][e], (*want_g)[o][e], tol) << backend_name(backend) << " sequence " << b << " grad " << o;
      }
    }
  }
}

/// Offsets that are not a valid packing: the reference names the sequence.
TEST(AttentionVarlen, BadOffsetsAreNamed) {
  const std::vector<Operand> in{{std::vector<double>(4 * 2 * 4, 0.5), {4, 2, 4}, DType::f32},
                                {std::vector<double>(4 * 2 * 4, 0.5), {4, 2, 4}, DType::f32},
                                {std::vector<double>(4 * 2 * 4, 0.5), {4, 2, 4}, DType::f32},
                                {{0, 3, 2}, {3}, DType::i32},
                                {{0, 2, 4}, {3}, DType::i32},
                                {{}, {0}, DType::f32}};
  auto r = exec(Backend::host_reference, "varlen_attention", in);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("sequence 1 has offsets q [3, 2)"), std::string::npos) << r.status().message();
}

/// Bigger than one tile in every direction on the CUDA kernels (the sweep's
/// sizes stay small for the host reference): halves (the tensor-core kernels)
/// and f32, lengths off the 64-row tiles, GQA,
/// transposed [B, S, H, D] memory, and the score options: causal, a
/// bottom-right window with softcap, ALiBi with a key-padding mask, dropout.
/// On a Hopper the halves run twice: on its warpgroup-MMA kernels (the
/// backward; this grid is too small for the forward's) and, with them set
/// aside (tiles::set_hopper_kernels), on the mma.sync kernels other archs run.
TEST(AttentionCuda, MultiTileAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  struct RestoreHopper {
    ~RestoreHopper() { attn::tiles::set_hopper_kernels(true); }
  } restore;
  std::mt19937 rng(21);
  const int64_t b = 2, hq = 4, hkv = 2, sq = 133, skv = 161;
  // [B, S, H, D] memory seen as [B, H, S, D].
  auto bshd = [](int64_t heads, int64_t seq, int64_t dim) { return Shape{seq * heads * dim, dim, heads * dim, 1}; };
  std::vector<double> pad(size_t(b * skv)), slopes{0.5, 0.25, 0.125, 0.0625};
  for (int64_t e = 0; e < b * skv; ++e) pad[size_t(e)] = e % skv < skv - 9 ? 1 : 0;  // the last 9 keys of each batch hidden
  const std::vector<Attrs> options = {Attrs{{"causal", 1}},
                                      Attrs{{"window_left", 70}, {"window_right", 5}, {"bottom_right", 1}, {"softcap", 3}},
                                      Attrs{},
                                      Attrs{{"dropout_p", 0.2}, {"seed", 5}, {"offset", 11}},
                                      // whole key tiles with a softcap (the backward's inline capped path), then a short last one
                                      Attrs{{"softcap", 3}, {"scale", 0.4}}};
  for (const bool hopper : {true, false})
    for (int64_t d : {64, 128, 40, 96})  // 40 and 96: padded to 64 and 128 (tc_head_dim)
      for (size_t o = 0; o < options.size(); ++o)
        for (DType t : {DType::bf16, DType::f16, DType::f32}) {
          if (!hopper && (!hopper_wgmma() || t == DType::f32)) continue;  // the second run: halves on a Hopper only
          attn::tiles::set_hopper_kernels(hopper);
          const auto q = uniform(b * hq * sq * d, rng), k = uniform(b * hkv * skv * d, rng),
                     v = uniform(b * hkv * skv * d, rng), g = uniform(b * hq * sq * d, rng);
          const Attrs& attrs = options[o];
          const bool masked = o == 2;
          std::vector<Operand> in{{q, {b, hq, sq, d}, t, bshd(hq, sq, d)}, {k, {b, hkv, skv, d}, t, bshd(hkv, skv, d)},
                                  {v, {b, hkv, skv, d}, t, bshd(hkv, skv, d)},
                                  masked ? Operand{pad, {b, 1, 1, skv}, DType::boolean} : Operand{{}, {0}, t},
                                  masked ? Operand{slopes, {hq}, DType::f32} : Operand{{}, {0}, DType::f32}};
          const std::string what = cat(dtype_name(t), " d=", d, " options ", o, hopper ? "" : " (mma.sync kernels)");
          auto host = exec(Backend::host_reference, "scaled_dot_product_attention", in, attrs);
          auto cuda = exec(Backend::bespoke_cuda, "scaled_dot_product_attention", in, attrs);
          ASSERT_TRUE(host && cuda) << what;
          const double tol = t == DType::f32 ? 1e-5 : 2e-2;
          for (size_t e = 0; e < (*host)[0].size(); ++e) ASSERT_NEAR((*cuda)[0][e], (*host)[0][e], tol) << what << " out " << e;
          for (size_t e = 0; e < (*host)[1].size(); ++e) ASSERT_NEAR((*cuda)[1][e], (*host)[1][e], 1e-4) << what << " lse " << e;
          const std::vector<Operand> bwd{{g, {b, hq, sq, d}, t},  in[0], in[1], in[2], {(*host)[0], {b, hq, sq, d}, t},
                                         {(*host)[1], {b, hq, sq}, DType::f32}, in[3], in[4]};
          auto gh = exec(Backend::host_reference, "scaled_dot_product_attention_backward", bwd, attrs);
          auto gc = exec(Backend::bespoke_cuda, "scaled_dot_product_attention_backward", bwd, attrs);
          ASSERT_TRUE(gh && gc) << what;
          for (int r = 0; r < 3; ++r) {
            double scale = 0;
            for (double x : (*gh)[r]) scale = std::max(scale, std::abs(x));
            for (size_t e = 0; e < (*gh)[r].size(); ++e)
              ASSERT_NEAR((*gc)[r][e], (*gh)[r][e], (t == DType::f32 ? 1e-5 : 2e-2) * scale) << what << " grad " << r << " " << e;
          }
        }
}

/// Asked for reproducible runs (PlanPreference::deterministic_only), the
/// CUDA backward sums dK and dV over the query heads of a group and dQ over
/// key tiles in a fixed order: two runs agree bit for bit (by default the
/// Hopper backward sums dQ by bulk f32 reductions: Note [One-pass Hopper backward]).
TEST(AttentionCuda, BackwardIsDeterministic) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  for (DType t : {DType::bf16, DType::f16}) {
    const std::vector<Operand> in = random_backward_operands({1, 8, 1, 300, 260, 128, 128}, t, rng);
    const Attrs attrs{{"causal", 1}, {"bottom_right", 1}};
    PlanPreference reproducible;
    reproducible.deterministic_only = true;
    auto first = exec(Backend::bespoke_cuda, "scaled_dot_product_attention_backward", in, attrs, reproducible);
    auto second = exec(Backend::bespoke_cuda, "scaled_dot_product_attention_backward", in, attrs, reproducible);
    ASSERT_TRUE(first && second);
    for (int r = 0; r < 3; ++r)
      for (size_t e = 0; e < (*first)[r].size(); ++e)
        ASSERT_EQ((*first)[r][e], (*second)[r][e]) << dtype_name(t) << " grad " << r << " " << e;
  }
}

/// The backward keeps 8-byte row statistics in its workspace: a workspace 4
/// bytes off is refused by name, before any kernel; one 8 bytes off (not
/// the 16 the one-pass Hopper backward's bulk reductions need, so that
/// path steps aside for the two passes) gives the same gradients.
TEST(AttentionCuda, BackwardWorkspaceAlignment) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(11);
  for (DType t : {DType::bf16, DType::f32}) {
    const std::vector<Operand> in = random_backward_operands({1, 4, 4, 200, 200, 128, 128}, t, rng);
    const std::string op = "scaled_dot_product_attention_backward";
    auto off4 = exec(Backend::bespoke_cuda, op, in, {}, {}, {}, 0, 4);
    ASSERT_FALSE(off4) << dtype_name(t);
    EXPECT_EQ(off4.status().kind(), ErrorKind::misaligned_operand) << off4.status().to_string();
    EXPECT_NE(off4.status().message().find("workspace must be 8-byte aligned"), std::string::npos)
        << off4.status().to_string();
    auto aligned = exec(Backend::bespoke_cuda, op, in);
    auto off8 = exec(Backend::bespoke_cuda, op, in, {}, {}, {}, 0, 8);
    ASSERT_TRUE(aligned) << aligned.status().to_string();
    ASSERT_TRUE(off8) << off8.status().to_string();
    for (int r = 0; r < 3; ++r)
      for (size_t e = 0; e < (*aligned)[r].size(); ++e)
        ASSERT_NEAR((*off8)[r][e], (*aligned)[r][e], 2e-2 * (1 + std::abs((*aligned)[r][e])))
            << dtype_name(t) << " grad " << r << " " << e;
  }
}

/// The Hopper warpgroup-MMA products alone, on small integers where every
/// sum is exact: a failure here is a descriptor, swizzle or fragment bug,
/// not the softmax's.
TEST(AttentionCuda, WgmmaProductsAreExact) {
  if (!hopper_wgmma()) GTEST_SKIP() << "no sm_90 device or no sm_90a code";
#ifdef BARACUDA_HAS_CUDA
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128}) {
      auto check = attn::wgmma_self_test(t, d);
      ASSERT_TRUE(check) << check.status().to_string();
      EXPECT_EQ(check->scores, 0) << dtype_name(t) << " d=" << d << ": S = Q K^T (shared-memory descriptors)";
      EXPECT_EQ(check->output, 0) << dtype_name(t) << " d=" << d << ": O = P V (register A, N-major B)";
    }
#endif
}

/// The one-pass Hopper backward's products from a stored dS^T tile, on small
/// integers where every sum is exact: dK = dS^T Q reads dS^T K-major, the dQ
/// parts dS K read it M-major (transposed) and K N-major, through the
/// kernel's own issue functions; a failure here is a descriptor bug of the
/// transposed reads, not the score gradient's.
TEST(AttentionCuda, WgmmaBackwardProductsAreExact) {
  if (!hopper_wgmma()) GTEST_SKIP() << "no sm_90 device or no sm_90a code";
#ifdef BARACUDA_HAS_CUDA
  for (DType t : {DType::bf16, DType::f16}) {
    auto check = attn::wgmma_backward_self_test(t);
    ASSERT_TRUE(check) << check.status().to_string();
    EXPECT_EQ(check->grad_k, 0) << dtype_name(t) << ": dK = dS^T Q (dS^T from registers, Q N-major)";
    EXPECT_EQ(check->grad_q, 0) << dtype_name(t) << ": dQ = dS K (dS^T M-major, K N-major)";
  }
  auto refused = attn::wgmma_backward_self_test(DType::f32);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.status().message().find("f16 or bf16, got f32"), std::string::npos) << refused.status().message();
#endif
}

/// One K tile loaded by TMA with the forward's tensor map (128-byte swizzle,
/// two 64-dim boxes at D 128, rows past the sequence zero-filled) and by the
/// cp.async path, each against the swizzled image the wgmma descriptors
/// read: a failure here is a tensor-map bug, not a barrier or pipeline bug.
TEST(AttentionCuda, TmaTileMatchesSwizzledLayout) {
  if (!hopper_wgmma()) GTEST_SKIP() << "no sm_90 device or no sm_90a code";
#ifdef BARACUDA_HAS_CUDA
  for (DType t : {DType::bf16, DType::f16})
    for (int d : {64, 128, 40, 96}) {  // 40 and 96: columns past the head dim zero-filled (padded to 64 and 128)
      auto check = attn::tma_self_test(t, d);
      ASSERT_TRUE(check) << check.status().to_string();
      EXPECT_EQ(check->tma_bytes, 0) << dtype_name(t) << " d=" << d << ": TMA tile (tensor map, swizzle, zero fill)";
      EXPECT_EQ(check->cp_async_bytes, 0) << dtype_name(t) << " d=" << d << ": cp.async tile (issue_swizzled)";
    }
#endif
}

/// Packed sequences on the Hopper forward's cp.async path (TMA would read a
/// packed sequence's neighbour where dense rows are zero-filled): lengths off
/// the 128-row tiles, one empty sequence, GQA 4/1, enough heads for the
/// grid to reach the wgmma kernel; against the host reference.
TEST(AttentionCuda, PackedSequencesOnHopperPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(41);
  const std::vector<int64_t> lq{300, 0, 131}, lk{260, 77, 400};
  const int64_t hq = 16, hkv = 4;
  std::vector<double> cq{0}, ck{0};
  for (size_t b = 0; b < lq.size(); ++b) cq.push_back(cq.back() + double(lq[b])), ck.push_back(ck.back() + double(lk[b]));
  const int64_t tq = int64_t(cq.back()), tk = int64_t(ck.back());
  for (int64_t d : {64, 128, 40})  // 40: padded to 64 (cp.async skips the columns past it)
    for (const Attrs& attrs : {Attrs{{"max_seqlen_q", 300}, {"max_seqlen_kv", 400}},
                               Attrs{{"causal", 1}, {"bottom_right", 1}, {"max_seqlen_q", 300}, {"max_seqlen_kv", 400}}})
      for (DType t : {DType::bf16, DType::f16}) {
        const std::vector<Operand> in{{uniform(tq * hq * d, rng), {tq, hq, d}, t},
                                      {uniform(tk * hkv * d, rng), {tk, hkv, d}, t},
                                      {uniform(tk * hkv * d, rng), {tk, hkv, d}, t},
                                      {cq, {4}, DType::i32},
                                      {ck, {4}, DType::i32},
                                      {{}, {0}, DType::f32}};
        const std::string what = cat(dtype_name(t), " d=", d, attrs.has("causal") ? " causal" : "");
        auto host = exec(Backend::host_reference, "varlen_attention", in, attrs);
        auto cuda = exec(Backend::bespoke_cuda, "varlen_attention", in, attrs);
        ASSERT_TRUE(host && cuda) << what;
        for (size_t e = 0; e < (*host)[0].size(); ++e) ASSERT_NEAR((*cuda)[0][e], (*host)[0][e], 2e-2) << what << " out " << e;
        for (size_t e = 0; e < (*host)[1].size(); ++e) {
          const double want = (*host)[1][e], got = (*cuda)[1][e];
          if (std::isinf(want)) ASSERT_EQ(got, want) << what << " lse " << e;
          else ASSERT_NEAR(got, want, 1e-4) << what << " lse " << e;
        }
      }
}

/// The Hopper forward over several key tiles (the K/V ring wraps), lengths
/// off its 128-row and 128-key tiles both ways, GQA 4/1, contiguous
/// operands, every option of the score rule; forward only
/// (BackwardOnHopperPathAgainstReference takes the backward). The CUDA run repeats one batch of 4 query heads over a
/// kv head `kCopies` times, so that its grid reaches the wgmma kernel (4 x 12
/// heads of 3 or 5 blocks: 144 or more, where it needs half the SMs; smaller grids
/// run the mma.sync kernel, and the sku says which ran); the host reference runs one copy, and
/// every copy must match it (dropout runs one copy: each head draws its own;
/// DropoutOnHopperPath fills the grid). Any device: elsewhere this runs the mma.sync kernel.
TEST(AttentionCuda, LongSequencesAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(33);
  constexpr int64_t kCopies = 12;
  const int64_t b = 1, hq = 4, hkv = 1;
  const std::vector<Attrs> options = {Attrs{},
                                      Attrs{{"causal", 1}},
                                      Attrs{{"causal", 1}, {"bottom_right", 1}},
                                      Attrs{{"window_left", 100}, {"window_right", 20}, {"softcap", 5}},
                                      Attrs{{"window_left", 400}, {"window_right", 10}},  // edges, plain middle
                                      Attrs{},  // ALiBi and a boolean mask
                                      Attrs{{"dropout_p", 0.15}, {"seed", 3}, {"offset", 2}},
                                      // whole tiles with the softcap inline, the diagonal's edges with it too
                                      Attrs{{"causal", 1}, {"softcap", 5}}};
  auto repeated = [](const std::vector<double>& x, int64_t copies) {
    std::vector<double> out;
    out.reserve(x.size() * size_t(copies));
    for (int64_t c = 0; c < copies; ++c) out.insert(out.end(), x.begin(), x.end());
    return out;
  };
  for (const auto& [sq, skv] : {std::pair<int64_t, int64_t>{300, 520}, {520, 300}})
    for (int64_t d : {64, 128, 96})  // 96: padded to 128 (TMA zero-fills the columns past it)
      for (size_t o = 0; o < options.size(); ++o)
        for (DType t : {DType::bf16, DType::f16}) {
          const bool masked = o == 5, dropout = o == 6;
          const int64_t copies = dropout ? 1 : kCopies;  // dropout draws per head: one copy
          std::vector<double> mask(size_t(sq * skv)), slopes{0.3, 0.1, 0.05, 0.01};
          for (auto& x : mask) x = rng() % 5 ? 1 : 0;
          const auto q = uniform(b * hq * sq * d, rng), k = uniform(b * hkv * skv * d, rng),
                     v = uniform(b * hkv * skv * d, rng);
          auto operands = [&](int64_t c) {
            return std::vector<Operand>{{repeated(q, c), {b, hq * c, sq, d}, t},
                                        {repeated(k, c), {b, hkv * c, skv, d}, t},
                                        {repeated(v, c), {b, hkv * c, skv, d}, t},
                                        masked ? Operand{mask, {sq, skv}, DType::boolean} : Operand{{}, {0}, t},
                                        masked ? Operand{repeated(slopes, c), {hq * c}, DType::f32}
                                               : Operand{{}, {0}, DType::f32}};
          };
          const std::string what = cat(dtype_name(t), " sq=", sq, " skv=", skv, " d=", d, " options ", o);
          const std::vector<Operand> copied = operands(copies);
          if (hopper_wgmma()) {  // the copies reach the wgmma kernel; dropout's one copy does not
            auto plan = bespoke_plan("scaled_dot_product_attention", copied, options[o]);
            ASSERT_TRUE(plan) << plan.status().to_string();
            EXPECT_EQ(std::string((*plan)->sku().kernel), copies > 1 ? "wgmma" : "tensor_cores") << what;
          }
          auto host = exec(Backend::host_reference, "scaled_dot_product_attention", operands(1), options[o]);
          auto cuda = exec(Backend::bespoke_cuda, "scaled_dot_product_attention", copied, options[o]);
          ASSERT_TRUE(host && cuda) << what;
          const auto &out = (*host)[0], &lse = (*host)[1];
          ASSERT_EQ((*cuda)[0].size(), out.size() * size_t(copies)) << what;
          for (size_t e = 0; e < (*cuda)[0].size(); ++e)
            ASSERT_NEAR((*cuda)[0][e], out[e % out.size()], 2e-2) << what << " out " << e;
          for (size_t e = 0; e < (*cuda)[1].size(); ++e) {
            const double want = lse[e % lse.size()], got = (*cuda)[1][e];
            if (std::isinf(want)) ASSERT_EQ(got, want) << what << " lse " << e;  // a query that sees no key: -inf
            else ASSERT_NEAR(got, want, 1e-4) << what << " lse " << e;
          }
        }
}

/// The Hopper backward (wgmma, head dims 64 and 128; the mma.sync kernels
/// elsewhere), one pass (dQ by bulk f32 reductions, the default at head dim
/// 128) and two (asked for reproducible runs, or head dim 64), over several 64-row query and key tiles both ways,
/// GQA 4/1 (dK, dV and the one pass's dQ sums over a group's heads), every
/// option of the score rule, and packed sequences (one empty, lengths off
/// the tiles); against the host reference's gradients from the host
/// forward's out and lse.
TEST(AttentionCuda, BackwardOnHopperPathAgainstReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(71);
  const int64_t b = 1, hq = 4, hkv = 1;
  const std::vector<Attrs> options = {Attrs{},
                                      Attrs{{"causal", 1}},
                                      Attrs{{"causal", 1}, {"bottom_right", 1}},
                                      Attrs{{"window_left", 100}, {"window_right", 20}, {"softcap", 5}},
                                      Attrs{{"window_left", 150}, {"window_right", 10}},  // edges, whole middle tiles
                                      Attrs{},  // ALiBi and a boolean mask
                                      Attrs{{"dropout_p", 0.15}, {"seed", 3}, {"offset", 2}},
                                      Attrs{{"causal", 1}, {"softcap", 5}}};
  auto check_grads = [](const std::vector<std::vector<double>>& want, const std::vector<std::vector<double>>& got,
                        const std::string& what) {
    for (int r = 0; r < 3; ++r) {
      double scale = 0;
      for (double x : want[size_t(r)]) scale = std::max(scale, std::abs(x));
      ASSERT_EQ(got[size_t(r)].size(), want[size_t(r)].size()) << what;
      for (size_t e = 0; e < want[size_t(r)].size(); ++e)
        ASSERT_NEAR(got[size_t(r)][e], want[size_t(r)][e], 2e-2 * scale) << what << " grad " << r << " " << e;
    }
  };
  for (const bool reproducible : {false, true})
    for (const auto& [sq, skv] : {std::pair<int64_t, int64_t>{300, 200}, {130, 330}})
      for (int64_t d : {64, 128, 96})  // 96: padded to 128 (one pass: TMA fills the columns past it with zeros)
        for (size_t o = 0; o < options.size(); ++o)
          for (DType t : {DType::bf16, DType::f16}) {
            PlanPreference pref;
            pref.deterministic_only = reproducible;
            const bool masked = o == 5;
            std::vector<double> mask(size_t(sq * skv)), slopes{0.3, 0.1, 0.05, 0.01};
            for (auto& x : mask) x = rng() % 5 ? 1 : 0;
            const std::vector<Operand> in{{uniform(b * hq * sq * d, rng), {b, hq, sq, d}, t},
                                          {uniform(b * hkv * skv * d, rng), {b, hkv, skv, d}, t},
                                          {uniform(b * hkv * skv * d, rng), {b, hkv, skv, d}, t},
                                          masked ? Operand{mask, {sq, skv}, DType::boolean} : Operand{{}, {0}, t},
                                          masked ? Operand{slopes, {hq}, DType::f32} : Operand{{}, {0}, DType::f32}};
            const std::string what = cat(reproducible ? "two passes " : "one pass ", dtype_name(t), " sq=", sq,
                                         " skv=", skv, " d=", d, " options ", o);
            auto fwd = exec(Backend::host_reference, "scaled_dot_product_attention", in, options[o]);
            ASSERT_TRUE(fwd) << what;
            const std::vector<Operand> bwd{{uniform(b * hq * sq * d, rng), {b, hq, sq, d}, t},
                                           in[0], in[1], in[2],
                                           {(*fwd)[0], {b, hq, sq, d}, t},
                                           {(*fwd)[1], {b, hq, sq}, DType::f32},
                                           in[3], in[4]};
            if (hopper_wgmma()) {
              auto plan = bespoke_plan("scaled_dot_product_attention_backward", bwd, options[o], pref);
              ASSERT_TRUE(plan) << plan.status().to_string();
              const bool one_pass = !reproducible && d != 64;  // head dim 64 keeps the two passes
              EXPECT_EQ(std::string((*plan)->sku().kernel), one_pass ? "wgmma_one_pass" : "wgmma") << what;
              EXPECT_EQ((*plan)->precision_guarantee().deterministic, !one_pass) << what;
            }
            auto host = exec(Backend::host_reference, "scaled_dot_product_attention_backward", bwd, options[o]);
            auto cuda = exec(Backend::bespoke_cuda, "scaled_dot_product_attention_backward", bwd, options[o], pref);
            ASSERT_TRUE(host && cuda) << what;
            check_grads(*host, *cuda, what);
          }
  // Packed sequences: the blocks of an empty sequence and those past a short one do nothing.
  const std::vector<int64_t> lq{300, 0, 131}, lk{260, 77, 400};
  const int64_t pq = 8, pkv = 2;
  std::vector<double> cq{0}, ck{0};
  for (size_t s = 0; s < lq.size(); ++s) cq.push_back(cq.back() + double(lq[s])), ck.push_back(ck.back() + double(lk[s]));
  const int64_t tq = int64_t(cq.back()), tk = int64_t(ck.back());
  for (const bool reproducible : {false, true})
    for (int64_t d : {64, 128, 96})  // 96: padded to 128 (cp.async skips the columns past it)
      for (const Attrs& attrs : {Attrs{{"max_seqlen_q", 300}, {"max_seqlen_kv", 400}},
                                 Attrs{{"causal", 1}, {"bottom_right", 1}, {"max_seqlen_q", 300}, {"max_seqlen_kv", 400}}})
        for (DType t : {DType::bf16, DType::f16}) {
          PlanPreference pref;
          pref.deterministic_only = reproducible;
          const std::vector<Operand> in{{uniform(tq * pq * d, rng), {tq, pq, d}, t},
                                        {uniform(tk * pkv * d, rng), {tk, pkv, d}, t},
                                        {uniform(tk * pkv * d, rng), {tk, pkv, d}, t},
                                        {cq, {4}, DType::i32},
                                        {ck, {4}, DType::i32},
                                        {{}, {0}, DType::f32}};
          const std::string what = cat(reproducible ? "two passes " : "one pass ", "packed ", dtype_name(t), " d=", d,
                                       attrs.has("causal") ? " causal" : "");
          auto fwd = exec(Backend::host_reference, "varlen_attention", in, attrs);
          ASSERT_TRUE(fwd) << what;
          const std::vector<Operand> bwd{{uniform(tq * pq * d, rng), {tq, pq, d}, t}, in[0], in[1], in[2],
                                         {(*fwd)[0], {tq, pq, d}, t}, {(*fwd)[1], {pq, tq}, DType::f32},
                                         in[3], in[4], in[5]};
          auto host = exec(Backend::host_reference, "varlen_attention_backward", bwd, attrs);
          auto cuda = exec(Backend::bespoke_cuda, "varlen_attention_backward", bwd, attrs, pref);
          ASSERT_TRUE(host && cuda) << what;
          check_grads(*host, *cuda, what);
        }
}

/// Dropout on the Hopper forward: a grid that fills an H100 (2 x 24 heads x 3
/// query blocks), every head its own data and its own draws, against the
/// host reference. The window's spans start off the 16-key grid for most
/// blocks (draws a score at a time), the other options on it (a Philox call
/// per 8 scores). Elsewhere the mma.sync kernel runs it.
TEST(AttentionCuda, DropoutOnHopperPath) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(57);
  const int64_t b = 2, hq = 24, hkv = 6, sq = 260, skv = 300;
  // 96: padded to 128 (the dropout instances of the padded forward)
  const std::vector<std::pair<DType, int64_t>> cases = {
      {DType::bf16, 64}, {DType::bf16, 128}, {DType::f16, 128}, {DType::f16, 96}};
  const std::vector<Attrs> options = {
      Attrs{{"dropout_p", 0.2}, {"seed", 11}, {"offset", 5}},
      Attrs{{"dropout_p", 0.1}, {"seed", 12}, {"causal", 1}},
      Attrs{{"dropout_p", 0.3}, {"seed", 13}, {"window_left", 100}, {"window_right", 20}, {"softcap", 5}}};
  for (const auto& [t, d] : cases)
    for (size_t o = 0; o < options.size(); ++o) {
      const std::vector<Operand> in{{uniform(b * hq * sq * d, rng), {b, hq, sq, d}, t},
                                    {uniform(b * hkv * skv * d, rng), {b, hkv, skv, d}, t},
                                    {uniform(b * hkv * skv * d, rng), {b, hkv, skv, d}, t},
                                    {{}, {0}, t},
                                    {{}, {0}, DType::f32}};
      const std::string what = cat(dtype_name(t), " d=", d, " options ", o);
      if (hopper_wgmma()) {
        auto plan = bespoke_plan("scaled_dot_product_attention", in, options[o]);
        ASSERT_TRUE(plan) << plan.status().to_string();
        EXPECT_EQ(std::string((*plan)->sku().kernel), "wgmma") << what;
      }
      auto host = exec(Backend::host_reference, "scaled_dot_product_attention", in, options[o]);
      auto cuda = exec(Backend::bespoke_cuda, "scaled_dot_product_attention", in, options[o]);
      ASSERT_TRUE(host && cuda) << what;
      ASSERT_EQ((*cuda)[0].size(), (*host)[0].size()) << what;
      for (size_t e = 0; e < (*host)[0].size(); ++e) ASSERT_NEAR((*cuda)[0][e], (*host)[0][e], 2e-2) << what << " out " << e;
      for (size_t e = 0; e < (*host)[1].size(); ++e) {
        const double want = (*host)[1][e], got = (*cuda)[1][e];
        if (std::isinf(want)) ASSERT_EQ(got, want) << what << " lse " << e;
        else ASSERT_NEAR(got, want, 1e-4) << what << " lse " << e;
      }
    }
}

/// The CLI's --shape of a [B, H, S, D] reaches the op as the query's shape
/// (keys and values alike, no mask, no slopes); other shapes pick one of
/// the sweep's sample sizes.
TEST(AttentionSamples, FourDimensionalShapeIsTheQuerys) {
  const Shape q{2, 3, 50, 16}, lse{2, 3, 50};
  auto forward = find_op("scaled_dot_product_attention")->sample_shapes(DType::bf16, q, {});
  ASSERT_TRUE(forward);
  EXPECT_EQ(forward->inputs, (std::vector<Shape>{q, q, q, {0}, {0}}));
  auto backward = find_op("scaled_dot_product_attention_backward")->sample_shapes(DType::bf16, q, {});
  ASSERT_TRUE(backward);
  EXPECT_EQ(backward->inputs, (std::vector<Shape>{q, q, q, q, q, lse, {0}, {0}}));
  auto other = find_op("scaled_dot_product_attention")->sample_shapes(DType::bf16, Shape{7, 33}, {});
  ASSERT_TRUE(other);
  EXPECT_EQ(other->inputs[0].size(), size_t(4));
  EXPECT_NE(other->inputs[0], (Shape{7, 33}));
  auto too_wide = find_op("scaled_dot_product_attention")->sample_shapes(DType::bf16, Shape{1, 1, 4, 512}, {});
  ASSERT_TRUE(too_wide);
  EXPECT_NE(too_wide->inputs[0], (Shape{1, 1, 4, 512}));  // head dims past 256: a sample size
}

/// KeyOffsets (the backward's edge tiles) says what key_range says for every
/// row and key: causal or not, top-left or bottom-right, windows of every
/// kind, more queries than keys and fewer.
TEST(AttentionTiles, KeyOffsetsMatchKeyRange) {
  std::mt19937 rng(7);
  const int64_t windows[] = {-1, 0, 1, 5, 64, 1 << 20};
  int64_t checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    attn::Problem p;
    p.causal = rng() % 2, p.bottom_right = rng() % 2;
    p.window_left = windows[rng() % 6], p.window_right = windows[rng() % 6];
    const int64_t len_q = 1 + rng() % 150, len_kv = 1 + rng() % 150;
    const attn::KeyOffsets range(p, len_q, len_kv);
    for (int64_t i = 0; i < len_q; ++i) {
      int64_t lo, hi;
      attn::key_range(p, i, len_q, len_kv, lo, hi);
      for (int64_t j = 0; j < len_kv; ++j, ++checked)
        ASSERT_EQ(range.holds(j - i - range.shift), j >= lo && j < hi)
            << "causal " << p.causal << " bottom_right " << p.bottom_right << " window " << p.window_left << "/"
            << p.window_right << " lengths " << len_q << "/" << len_kv << " row " << i << " key " << j;
    }
  }
  EXPECT_GT(checked, 1000000);
}

/// The Hopper forward's 1-d grid visits every (batch, head, query block)
/// once; causal problems heaviest first in each section of (batch, head)
/// pairs, the last section possibly short; the others query blocks fastest.
TEST(AttentionTiles, HopperBlockOrderVisitsEveryBlockOnce) {
  auto check = [](const attn::Problem& p, const attn::tiles::BlockOrder& o) {
    const int64_t pairs = p.batch * p.heads_q;
    std::vector<int> seen(size_t(pairs * o.q_blocks), 0);
    int64_t prev_bh = -1, prev_qb = -1;
    for (int64_t idx = 0; idx < pairs * o.q_blocks; ++idx) {
      int64_t b, h, qb;
      attn::tiles::block_at(p, o, idx, b, h, qb);
      ASSERT_TRUE(b >= 0 && b < p.batch && h >= 0 && h < p.heads_q && qb >= 0 && qb < o.q_blocks) << idx;
      ++seen[size_t((b * p.heads_q + h) * o.q_blocks + qb)];
      const int64_t bh = b * p.heads_q + h;
      if (idx % (o.section * o.q_blocks) != 0) {  // inside a section
        if (o.heavy_first) EXPECT_LE(qb, prev_qb) << idx;
        else EXPECT_GE(qb, bh == prev_bh ? prev_qb : 0) << idx;
      } else {
        EXPECT_EQ(qb, o.heavy_first ? o.q_blocks - 1 : 0) << idx;
      }
      prev_bh = bh, prev_qb = qb;
    }
    for (size_t e = 0; e < seen.size(); ++e) ASSERT_EQ(seen[e], 1) << "block " << e;
  };
  attn::Problem p;
  p.batch = 3, p.heads_q = 8, p.heads_kv = 2, p.seq_q = 1000, p.seq_kv = 1000, p.head_dim = p.value_dim = 128;
  for (bool causal : {false, true}) {
    p.causal = causal;
    const attn::tiles::BlockOrder o = attn::tiles::wgmma_block_order(p);
    EXPECT_EQ(o.q_blocks, 8);
    EXPECT_EQ(o.heavy_first, causal);
    EXPECT_EQ(o.section, causal ? 24 : 1);  // 32 MiB hold every pair's K and V
    check(p, o);
  }
  p.seq_kv = 1 << 20;  // 512 MiB of K and V a head: sections of one key head's 4 query heads
  EXPECT_EQ(attn::tiles::wgmma_block_order(p).section, 4);
  for (int64_t section : {1, 5, 7, 24}) check(p, attn::tiles::BlockOrder{8, section, true});
}

/// The bespoke sku names the tensor-core kernels where they serve (halves,
/// head dims that are multiples of 8; on sm_90 at 64 and 128: wgmma) and
/// nothing for the CUDA-core ones. A forward grid smaller than the device
/// runs mma.sync. Under a tight workspace limit the Hopper backward runs two
/// passes rather than being refused.
TEST(AttentionCuda, SkuNamesTensorCoreKernel) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  PlanPreference pref;
  pref.backend = Backend::bespoke_cuda;
  for (const std::string op : {"scaled_dot_product_attention", "scaled_dot_product_attention_backward"})
    for (DType t : {DType::bf16, DType::f16, DType::f32})
      for (int64_t d : {64, 96, 100, 128})
        for (int64_t heads : {2, 256}) {  // one 128-row block a head: 256 fill any Hopper, 2 do not reach half of one
          const Shape x{1, heads, 100, d}, lse{1, heads, 100};
          std::vector<TensorSpec> in{{t, x}, {t, x}, {t, x}, {t, {0}}, {DType::f32, {0}}};
          if (op.ends_with("backward"))
            in = {{t, x}, {t, x}, {t, x}, {t, x}, {t, x}, {DType::f32, lse}, {t, {0}}, {DType::f32, {0}}};
          auto plan = select(Stream::cuda(), OpDesc{op, in, {}, {}}, pref);
          ASSERT_TRUE(plan) << plan.status().to_string();
          // Head dims that are multiples of 8 run on tensor cores (96 padded to 128); 100 does not.
          const bool tc = t != DType::f32 && d % 8 == 0 && (*plan)->sku().arch >= 80;
          // The Hopper backward takes any grid (at head dim 128, or 96 padded to it, in one pass: no
          // reproducibility was asked for); the forward grids of at least half the SMs.
          const bool backward = op.ends_with("backward");
          const bool hopper = tc && hopper_wgmma() && (backward || heads == 256);
          EXPECT_EQ(std::string((*plan)->sku().kernel),
                    hopper ? (backward && d > 64 ? "wgmma_one_pass" : "wgmma") : tc ? "tensor_cores" : "")
              << op << " " << dtype_name(t) << " d=" << d << " heads=" << heads;
        }
  // A workspace limit the one-pass backward's dQ sums exceed (two heads of 100 rows: 800 bytes of
  // dO . O, ~145 KiB of sums) gets the two passes, not a refusal.
  const Shape x{1, 2, 100, 128}, lse{1, 2, 100};
  const DType h = DType::bf16;
  PlanPreference tight = pref;
  tight.max_workspace_bytes = 4096;
  auto plan = select(Stream::cuda(), OpDesc{"scaled_dot_product_attention_backward",
                                            {{h, x}, {h, x}, {h, x}, {h, x}, {h, x}, {DType::f32, lse}, {h, {0}},
                                             {DType::f32, {0}}}, {}, {}},
                     tight);
  ASSERT_TRUE(plan) << plan.status().to_string();
  EXPECT_LE((*plan)->workspace_size(), size_t(4096));
  EXPECT_TRUE((*plan)->precision_guarantee().deterministic);
  if (hopper_wgmma()) {
    EXPECT_EQ(std::string((*plan)->sku().kernel), "wgmma");
  }
  // The testing hook that sets the Hopper kernels aside (MultiTileAgainstReference's second run)
  // gives the mma.sync kernels' plan.
  attn::tiles::set_hopper_kernels(false);
  auto mma_sync = select(Stream::cuda(), OpDesc{"scaled_dot_product_attention_backward",
                                                {{h, x}, {h, x}, {h, x}, {h, x}, {h, x}, {DType::f32, lse}, {h, {0}},
                                                 {DType::f32, {0}}}, {}, {}},
                         pref);
  attn::tiles::set_hopper_kernels(true);
  ASSERT_TRUE(mma_sync) << mma_sync.status().to_string();
  EXPECT_EQ(std::string((*mma_sync)->sku().kernel), (*mma_sync)->sku().arch >= 80 ? "tensor_cores" : "");
}

TEST(AttentionErrors, BadInputIsNamed) {
  auto message = [](const std::string& op, std::vector<TensorSpec> in, const Attrs& attrs = {}) {
    auto r = infer(op, std::move(in), attrs);
    return error_message(r);
  };
  const DType h = DType::bf16, f = DType::f32;
  const TensorSpec none{h, {0}}, no_alibi{f, {0}};
  const std::string sdpa = "scaled_dot_product_attention";
  std::string m = message(sdpa, {{h, {2, 6, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "key/value heads (4) must divide query heads (6)")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 16}}, {h, {2, 4, 7, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "'key' head dim 16 != 'query' head dim 8")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 6, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "'value' [2, 4, 6, 8] must match 'key' [2, 4, 7, 8] in heads and length")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {3, 4, 7, 8}}, {h, {3, 4, 7, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "batch sizes differ")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, {h, {5, 6}}, no_alibi});
  EXPECT_TRUE(has(m, "'attn_mask' [5, 6] does not broadcast to the scores [2, 4, 5, 7]")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, {f, {5, 7}}, no_alibi});
  EXPECT_TRUE(has(m, "'attn_mask' dtype f32, expected bool or the query dtype bf16")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, {f, {3}}});
  EXPECT_TRUE(has(m, "'alibi_slopes' must be [4] or [2, 4] or [0], got [3]")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, no_alibi}, {{"dropout_p", 1}});
  EXPECT_TRUE(has(m, "'dropout_p' must be in [0, 1), got 1")) << m;
  m = message(sdpa, {{h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, no_alibi}, {{"window_left", -2}});
  EXPECT_TRUE(has(m, "'window_left' must be an integer >= -1")) << m;
  m = message(sdpa, {{h, {4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "must have the rank of 'query'")) << m;
  m = message(sdpa, {{DType::i32, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, none, no_alibi});
  EXPECT_TRUE(has(m, "dtype i32 is not supported")) << m;
  m = message("varlen_attention", {{h, {9, 4, 8}}, {h, {7, 2, 8}}, {h, {7, 2, 8}}, {DType::i64, {3}}, {DType::i64, {3}}, no_alibi});
  EXPECT_TRUE(has(m, "sequence offsets must be i32")) << m;
  m = message("scaled_dot_product_attention_backward",
              {{h, {2, 4, 5, 8}}, {h, {2, 4, 5, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 7, 8}}, {h, {2, 4, 5, 8}}, {f, {2, 4, 6}},
               none, no_alibi});
  EXPECT_TRUE(has(m, "'lse' [2, 4, 6], expected [2, 4, 5]")) << m;
}

}  // namespace
