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

std::vector<std::string> ops_of(OpCategory category) {
  std::vector<std::string> names;
  for (const OpInfo& op : registry())
    if (op.category == category) names.push_back(op.name);
  return names;
}

std::string param_name(const testing::TestParamInfo<std::string>& info) { return info.param; }

class Softmax : public testing::TestWithParam<std::string> {};
TEST_P(Softmax, HostMatchesReference) { sweep(*find_op(GetParam()), Backend::host_reference); }
TEST_P(Softmax, CudaMatchesReference) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  sweep(*find_op(GetParam()), Backend::bespoke_cuda);
}
INSTANTIATE_TEST_SUITE_P(Ops, Softmax, testing::ValuesIn(ops_of(OpCategory::softmax)), param_name);

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

}  // namespace
