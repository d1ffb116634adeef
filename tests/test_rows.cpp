// Row families (softmax): every op x dtype x dim x shape x layout against the
// host reference in f64, backward against finite differences of the forward
// on the host, closed forms, and bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "baracuda/registry.hpp"
#include "harness.hpp"
#include "sweep.hpp"

using namespace baracuda;
using namespace baracuda::harness;
using namespace baracuda::testing_support;

namespace {

class Softmax : public testing::TestWithParam<std::string> {};
TEST_P(Softmax, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Softmax, CudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
INSTANTIATE_TEST_SUITE_P(Ops, Softmax, testing::ValuesIn(ops_of(OpCategory::softmax)), param_name);

class Norm : public testing::TestWithParam<std::string> {};
TEST_P(Norm, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Norm, CudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
INSTANTIATE_TEST_SUITE_P(Ops, Norm, testing::ValuesIn(ops_of(OpCategory::norm)), param_name);

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
      auto loss = [&](const std::vector<double>& xs) {
        auto f = host_run(name, {xs}, s, attrs);
        double l = 0;
        for (size_t i = 0; i < f.size(); ++i) l += g[i] * f[i];
        return l;
      };
      for (int i : {0, 4, 7, 14}) {
        const double h = 1e-6;
        auto xp = x, xm = x;
        xp[i] += h;
        xm[i] -= h;
        EXPECT_NEAR(dx[i], (loss(xp) - loss(xm)) / (2 * h), 1e-6) << name << " dim " << dim << " i " << i;
      }
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

/// Loss sum(g * out) differentiated numerically through each input.
TEST(NormFiniteDifferences, BackwardMatchesForward) {
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<double> u(-2, 2);
  const int rows = 3, cols = 5;
  auto rnd = [&](int n) {
    std::vector<double> v(n);
    for (auto& e : v) e = u(rng);
    return v;
  };
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
      auto o = forward(xv, wv, bv)[0];
      double l = 0;
      for (size_t i = 0; i < o.size(); ++i) l += g[i] * o[i];
      return l;
    };
    auto fwd = forward(x, w, b);
    std::vector<std::vector<double>> bin{g, x};
    std::vector<Shape> bshapes{xs, xs};
    if (!rms) bin.push_back(fwd[1]), bshapes.push_back(ss);
    bin.push_back(fwd[rms ? 1 : 2]), bshapes.push_back(ss);
    if (affine) bin.push_back(w), bshapes.push_back(ws);
    auto grads = host_norm(op + "_backward", bin, bshapes);
    const double h = 1e-6;
    for (int i : {0, 6, 14}) {
      auto xp = x, xm = x;
      xp[i] += h, xm[i] -= h;
      EXPECT_NEAR(grads[0][i], (loss(xp, w, b) - loss(xm, w, b)) / (2 * h), 1e-5) << op << " dx " << i;
    }
    if (affine)
      for (int c : {0, 3}) {
        auto wp = w, wm = w, bp = b, bm = b;
        wp[c] += h, wm[c] -= h, bp[c] += h, bm[c] -= h;
        EXPECT_NEAR(grads[1][c], (loss(x, wp, b) - loss(x, wm, b)) / (2 * h), 1e-5) << op << " dw " << c;
        if (!rms) EXPECT_NEAR(grads[2][c], (loss(x, w, bp) - loss(x, w, bm)) / (2 * h), 1e-5) << op << " db " << c;
      }
  }
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
