// Loss family: every op x dtype x reduction x shape x layout against the host
// reference in f64 (on the host and, with a GPU, on CUDA); closed forms
// written out here independently of the library; backward against finite
// differences of the forward on the host; bad input.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstring>
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

BARACUDA_SWEEP_SUITE(Loss, ops_of(OpCategory::loss));

/// The fused cross_entropy of long rows on CUDA, against the reference.
/// Unit-stride rows of 32 KiB on, logits and gradient at the same offsets,
/// are held in registers (Note [Cross entropy rows held over a cluster]):
/// bf16 40000 / 128256 / 151936 / 250000 / 600000 classes over 2 / 4 / 5 /
/// 8 / 10 (sixteen vectors a thread) blocks, f32 10000 / 40000 / 128256 /
/// 151936 / 250000 over 1 / 3 / 8 / 10 / 16; odd class counts start rows
/// off the 16-byte grid (9999 f32, 40001, 50001: rank 0 holds the elements
/// before and after the whole vectors). The others are sliced (Note [Cross
/// entropy over a cluster]): bf16 rows of 9999 and 10000 (one block, whole
/// vectors from the first boundary); `shifted` views put logits and
/// gradient at different offsets and `strided` ones read classes with a
/// stride (element by element; up to 16 slices); f32 rows of 600000 take
/// the one-block kernel.
TEST(CrossEntropyCuda, LongRowsOverClusters) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  for (DType dtype : {DType::bf16, DType::f16, DType::f32})
    for (const Shape& shape : {Shape{6, 10000}, Shape{4, 9999}, Shape{5, 40000}, Shape{2, 40001}, Shape{3, 50001},
                               Shape{3, 128256}, Shape{2, 151936}, Shape{2, 250000}, Shape{2, 600000}})
      for (const Attrs& attrs : {Attrs{{"reduction", 0}, {"ignore_index", -1}}, Attrs{{"reduction", 1}, {"ignore_index", -1}},
                                 Attrs{{"reduction", 2}, {"ignore_index", -1}}})  // the driver's targets hold -1s
        for (LayoutKind layout : {LayoutKind::contiguous, LayoutKind::shifted, LayoutKind::strided}) {
          CaseSpec spec{find_op("cross_entropy_fused"), dtype, shape, attrs, layout};
          RunOptions opt;
          opt.backend = Backend::bespoke_cuda;
          CaseOutcome r = run_case(spec, opt);
          EXPECT_TRUE(r.passed && !r.skipped) << spec.to_string() << ": " << r.message;
        }
}

/// The fused cross_entropy may write its gradient over its logits
/// (linear_cross_entropy runs it so, chunk by chunk): the loss must come from
/// the logits, never from a gradient already written over them. Targets
/// across the whole row (every rank of a cluster); rows held over a cluster
/// (128256; 50257 off the 16-byte grid), 12001 classes (bf16 sliced, f32
/// held by one block) and one block a row (4000); in place against out of
/// place, bitwise.
TEST(CrossEntropyCuda, InPlaceGradientKeepsTheLoss) {
#ifdef BARACUDA_HAS_CUDA
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const int64_t N = 96;
  for (DType dtype : {DType::bf16, DType::f32})
    for (int64_t C : {int64_t(4000), int64_t(12001), int64_t(50257), int64_t(128256)}) {
      SCOPED_TRACE(cat(dtype_name(dtype), " C=", C));
      auto desc = infer("cross_entropy_fused", {{dtype, {N, C}}, {DType::i64, {N}}, {dtype, {0}}}, Attrs{{"reduction", 0}});
      ASSERT_TRUE(desc) << desc.status().to_string();
      auto plan = select(Stream::cuda(), *desc);
      ASSERT_TRUE(plan) << plan.status().to_string();
      const size_t es = dtype_size(dtype), bytes = size_t(N * C) * es, loss_bytes = size_t(N) * es;
      std::vector<char> logits(bytes);
      std::mt19937 rng(11);
      std::normal_distribution<double> normal(0, 2);
      for (int64_t i = 0; i < N * C; ++i) store_double(logits.data(), dtype, i, normal(rng));
      std::vector<int64_t> target(N);
      for (int64_t r = 0; r < N; ++r) target[r] = (C - 1) * r / (N - 1);
      char *x = nullptr, *x_in_place = nullptr, *grad = nullptr, *loss = nullptr, *loss_in_place = nullptr, *t = nullptr,
           *ws = nullptr;
      for (auto [ptr, size] : {std::pair{&x, bytes}, {&x_in_place, bytes}, {&grad, bytes}, {&loss, loss_bytes},
                               {&loss_in_place, loss_bytes}, {&t, size_t(N) * 8}, {&ws, (*plan)->workspace_size() + 16}})
        ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(ptr), size), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(x, logits.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(x_in_place, logits.data(), bytes, cudaMemcpyHostToDevice), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(t, target.data(), size_t(N) * 8, cudaMemcpyHostToDevice), cudaSuccess);
      auto view = [&](char* p, DType d, Shape s) { return *TensorView::contiguous(p, d, s); };
      const Workspace w{ws, (*plan)->workspace_size()};
      for (bool in_place : {false, true}) {
        char* src = in_place ? x_in_place : x;
        std::array<TensorView, 3> in{view(src, dtype, {N, C}), view(t, DType::i64, {N}), view(t, dtype, {0})};
        std::array<TensorView, 2> out{view(in_place ? loss_in_place : loss, dtype, {N}), view(in_place ? src : grad, dtype, {N, C})};
        ASSERT_TRUE((*plan)->run(Stream::cuda(), w, OpArgs{in, out}));
      }
      std::vector<char> a(bytes), b(bytes);
      ASSERT_EQ(cudaMemcpy(a.data(), grad, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(b.data(), x_in_place, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      EXPECT_EQ(std::memcmp(a.data(), b.data(), bytes), 0) << "the gradient in place differs";
      ASSERT_EQ(cudaMemcpy(a.data(), loss, loss_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(b.data(), loss_in_place, loss_bytes, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t r = 0; r < N; ++r)
        EXPECT_EQ(load_double(a.data(), dtype, r), load_double(b.data(), dtype, r)) << "row " << r << ", target " << target[r];
      for (char* p : {x, x_in_place, grad, loss, loss_in_place, t, ws}) cudaFree(p);
    }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

/// A host operand: f64 values (or i64 when `dtype` is i64) of a shape.
struct Operand {
  std::vector<double> values;
  Shape shape;
  DType dtype = DType::f64;
};

Operand f64(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::f64}; }
Operand idx(std::vector<double> v, Shape s) { return {std::move(v), std::move(s), DType::i64}; }

/// Runs `op` on the host (with the workspace its plan asks for); every output as f64.
Result<std::vector<std::vector<double>>> host_exec(const std::string& op, const std::vector<Operand>& inputs,
                                                   const Attrs& attrs = {}) {
  std::vector<TensorSpec> specs;
  for (const auto& o : inputs) specs.push_back({o.dtype, o.shape});
  OpDesc d{op, specs, {}, attrs};
  auto plan = select(Stream::host(), d);
  if (!plan) return plan.status();
  std::vector<std::vector<int64_t>> ints(inputs.size());
  std::vector<std::vector<double>> floats(inputs.size());
  std::vector<TensorView> in;
  for (size_t i = 0; i < inputs.size(); ++i) {
    void* data;
    if (inputs[i].dtype == DType::i64) {
      for (double v : inputs[i].values) ints[i].push_back(static_cast<int64_t>(v));
      data = ints[i].data();
    } else {
      floats[i] = inputs[i].values;
      data = floats[i].data();
    }
    in.push_back(*TensorView::contiguous(data, inputs[i].dtype, inputs[i].shape));
  }
  const OpDesc& full = (*plan)->desc();
  std::vector<std::vector<double>> outs;
  for (const auto& o : full.outputs) outs.emplace_back(std::max<int64_t>(o.numel(), 1), NAN);
  std::vector<TensorView> out;
  for (size_t j = 0; j < outs.size(); ++j) {
    EXPECT_EQ(full.outputs[j].dtype, DType::f64);
    out.push_back(*TensorView::contiguous(outs[j].data(), DType::f64, full.outputs[j].shape));
  }
  std::vector<char> workspace((*plan)->workspace_size() + 1);
  Status st = (*plan)->run(Stream::host(), Workspace{workspace.data(), workspace.size()}, OpArgs{in, out});
  if (!st) return st;
  return outs;
}

std::vector<std::vector<double>> must(Result<std::vector<std::vector<double>>> r) {
  EXPECT_TRUE(r) << r.status().to_string();
  return r ? *r : std::vector<std::vector<double>>{};
}

double softplus(double x) { return std::log1p(std::exp(x)); }

/// Checks the host backward of `op` (its gradient op) at upstream gradient
/// g against central differences of sum(g * op(in)) at `elements` of each
/// input the backward differentiates (its outputs, in input order); `what`
/// names the case in failures. Returns the elements checked.
int check_backward_numerically(const OpInfo& op, const std::vector<Operand>& in, const Operand& g, const Attrs& attrs,
                               const std::vector<int64_t>& elements, const std::string& what) {
  const OpInfo& bwd = *find_op(op.gradient);
  std::vector<Operand> bin{g};
  bin.insert(bin.end(), in.begin(), in.end());
  const auto grads = must(host_exec(bwd.name, bin, attrs));
  EXPECT_EQ(grads.size(), bwd.output_names.size()) << bwd.name;
  int checked = 0;
  for (size_t k = 0; k < std::min(grads.size(), bwd.output_names.size()); ++k)
    for (int64_t i : elements) {
      auto loss = [&](const std::vector<double>& x) {
        std::vector<Operand> xs = in;
        xs[k].values = x;
        const auto f = must(host_exec(op.name, xs, attrs));
        return f.empty() ? NAN : weighted_sum(g.values, f[0]);
      };
      EXPECT_NEAR(grads[k][size_t(i)], central_difference(loss, in[k].values, size_t(i)), 2e-6)
          << bwd.output_names[k] << " of " << what << " i " << i;
      ++checked;
    }
  return checked;
}

// ---------------------------------------------------------------- pointwise

TEST(PointwiseLossKnownValues, ClosedForms) {
  const std::vector<double> x{0.3, -1.5, 2.0, 0.7}, y{0.1, 0.5, -0.5, 0.7};
  const Shape s{2, 2};
  auto expect_all = [&](const std::string& op, const Attrs& attrs, auto formula, std::vector<Operand> extra = {}) {
    std::vector<Operand> in{f64(x, s), f64(y, s)};
    for (auto& e : extra) in.push_back(e);
    Attrs none = attrs, mean = attrs, sum = attrs;
    none.set("reduction", 0);
    mean.set("reduction", 1);
    sum.set("reduction", 2);
    auto per = must(host_exec(op, in, none));
    double total = 0;
    for (int i = 0; i < 4; ++i) {
      const double want = formula(x[i], y[i]);
      EXPECT_NEAR(per[0][i], want, 1e-12) << op << " element " << i;
      total += want;
    }
    EXPECT_NEAR(must(host_exec(op, in, mean))[0][0], total / 4, 1e-12) << op << " mean";
    EXPECT_NEAR(must(host_exec(op, in, sum))[0][0], total, 1e-12) << op << " sum";
  };
  expect_all("mse_loss", {}, [](double a, double b) { return (a - b) * (a - b); });
  expect_all("l1_loss", {}, [](double a, double b) { return std::abs(a - b); });
  expect_all("huber_loss", {{"delta", 1.5}}, [](double a, double b) {
    const double d = std::abs(a - b);
    return d < 1.5 ? 0.5 * d * d : 1.5 * (d - 0.75);
  });
  expect_all("smooth_l1_loss", {{"beta", 0.5}}, [](double a, double b) {
    const double d = std::abs(a - b);
    return d < 0.5 ? d * d : d - 0.25;
  });
  expect_all("soft_margin_loss", {}, [](double a, double b) { return std::log(1 + std::exp(-a * b)); });
  expect_all("margin_ranking_loss", {{"margin", 0.2}},
             [](double a, double b) { return std::max(0.0, -0.5 * (a - b) + 0.2); },
             {f64({0.5, 0.5, 0.5, 0.5}, s)});
  expect_all("gaussian_nll_loss", {}, [](double a, double b) { return 0.5 * (std::log(0.8) + (a - b) * (a - b) / 0.8); },
             {f64({0.8}, {1})});
  expect_all("binary_cross_entropy_with_logits", {}, [](double a, double b) {
    const double lw = (2.0 - 1) * b + 1;  // pos_weight 2
    return 0.5 * ((1 - b) * a + lw * softplus(-a));
  }, {f64({0.5}, {}), f64({2.0}, {1})});
}

TEST(PointwiseLossKnownValues, ProbabilityLosses) {
  const Shape s{3};
  const std::vector<double> p{0.2, 0.9, 0.5}, t{0.0, 1.0, 0.3}, w{1, 2, 0.5};
  auto bce = must(host_exec("binary_cross_entropy", {f64(p, s), f64(t, s), f64(w, s)}, {{"reduction", 0}}));
  for (int i = 0; i < 3; ++i)
    EXPECT_NEAR(bce[0][i], -w[i] * (t[i] * std::log(p[i]) + (1 - t[i]) * std::log(1 - p[i])), 1e-12);
  // log(0) is clamped at -100, as in torch.
  auto clamp = must(host_exec("binary_cross_entropy", {f64({0.0}, {1}), f64({1.0}, {1}), f64({1.0}, {1})}, {{"reduction", 2}}));
  EXPECT_DOUBLE_EQ(clamp[0][0], 100.0);
  // kl_div: target (log target - input); batchmean divides by dim 0.
  const std::vector<double> lx{-1.0, -0.5, -2.0, -0.1}, ty{0.2, 0.0, 0.5, 0.3};
  auto kl = must(host_exec("kl_div", {f64(lx, {2, 2}), f64(ty, {2, 2})}, {{"reduction", 3}}));
  double want = 0;
  for (int i = 0; i < 4; ++i) want += ty[i] > 0 ? ty[i] * (std::log(ty[i]) - lx[i]) : 0;
  EXPECT_NEAR(kl[0][0], want / 2, 1e-12);
  auto klt = must(host_exec("kl_div", {f64(lx, {2, 2}), f64(lx, {2, 2})}, {{"reduction", 2}, {"log_target", 1}}));
  EXPECT_NEAR(klt[0][0], 0.0, 1e-15);
  // poisson_nll: exp(x) - y x, and x - y log(x + eps) with Stirling's term for y > 1.
  auto pn = must(host_exec("poisson_nll_loss", {f64({0.5, 2.0}, {2}), f64({3.0, 0.5}, {2})}, {{"reduction", 0}}));
  EXPECT_NEAR(pn[0][0], std::exp(0.5) - 1.5, 1e-12);
  auto pf = must(host_exec("poisson_nll_loss", {f64({0.5}, {1}), f64({3.0}, {1})},
                           {{"reduction", 0}, {"log_input", 0}, {"full", 1}}));
  EXPECT_NEAR(pf[0][0], 0.5 - 3 * std::log(0.5 + 1e-8) + 3 * std::log(3.0) - 3 + 0.5 * std::log(2 * M_PI * 3), 1e-12);
  // hinge_embedding: x where y = 1, max(0, margin - x) where y = -1.
  auto he = must(host_exec("hinge_embedding_loss", {f64({0.3, 0.3, 2.0}, {3}), f64({1, -1, -1}, {3})}, {{"reduction", 0}}));
  EXPECT_DOUBLE_EQ(he[0][0], 0.3);
  EXPECT_DOUBLE_EQ(he[0][1], 0.7);
  EXPECT_DOUBLE_EQ(he[0][2], 0.0);
  // multilabel_soft_margin: the class mean of the logistic loss, per row.
  const std::vector<double> mx{0.5, -1.0, 2.0, 0.0}, my{1, 0, 1, 1};
  auto ml = must(host_exec("multilabel_soft_margin_loss", {f64(mx, {2, 2}), f64(my, {2, 2}), f64({1.0}, {1})},
                           {{"reduction", 0}}));
  ASSERT_EQ(ml[0].size(), 2u);
  EXPECT_NEAR(ml[0][0], (softplus(-0.5) + softplus(-1.0)) / 2, 1e-12);
  EXPECT_NEAR(ml[0][1], (softplus(-2.0) + softplus(0.0)) / 2, 1e-12);
}

/// d/dx_i of sum(g * loss(x)) numerically, for every differentiable operand.
TEST(PointwiseLossFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(5);
  int checked = 0;
  for (const OpInfo& op : registry()) {
    if (op.family != "pointwise_loss") continue;
    for (double reduction : {0.0, 1.0, 2.0}) {
      const Shape s{3, 4};
      std::vector<Operand> in;
      for (size_t i = 0; i < op.input_names.size(); ++i) {
        const Domain d = op.domain(i);
        std::uniform_real_distribution<double> u(d.lo + 0.02 * (d.hi - d.lo), d.hi - 0.02 * (d.hi - d.lo));
        Operand o{std::vector<double>(12), s};
        for (auto& v : o.values) v = u(rng);
        in.push_back(o);
      }
      Attrs attrs{{"reduction", reduction}};
      const Shape out_shape = reduction == 0 ? (op.name == "multilabel_soft_margin_loss" ? Shape{3} : s) : Shape{};
      std::uniform_real_distribution<double> ug(-1, 1);
      Operand g{std::vector<double>(reduction == 0 ? (out_shape.size() == 1 ? 3 : 12) : 1), out_shape};
      for (auto& v : g.values) v = ug(rng);
      checked += check_backward_numerically(op, in, g, attrs, {0, 5, 11}, cat(op.name, " reduction ", reduction));
    }
  }
  EXPECT_GT(checked, 100);
}

// ---------------------------------------------------------------- class losses

/// log_softmax of each row of a [rows, C] matrix.
std::vector<double> log_softmax_rows(const std::vector<double>& z, int64_t rows, int64_t C) {
  std::vector<double> out(z.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, z[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(z[r * C + c] - m);
    for (int64_t c = 0; c < C; ++c) out[r * C + c] = z[r * C + c] - m - std::log(s);
  }
  return out;
}

TEST(CrossEntropyKnownValues, TorchSemantics) {
  const int64_t N = 4, C = 3;
  const std::vector<double> z{0.1, 2.0, -1.0, 0.5, 0.5, 0.5, -2.0, 1.0, 3.0, 1.0, 0.0, -1.0};
  const std::vector<double> t{1, 0, -100, 2}, w{1.0, 2.0, 0.5};
  const auto lp = log_softmax_rows(z, N, C);
  // Unweighted mean over the rows that are not ignored.
  auto mean = must(host_exec("cross_entropy", {f64(z, {N, C}), idx(t, {N}), f64({}, {0})}));
  EXPECT_NEAR(mean[0][0], -(lp[1] + lp[3] + lp[11]) / 3, 1e-12);
  // The saved logsumexp: z - log_softmax.
  EXPECT_NEAR(mean[1][0], z[0] - lp[0], 1e-6);  // stored in f64 for f64
  // Weighted mean divides by the sum of the target weights.
  auto wm = must(host_exec("cross_entropy", {f64(z, {N, C}), idx(t, {N}), f64(w, {C})}));
  EXPECT_NEAR(wm[0][0], -(2 * lp[1] + 1 * lp[3] + 0.5 * lp[11]) / 3.5, 1e-12);
  // none: per row, 0 where ignored.
  auto none = must(host_exec("cross_entropy", {f64(z, {N, C}), idx(t, {N}), f64({}, {0})}, {{"reduction", 0}}));
  EXPECT_NEAR(none[0][0], -lp[1], 1e-12);
  EXPECT_DOUBLE_EQ(none[0][2], 0.0);
  // Label smoothing, unweighted mean: both terms over the rows not ignored (torch 2.11).
  const double e = 0.3;
  auto sm = must(host_exec("cross_entropy", {f64(z, {N, C}), idx(t, {N}), f64({}, {0})}, {{"label_smoothing", e}}));
  double nll = -(lp[1] + lp[3] + lp[11]) / 3, smooth = 0;
  for (int64_t r : {0, 1, 3})
    for (int64_t c = 0; c < C; ++c) smooth -= lp[r * C + c];
  EXPECT_NEAR(sm[0][0], (1 - e) * nll + e / C * smooth / 3, 1e-12);
  // Weighted smoothing: both terms over the sum of target weights.
  auto wsm = must(host_exec("cross_entropy", {f64(z, {N, C}), idx(t, {N}), f64(w, {C})}, {{"label_smoothing", e}}));
  double wsmooth = 0;
  for (int64_t r : {0, 1, 3})
    for (int64_t c = 0; c < C; ++c) wsmooth -= w[c] * lp[r * C + c];
  EXPECT_NEAR(wsm[0][0], (1 - e) * (-(2 * lp[1] + lp[3] + 0.5 * lp[11]) / 3.5) + e / C * wsmooth / 3.5, 1e-12);
  // Probability targets: -sum p log_softmax, mean over rows.
  std::vector<double> p(N * C, 0.0);
  for (int64_t r = 0; r < N; ++r) p[r * C + r % C] = 0.75, p[r * C + (r + 1) % C] = 0.25;
  auto pr = must(host_exec("cross_entropy", {f64(z, {N, C}), f64(p, {N, C}), f64({}, {0})}));
  double want = 0;
  for (int64_t i = 0; i < N * C; ++i) want -= p[i] * lp[i];
  EXPECT_NEAR(pr[0][0], want / N, 1e-12);
  // Class dim 1 of [N, C, d]: the same as moving the classes last.
  std::vector<double> z3(N * C * 2);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c) z3[(n * C + c) * 2] = z[n * C + c], z3[(n * C + c) * 2 + 1] = 0;
  auto spatial = must(host_exec("cross_entropy", {f64(z3, {N, C, 2}), idx({1, 0, 0, 0, -100, 0, 2, 0}, {N, 2}), f64({}, {0})},
                                {{"reduction", 0}}));
  EXPECT_NEAR(spatial[0][0], -lp[1], 1e-12);
  EXPECT_NEAR(spatial[0][1], std::log(3.0), 1e-12);
  // nll_loss of log_softmax is cross_entropy.
  auto nl = must(host_exec("nll_loss", {f64(lp, {N, C}), idx(t, {N}), f64(w, {C})}));
  EXPECT_NEAR(nl[0][0], wm[0][0], 1e-12);
  // Every row ignored: 0 / 0, as torch.
  auto all_ignored = must(host_exec("cross_entropy", {f64(z, {N, C}), idx({-100, -100, -100, -100}, {N}), f64({}, {0})}));
  EXPECT_TRUE(std::isnan(all_ignored[0][0]));
}

// A mean over nothing (an empty batch) is 0 / 0: nan, as torch; a sum is 0.
// Pointwise losses wrote the empty sum (0) and the class losses' host path
// 0 where the CUDA finalize gave nan.
TEST(LossKnownValues, MeanOverAnEmptyBatchIsNan) {
  const Operand rows = f64({}, {0, 5}), targets = idx({}, {0}), no_weight = f64({}, {0});
  const std::vector<std::pair<std::string, std::vector<Operand>>> cases{
      {"mse_loss", {rows, rows}},
      {"l1_loss", {rows, rows}},
      {"binary_cross_entropy_with_logits", {rows, rows, f64({1.0}, {}), f64({2.0}, {1})}},  // weight, pos_weight
      {"cross_entropy", {rows, targets, no_weight}},
      {"cross_entropy", {rows, rows, no_weight}},  // probabilities
      {"nll_loss", {rows, targets, no_weight}},
      {"multilabel_soft_margin_loss", {rows, rows, f64({1.0}, {1})}},
  };
  for (const auto& [op, in] : cases) {
    auto mean = host_exec(op, in);
    ASSERT_TRUE(mean) << op << ": " << mean.status().to_string();
    EXPECT_TRUE(std::isnan((*mean)[0][0])) << op << " mean: " << (*mean)[0][0];
    auto sum = host_exec(op, in, {{"reduction", 2}});
    ASSERT_TRUE(sum) << op << ": " << sum.status().to_string();
    EXPECT_EQ((*sum)[0][0], 0.0) << op << " sum";
  }
  auto batchmean = host_exec("kl_div", {rows, rows}, {{"reduction", 3}});
  ASSERT_TRUE(batchmean) << batchmean.status().to_string();
  EXPECT_TRUE(std::isnan((*batchmean)[0][0]));
}

TEST(CrossEntropyFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> u(-2, 2);
  const int64_t N = 3, C = 4;
  std::vector<double> z(N * C);
  for (auto& v : z) v = u(rng);
  std::vector<double> probs(N * C);
  for (auto& v : probs) v = std::abs(u(rng));
  struct Case {
    Operand target;
    bool weighted;
    double reduction, smoothing;
  };
  const std::vector<Case> cases{{idx({1, -100, 3}, {N}), false, 1, 0},   {idx({1, 0, 3}, {N}), true, 1, 0.2},
                                {idx({2, 2, -100}, {N}), true, 0, 0.1},  {idx({0, 1, 2}, {N}), false, 2, 0.3},
                                {f64(probs, {N, C}), true, 1, 0.2},      {f64(probs, {N, C}), false, 0, 0}};
  for (const Case& c : cases) {
    const Operand w = c.weighted ? f64({0.5, 1.5, 1.0, 2.0}, {C}) : f64({}, {0});
    const Attrs attrs{{"reduction", c.reduction}, {"label_smoothing", c.smoothing}};
    auto fwd = must(host_exec("cross_entropy", {f64(z, {N, C}), c.target, w}, attrs));
    Operand g{std::vector<double>(c.reduction == 0 ? N : 1), c.reduction == 0 ? Shape{N} : Shape{}};
    for (auto& v : g.values) v = u(rng);
    auto dx = must(host_exec("cross_entropy_backward", {g, f64(z, {N, C}), c.target, w, f64(fwd[1], {N})}, attrs));
    auto objective = [&](std::vector<double> zs) {
      auto f = must(host_exec("cross_entropy", {f64(zs, {N, C}), c.target, w}, attrs));
      double l = 0;
      for (size_t i = 0; i < g.values.size(); ++i) l += g.values[i] * f[0][i];
      return l;
    };
    for (int i = 0; i < N * C; ++i) {
      const double h = 1e-6;
      auto zp = z, zm = z;
      zp[i] += h;
      zm[i] -= h;
      EXPECT_NEAR(dx[0][i], (objective(zp) - objective(zm)) / (2 * h), 1e-6)
          << "reduction " << c.reduction << " smoothing " << c.smoothing << " i " << i;
    }
    // The fused op returns the same loss and the gradient for grad_output = 1.
    auto fused = must(host_exec("cross_entropy_fused", {f64(z, {N, C}), c.target, w}, attrs));
    if (c.reduction != 0) {
      EXPECT_NEAR(fused[0][0], fwd[0][0], 1e-14);
      auto dx1 = must(host_exec("cross_entropy_backward", {f64({1.0}, {}), f64(z, {N, C}), c.target, w, f64(fwd[1], {N})}, attrs));
      for (int i = 0; i < N * C; ++i) EXPECT_NEAR(fused[1][i], dx1[0][i], 1e-14);
    }
  }
  // nll_loss_backward: -w_t / sum(w_t) at the targets, 0 elsewhere.
  auto dn = must(host_exec("nll_loss_backward", {f64({1.0}, {}), f64(z, {N, C}), idx({1, -100, 3}, {N}),
                                                 f64({0.5, 1.5, 1.0, 2.0}, {C})}));
  for (int i = 0; i < N * C; ++i) EXPECT_DOUBLE_EQ(dn[0][i], i == 1 ? -1.5 / 3.5 : i == 11 ? -2.0 / 3.5 : 0.0) << i;
}

// ---------------------------------------------------------------- row losses

TEST(RowLossKnownValues, TorchSemantics) {
  auto cos = [](std::vector<double> a, std::vector<double> b) {
    double d = 0, s1 = 1e-12, s2 = 1e-12;
    for (size_t i = 0; i < a.size(); ++i) d += a[i] * b[i], s1 += a[i] * a[i], s2 += b[i] * b[i];
    return d / std::sqrt(s1 * s2);
  };
  // cosine_embedding: 1 - cos where target 1, max(0, cos - margin) where -1, 0 for any other target.
  const std::vector<double> x1{1, 2, 0.5, -1, 3, 1, 0, 2}, x2{2, 1, 0.5, 1, 2, 1, 1, 1};
  auto ce = must(host_exec("cosine_embedding_loss", {f64(x1, {4, 2}), f64(x2, {4, 2}), f64({1, -1, -1, 0}, {4})},
                           {{"reduction", 0}, {"margin", 0.1}}));
  EXPECT_NEAR(ce[0][0], 1 - cos({1, 2}, {2, 1}), 1e-12);
  EXPECT_NEAR(ce[0][1], 0.0, 1e-12);  // cos < margin
  EXPECT_NEAR(ce[0][2], cos({3, 1}, {2, 1}) - 0.1, 1e-12);
  EXPECT_EQ(ce[0][3], 0.0);
  auto ce1 = must(host_exec("cosine_embedding_loss", {f64({3, 1}, {2}), f64({2, 1}, {2}), idx({1}, {})}));
  EXPECT_NEAR(ce1[0][0], 1 - cos({3, 1}, {2, 1}), 1e-12);  // [D] inputs, a 0-d (integer) target
  // triplet_margin: max(0, margin + |a - p + eps|_p - |a - n + eps|_p), swap takes min(d(a, n), d(p, n)).
  const Operand a = f64({0, 0, 1, 1}, {2, 2}), q = f64({3, 4, 1, 1}, {2, 2}), n = f64({1, 0, 4, 5}, {2, 2});
  auto tm = must(host_exec("triplet_margin_loss", {a, q, n}, {{"reduction", 0}, {"eps", 0}}));
  EXPECT_NEAR(tm[0][0], 1 + 5 - 1, 1e-12);
  EXPECT_EQ(tm[0][1], 0.0);
  auto tm1 = must(host_exec("triplet_margin_loss", {a, q, n}, {{"reduction", 2}, {"eps", 0}, {"p", 1}}));
  EXPECT_NEAR(tm1[0][0], 1 + 7 - 1, 1e-12);
  auto sw = must(host_exec("triplet_margin_loss", {f64({0, 0}, {2}), f64({1, 0}, {2}), f64({2, 0}, {2})},
                           {{"eps", 0}, {"swap", 1}, {"margin", 0.5}}));
  EXPECT_NEAR(sw[0][0], 0.5 + 1 - 1, 1e-12);  // d(p, n) = 1 < d(a, n) = 2
  auto te = must(host_exec("triplet_margin_loss", {f64({0, 0}, {2}), f64({0, 0}, {2}), f64({3, 4}, {2})},
                           {{"margin", 5.5}}));
  EXPECT_NEAR(te[0][0], 5.5 + std::sqrt(2e-12) - std::hypot(3 - 1e-6, 4 - 1e-6), 1e-12);  // eps on the difference
  // multi_margin (torch's docs): x = [0.1, 0.2, 0.4, 0.8], y = 3 -> 0.325.
  const Operand mx = f64({0.1, 0.2, 0.4, 0.8}, {1, 4});
  EXPECT_NEAR(must(host_exec("multi_margin_loss", {mx, idx({3}, {1}), f64({}, {0})}))[0][0], 0.325, 1e-12);
  EXPECT_NEAR(must(host_exec("multi_margin_loss", {mx, idx({3}, {1}), f64({}, {0})}, {{"p", 2}}))[0][0],
              (0.09 + 0.16 + 0.36) / 4, 1e-12);
  EXPECT_NEAR(must(host_exec("multi_margin_loss", {mx, idx({3}, {1}), f64({1, 1, 1, 2.5}, {4})}, {{"margin", 0.5}}))[0][0],
              2.5 * (0.0 + 0.0 + 0.1) / 4, 1e-12);
  // multilabel_margin (torch's docs): the list ends at the first -1 (the 1 after it is not a target) -> 0.85.
  EXPECT_NEAR(must(host_exec("multilabel_margin_loss", {mx, idx({3, 0, -1, 1}, {1, 4})}))[0][0], 0.85, 1e-12);
  // A listed class twice counts twice; [C] inputs.
  auto dup = must(host_exec("multilabel_margin_loss", {f64({0.1, 0.2, 0.4, 0.8}, {4}), idx({3, 3, -1, -1}, {4})}));
  EXPECT_NEAR(dup[0][0], 2 * (0.3 + 0.4 + 0.6) / 4, 1e-12);
}

// multilabel_margin keeps lists of up to 8 classes in registers and marks longer ones in a mask
// (Note [Multilabel lists in registers]): both against the sums written out, duplicates included.
TEST(RowLossKnownValues, MultilabelShortAndLongLists) {
  const int64_t N = 2, C = 14;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-1.5, 1.5);
  std::vector<double> x(N * C), t(N * C, 0.0), go{0.7, -1.3};
  for (auto& v : x) v = u(rng);
  const std::vector<std::vector<int64_t>> lists{{3, 7, 0, 12, 7, 5, 9, 1, 13, 2}, {6, 2, 6}};
  for (int64_t r = 0; r < N; ++r) {
    for (size_t j = 0; j < lists[r].size(); ++j) t[r * C + j] = double(lists[r][j]);
    t[r * C + lists[r].size()] = -1;  // entries after the -1 (zeros) are not listed
  }
  auto loss = must(host_exec("multilabel_margin_loss", {f64(x, {N, C}), idx(t, {N, C})}, {{"reduction", 0}}));
  auto grad = must(host_exec("multilabel_margin_loss_backward", {f64(go, {N}), f64(x, {N, C}), idx(t, {N, C})},
                             {{"reduction", 0}}));
  for (int64_t r = 0; r < N; ++r) {
    const double* xr = x.data() + r * C;
    std::vector<bool> listed(C, false);
    for (int64_t j : lists[r]) listed[j] = true;
    double want = 0;
    std::vector<double> g(C, 0.0);
    for (int64_t j : lists[r])
      for (int64_t c = 0; c < C; ++c) {
        if (listed[c]) continue;
        const double z = 1 - xr[j] + xr[c];
        want += std::max(z, 0.0) / C;
        if (z > 0) g[c] += go[r] / C, g[j] -= go[r] / C;
      }
    EXPECT_NEAR(loss[0][r], want, 1e-12) << "row " << r;
    for (int64_t c = 0; c < C; ++c) EXPECT_NEAR(grad[0][r * C + c], g[c], 1e-12) << "row " << r << " class " << c;
  }
}

/// d/dx_i of sum(g * loss(x)) numerically, for every differentiable operand and sample attribute set.
TEST(RowLossFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<double> u(-2, 2), uw(0.5, 2);
  const int64_t N = 3, C = 5;
  int checked = 0;
  for (const OpInfo& op : registry()) {
    if (op.family != "row_loss") continue;
    for (const Attrs& attrs : op.sample_attrs) {
      std::vector<Operand> in;
      for (const std::string& name : op.input_names) {
        Operand o{std::vector<double>(N * C), {N, C}};
        if (name == "weight") {
          o.values.resize(C), o.shape = {C};
          for (auto& v : o.values) v = uw(rng);
        } else if (name == "target" && op.name == "multilabel_margin_loss") {
          o.dtype = DType::i64;
          for (int64_t r = 0; r < N; ++r)  // r + 1 listed classes (one twice), then -1
            for (int64_t c = 0; c < C; ++c) o.values[r * C + c] = c <= r ? double((2 * c + r) % C) : c == r + 1 ? -1 : 0;
          o.values[2 * C + 2] = o.values[2 * C];
        } else if (name == "target") {
          o.values = op.name == "multi_margin_loss" ? std::vector<double>{4, 0, 2} : std::vector<double>{1, -1, -1};
          o.shape = {N};
          o.dtype = op.name == "multi_margin_loss" ? DType::i64 : DType::f64;
        } else {
          for (auto& v : o.values) v = u(rng);
        }
        in.push_back(o);
      }
      const bool none = attrs.get("reduction", 1) == 0;
      Operand g{std::vector<double>(none ? N : 1), none ? Shape{N} : Shape{}};
      for (auto& v : g.values) v = u(rng);
      std::vector<int64_t> every(N * C);
      for (int64_t i = 0; i < N * C; ++i) every[size_t(i)] = i;
      checked += check_backward_numerically(op, in, g, attrs, every,
                                            cat(op.name, " reduction ", attrs.get("reduction", 1)));
    }
  }
  EXPECT_GT(checked, 500);
}

TEST(LossErrors, RowLossBadInputIsNamed) {
  auto message = [](Result<std::vector<std::vector<double>>> r) {
    return error_message(r);
  };
  const Operand x = f64(std::vector<double>(6, 0.5), {2, 3}), none = f64({}, {0});
  auto range = message(host_exec("multi_margin_loss", {x, idx({1, 3}, {2}), none}));
  EXPECT_TRUE(has(range, "class index 3 (row 1), outside [0, 3)")) << range;
  auto list = message(host_exec("multilabel_margin_loss", {x, idx({0, -2, -1, 1, 2, 3}, {2, 3})}));
  EXPECT_TRUE(has(list, "class index -2 (row 0), outside [-1, 3)")) << list;
  auto lshape = message(host_exec("multilabel_margin_loss", {x, idx({0, -1}, {2})}));
  EXPECT_TRUE(has(lshape, "'target' shape [2] != [2, 3]")) << lshape;
  auto p = message(host_exec("multi_margin_loss", {x, idx({1, 0}, {2}), none}, {{"p", 3}}));
  EXPECT_TRUE(has(p, "'p' must be 1 or 2, got 3")) << p;
  auto tp = message(host_exec("triplet_margin_loss", {x, x, x}, {{"p", -1}}));
  EXPECT_TRUE(has(tp, "'p' (the norm) must be finite and > 0")) << tp;
  auto weight = message(host_exec("multi_margin_loss", {x, idx({1, 0}, {2}), f64({1, 1}, {2})}));
  EXPECT_TRUE(has(weight, "'weight' must be f64[3]")) << weight;
  auto ftarget = message(host_exec("multi_margin_loss", {x, f64({1, 0}, {2}), none}));
  EXPECT_TRUE(has(ftarget, "'target' must be i64 or i32, got f64")) << ftarget;
  auto shape2 = message(host_exec("cosine_embedding_loss", {x, f64({1, 2, 3}, {3}), f64({1, -1}, {2})}));
  EXPECT_TRUE(has(shape2, "'input2' must be f64[2, 3] like 'input1', got f64[3]")) << shape2;
  auto tshape = message(host_exec("cosine_embedding_loss", {x, x, f64({1, -1, 1}, {3})}));
  EXPECT_TRUE(has(tshape, "'target' shape [3] != [2]")) << tshape;
  auto rank = message(host_exec("cosine_embedding_loss", {f64({1, 2}, {1, 1, 2}), f64({1, 2}, {1, 1, 2}), f64({1}, {1, 1})}));
  EXPECT_TRUE(has(rank, "'input1' must be [N, D] or [D], got [1, 1, 2]")) << rank;
  auto neg = message(host_exec("triplet_margin_loss", {x, x, f64({1, 2}, {2})}));
  EXPECT_TRUE(has(neg, "'negative' must be f64[2, 3] like 'anchor'")) << neg;
  auto empty = message(host_exec("multi_margin_loss", {f64({}, {2, 0}), idx({0, 0}, {2}), none}));
  EXPECT_TRUE(has(empty, "has no classes")) << empty;
  auto go = message(host_exec("multi_margin_loss_backward", {f64({1, 1}, {2}), x, idx({1, 0}, {2}), none}));
  EXPECT_TRUE(has(go, "'grad_output' must be f64[]")) << go;
}

TEST(LossErrors, LinearCrossEntropyBadInputIsNamed) {
  auto message = [](Result<OpDesc> r) { return error_message(r); };
  const TensorSpec x{DType::bf16, {8, 16}}, w{DType::bf16, {10, 16}}, t{DType::i64, {8}}, b{DType::bf16, {10}};
  const TensorSpec cw{DType::bf16, {0}};
  const std::string op = "linear_cross_entropy_fused";
  auto wh = infer(op, {x, TensorSpec{DType::bf16, {10, 15}}, t, b, cw});
  EXPECT_TRUE(has(message(wh), "'weight' must be bf16[V, 16]") && has(message(wh), "[10, 15]")) << message(wh);
  auto tl = infer(op, {x, w, TensorSpec{DType::i64, {7}}, b, cw});
  EXPECT_TRUE(has(message(tl), "'target' shape [7] != [8]")) << message(tl);
  auto bl = infer(op, {x, w, t, TensorSpec{DType::bf16, {9}}, cw});
  EXPECT_TRUE(has(message(bl), "'bias' must be bf16[10]") && has(message(bl), "bf16[9]")) << message(bl);
  auto td = infer(op, {x, w, TensorSpec{DType::f32, {8}}, b, cw});
  auto cl = infer(op, {x, w, t, b, TensorSpec{DType::bf16, {9}}});
  EXPECT_TRUE(has(message(cl), "'class_weight' must be bf16[10]") && has(message(cl), "bf16[9]")) << message(cl);
  EXPECT_TRUE(has(message(td), "'target' must hold class indices (i64 or i32), got f32")) << message(td);
  auto wd = infer(op, {x, TensorSpec{DType::f16, {10, 16}}, t, b, cw});
  EXPECT_TRUE(has(message(wd), "'weight' must be bf16")) << message(wd);
  auto go = infer("linear_cross_entropy_backward", {TensorSpec{DType::bf16, {8}}, x, w, t, b, cw});
  EXPECT_TRUE(has(message(go), "'grad_output' must be bf16[]")) << message(go);
  auto chunk = infer(op, {x, w, t, b, cw}, Attrs{{"chunk_rows", -2}});
  EXPECT_TRUE(has(message(chunk), "'chunk_rows'")) << message(chunk);
  auto range = host_exec("linear_cross_entropy", {f64(std::vector<double>(4, 0.5), {2, 2}), f64(std::vector<double>(6, 0.1), {3, 2}),
                                                  idx({1, 3}, {2}), f64({}, {0}), f64({}, {0})});
  EXPECT_TRUE(!range && has(range.status().message(), "'target' holds class index 3")) << (range ? "" : range.status().message());
}

TEST(LossErrors, BadInputIsNamed) {
  auto message = [](Result<std::vector<std::vector<double>>> r) {
    return error_message(r);
  };
  const std::vector<double> z(6, 0.5);
  auto range = host_exec("cross_entropy", {f64(z, {2, 3}), idx({1, 3}, {2}), f64({}, {0})});
  EXPECT_TRUE(has(message(range), "cross_entropy: 'target' holds class index 3")) << message(range);
  EXPECT_FALSE(has(message(range), "cross_entropy: cross_entropy")) << message(range);  // the op named once
  auto neg = host_exec("nll_loss", {f64(z, {2, 3}), idx({-5, 0}, {2}), f64({}, {0})});
  EXPECT_TRUE(has(message(neg), "outside [0, 3)")) << message(neg);
  EXPECT_FALSE(has(message(neg), "nll_loss: nll_loss")) << message(neg);
  auto weight = host_exec("cross_entropy", {f64(z, {2, 3}), idx({1, 0}, {2}), f64({1, 1}, {2})});
  EXPECT_TRUE(has(message(weight), "'weight' must be f64[3]")) << message(weight);
  auto tshape = host_exec("cross_entropy", {f64(z, {2, 3}), idx({1, 0, 0}, {3}), f64({}, {0})});
  EXPECT_TRUE(has(message(tshape), "'target' shape [3] != [2]")) << message(tshape);
  auto red = host_exec("mse_loss", {f64(z, {2, 3}), f64(z, {2, 3})}, {{"reduction", 7}});
  EXPECT_TRUE(has(message(red), "'reduction' must be")) << message(red);
  auto bshape = host_exec("mse_loss", {f64(z, {2, 3}), f64({1, 2}, {2})});
  EXPECT_TRUE(has(message(bshape), "does not broadcast")) << message(bshape);
  auto smooth = host_exec("cross_entropy", {f64(z, {2, 3}), idx({1, 0}, {2}), f64({}, {0})}, {{"label_smoothing", 1.5}});
  EXPECT_TRUE(has(message(smooth), "label_smoothing")) << message(smooth);
}

}  // namespace
