// Bad input: every kind gives a clear error naming the operand, never a crash.
#include <gtest/gtest.h>

#include <vector>

#include "baracuda/registry.hpp"

using namespace baracuda;

namespace {

struct Buffers {
  std::vector<float> a = std::vector<float>(64, 1.f), b = std::vector<float>(64, 2.f), out = std::vector<float>(64);
};

TensorView view(void* data, DType d, Shape shape) { return *TensorView::contiguous(data, d, shape); }

void expect_error(const Status& s, ErrorKind kind, std::initializer_list<const char*> fragments) {
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.kind(), kind) << s.to_string();
  for (const char* f : fragments) EXPECT_NE(s.message().find(f), std::string::npos) << "'" << f << "' not in: " << s.message();
}

// Context names an op once: an op's own check may already start with its name.
TEST(Errors, ContextIsAddedOnce) {
  Status s = Status::error(ErrorKind::invalid_problem, "'target' holds class index 7");
  s.with_context("nll_loss").with_context("nll_loss");
  EXPECT_EQ(s.message(), "nll_loss: 'target' holds class index 7");
  s.with_context("nll").with_context("run");
  EXPECT_EQ(s.message(), "run: nll: nll_loss: 'target' holds class index 7");  // a prefix of the name is not the name
  Status ok = Status::ok();
  EXPECT_TRUE(ok.with_context("add").is_ok());
}

TEST(Errors, ShapesThatDoNotBroadcast) {
  auto r = infer("add", {{DType::f32, {3, 4}}, {DType::f32, {5}}});
  ASSERT_FALSE(r);
  expect_error(r.status(), ErrorKind::invalid_problem, {"add", "'other' has size 5", "[3, 4]"});
}

TEST(Errors, DtypeMismatchAndUnsupportedDtype) {
  auto r = infer("mul", {{DType::f32, {4}}, {DType::f16, {4}}});
  ASSERT_FALSE(r);
  expect_error(r.status(), ErrorKind::invalid_problem, {"mul", "'other'", "f16", "f32"});
  auto u = infer("exp", {{DType::i32, {4}}});
  ASSERT_FALSE(u);
  expect_error(u.status(), ErrorKind::unsupported, {"exp", "i32", "supported: f32 f16 bf16 f64"});
  auto w = infer("where", {{DType::f32, {4}}, {DType::f32, {4}}, {DType::f32, {4}}});
  ASSERT_FALSE(w);
  expect_error(w.status(), ErrorKind::invalid_problem, {"'condition' must be bool"});
}

TEST(Errors, OutputShapeAndDtypeChecked) {
  OpDesc d{"relu", {{DType::f32, {4, 4}}}, {{DType::f32, {4, 5}}}, {}};
  auto s = select(Stream::host(), d);
  ASSERT_FALSE(s);
  expect_error(s.status(), ErrorKind::invalid_problem, {"relu", "'out' shape [4, 5]", "[4, 4]"});
  OpDesc e{"eq", {{DType::f32, {4}}, {DType::f32, {4}}}, {{DType::f32, {4}}}, {}};
  auto t = select(Stream::host(), e);
  ASSERT_FALSE(t);
  expect_error(t.status(), ErrorKind::invalid_problem, {"'out' dtype f32", "bool"});
}

TEST(Errors, ArgumentsMustMatchTheDescriptor) {
  Buffers m;
  auto plan = check(select(Stream::host(), *infer("add", {{DType::f32, {4, 4}}, {DType::f32, {4, 4}}})));
  TensorView in[2] = {view(m.a.data(), DType::f32, {4, 4}), view(m.b.data(), DType::f32, {4, 3})};
  TensorView out = view(m.out.data(), DType::f32, {4, 4});
  expect_error(plan->can_implement({in, std::span(&out, 1)}), ErrorKind::invalid_problem,
               {"'other' shape [4, 3]", "descriptor shape [4, 4]"});
  in[1] = view(m.b.data(), DType::f16, {4, 4});
  expect_error(plan->run(Stream::host(), {}, {in, std::span(&out, 1)}), ErrorKind::invalid_problem,
               {"'other' dtype f16"});
  in[1] = view(nullptr, DType::f32, {4, 4});
  expect_error(plan->run(Stream::host(), {}, {in, std::span(&out, 1)}), ErrorKind::invalid_problem,
               {"'other' has null data"});
  expect_error(plan->run(Stream::host(), {}, {std::span(in, 1), std::span(&out, 1)}), ErrorKind::invalid_problem,
               {"expected 2 inputs"});
}

TEST(Errors, OverlapRules) {
  Buffers m;
  Shape s{4, 4};
  auto plan = check(select(Stream::host(), *infer("sub", {{DType::f32, s}, {DType::f32, s}})));
  TensorView a = view(m.a.data(), DType::f32, s), b = view(m.b.data(), DType::f32, s);
  // In place with the same layout is allowed.
  TensorView in[2] = {a, b};
  EXPECT_TRUE(plan->run(Stream::host(), {}, {in, std::span(&a, 1)}));
  EXPECT_EQ(m.a[0], -1.f);
  // The output overlapping an input with other strides is rejected.
  int64_t transposed[] = {1, 4};
  TensorView at = *TensorView::strided(m.a.data(), DType::f32, s, transposed);
  expect_error(plan->run(Stream::host(), {}, {in, std::span(&at, 1)}), ErrorKind::invalid_problem,
               {"output 'out' overlaps input 'input'", "different layout"});
  // A partially shifted output too.
  TensorView shifted = view(m.a.data() + 1, DType::f32, s);
  expect_error(plan->run(Stream::host(), {}, {in, std::span(&shifted, 1)}), ErrorKind::invalid_problem, {"overlaps"});
  // An output whose elements alias each other.
  int64_t expanded[] = {0, 1};
  TensorView self_overlap = *TensorView::strided(m.out.data(), DType::f32, s, expanded);
  expect_error(plan->run(Stream::host(), {}, {in, std::span(&self_overlap, 1)}), ErrorKind::invalid_problem,
               {"output 'out' has overlapping elements"});
  // Two outputs of a backward plan overlapping.
  auto bwd = check(select(Stream::host(), *infer("mul_backward", {{DType::f32, s}, {DType::f32, s}, {DType::f32, s}})));
  TensorView out = view(m.out.data(), DType::f32, s);
  TensorView bin[3] = {a, b, b}, bout[2] = {out, out};
  expect_error(bwd->run(Stream::host(), {}, {bin, bout}), ErrorKind::invalid_problem, {"overlap in memory"});
}

TEST(Errors, RankAndSizeLimits) {
  auto r = infer("exp", {{DType::f32, Shape(9, 1)}});
  ASSERT_FALSE(r);
  expect_error(r.status(), ErrorKind::invalid_problem, {"rank 9", "maximum is 8"});
  auto o = infer("exp", {{DType::f32, {int64_t(1) << 40, int64_t(1) << 40}}});
  ASSERT_FALSE(o);
  expect_error(o.status(), ErrorKind::invalid_problem, {"2^63"});
  auto n = infer("exp", {{DType::f32, {-3}}});
  ASSERT_FALSE(n);
  expect_error(n.status(), ErrorKind::invalid_problem, {"negative"});
}

TEST(Errors, AttributesAndGatedShapes) {
  auto odd = infer("swiglu", {{DType::f32, {4, 7}}});
  ASSERT_FALSE(odd);
  expect_error(odd.status(), ErrorKind::invalid_problem, {"swiglu", "must be even"});
  auto dim = infer("glu", {{DType::f32, {4, 8}}}, Attrs{{"dim", 2}});
  ASSERT_FALSE(dim);
  expect_error(dim.status(), ErrorKind::invalid_problem, {"dim 2 is out of range"});
  auto cast = infer("cast", {{DType::f32, {4}}}, Attrs{{"dtype", 99}});
  ASSERT_FALSE(cast);
  expect_error(cast.status(), ErrorKind::invalid_problem, {"'dtype' must be a dtype code"});
  auto fill = infer("fill", {});
  ASSERT_FALSE(fill);
  expect_error(fill.status(), ErrorKind::invalid_problem, {"give the output spec"});
  auto grad = infer("mul_backward", {{DType::f32, {4, 4}}, {DType::f32, {4, 1}}, {DType::f32, {1}}});
  ASSERT_FALSE(grad);
  expect_error(grad.status(), ErrorKind::invalid_problem, {"grad_output shape [4, 4]", "[4, 1]"});
}

TEST(Errors, EmptyTensorsAreANoOp) {
  std::vector<float> dummy(1, 5.f);
  Shape s{0, 3};
  auto plan = check(select(Stream::host(), *infer("gelu", {{DType::f32, s}})));
  TensorView v = view(nullptr, DType::f32, s);
  EXPECT_TRUE(plan->run(Stream::host(), {}, {std::span(&v, 1), std::span(&v, 1)}));
}

}  // namespace
