// Core API: dtypes, views, broadcasting, overlap rules, registry and select.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <random>
#include <set>

#include "baracuda/registry.hpp"
#include "core/tensor_util.hpp"

using namespace baracuda;

TEST(DType, NamesSizesAndRoundTrip) {
  EXPECT_EQ(all_dtypes().size(), size_t(kNumDTypes));
  const std::pair<DType, size_t> sizes[] = {{DType::f32, 4}, {DType::f16, 2}, {DType::bf16, 2}, {DType::f64, 8},
                                            {DType::fp8_e4m3, 1}, {DType::fp8_e5m2, 1}, {DType::i8, 1},
                                            {DType::u8, 1}, {DType::i16, 2}, {DType::i32, 4}, {DType::i64, 8},
                                            {DType::u32, 4}, {DType::boolean, 1}, {DType::c64, 8}, {DType::c128, 16}};
  for (auto [d, size] : sizes) {
    EXPECT_EQ(dtype_size(d), size) << dtype_name(d);
    EXPECT_EQ(dtype_from_name(dtype_name(d)), d);
  }
  EXPECT_EQ(dtype_from_name("bfloat16"), DType::bf16);
  EXPECT_FALSE(dtype_from_name("f128").has_value());
  EXPECT_TRUE(is_floating(DType::fp8_e5m2));
  EXPECT_FALSE(is_floating(DType::i32));
  EXPECT_TRUE(is_integral(DType::u32));
  EXPECT_FALSE(is_integral(DType::boolean));
}

TEST(TensorView, ContiguousStridesSpanAndRankLimit) {
  int64_t shape[] = {2, 3, 4};
  auto v = TensorView::contiguous(reinterpret_cast<void*>(0x1000), DType::f32, shape);
  ASSERT_TRUE(v);
  EXPECT_EQ(v->numel(), 24);
  EXPECT_EQ(v->stride[0], 12);
  EXPECT_EQ(v->stride[2], 1);
  EXPECT_TRUE(v->is_contiguous());
  EXPECT_EQ(v->span_bytes(), 24u * 4);

  int64_t neg_strides[] = {-12, 4, 1};
  auto flipped = TensorView::strided(nullptr, DType::f32, shape, neg_strides);
  ASSERT_TRUE(flipped);
  EXPECT_EQ(flipped->span(), (std::pair<int64_t, int64_t>{-12, 11}));
  EXPECT_FALSE(flipped->is_contiguous());

  int64_t rank9[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
  auto too_big = TensorView::contiguous(nullptr, DType::f32, rank9);
  ASSERT_FALSE(too_big);
  EXPECT_NE(too_big.status().message().find("rank 9"), std::string::npos);

  int64_t negative[] = {2, -1};
  EXPECT_FALSE(TensorView::contiguous(nullptr, DType::f32, negative));
  int64_t huge[] = {int64_t(1) << 40, int64_t(1) << 40};
  auto overflow = TensorView::contiguous(nullptr, DType::f32, huge);
  ASSERT_FALSE(overflow);
  EXPECT_NE(overflow.status().message().find("2^63"), std::string::npos);
  // No elements, but the outer stride would be 2^80.
  int64_t empty_huge[] = {3, int64_t(1) << 40, 0, int64_t(1) << 40};
  auto stride_overflow = TensorView::contiguous(nullptr, DType::f32, empty_huge);
  ASSERT_FALSE(stride_overflow);
  EXPECT_NE(stride_overflow.status().message().find("strides"), std::string::npos) << stride_overflow.status().to_string();
}

TEST(TensorView, Overlap) {
  float buf[64];
  int64_t shape[] = {4, 4};
  auto a = *TensorView::contiguous(buf, DType::f32, shape);
  auto b = *TensorView::contiguous(buf + 16, DType::f32, shape);
  auto c = *TensorView::contiguous(buf + 8, DType::f32, shape);
  EXPECT_FALSE(memory_overlaps(a, b));
  EXPECT_TRUE(memory_overlaps(a, c));
  EXPECT_TRUE(same_layout(a, a));
  int64_t transposed[] = {1, 4};
  auto t = *TensorView::strided(buf, DType::f32, shape, transposed);
  EXPECT_FALSE(same_layout(a, t));
  EXPECT_FALSE(has_internal_overlap(t));
  int64_t expanded[] = {0, 1};
  EXPECT_TRUE(has_internal_overlap(*TensorView::strided(buf, DType::f32, shape, expanded)));
  int64_t aliasing[] = {2, 1};  // rows overlap by two elements
  EXPECT_TRUE(has_internal_overlap(*TensorView::strided(buf, DType::f32, shape, aliasing)));
}

/// overlapping_outputs and for_each_overlap give the pairwise loops' answers,
/// in the same order, below and above the operand counts where they sort
/// (Note [Overlaps among many operands]): random 1-D views of one buffer,
/// some empty, some null, some aliasing.
TEST(TensorView, OverlapsAmongManyOperands) {
  std::vector<float> buffer(4096);
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n_out = 1 + rng() % 40, n_in = rng() % 80;
    const int64_t room = trial % 3 == 0 ? 4096 : 40 * 64;  // sparse (often disjoint) or crowded
    auto draw = [&](size_t n, bool disjoint) {
      std::vector<TensorView> v;
      int64_t at = 0;
      for (size_t k = 0; k < n; ++k) {
        const int64_t len = rng() % 5 == 0 ? 0 : 1 + rng() % 60;
        const int64_t start = disjoint ? at : int64_t(rng() % uint64_t(room - 64));
        at = start + len;
        const Shape shape{len};
        float* data = rng() % 17 == 0 ? nullptr : buffer.data() + start;
        v.push_back(*TensorView::contiguous(data, DType::f32, shape));
      }
      return v;
    };
    const std::vector<TensorView> outs = draw(n_out, trial % 2 == 0), ins = draw(n_in, false);
    std::optional<std::pair<size_t, size_t>> want_pair;
    for (size_t j = 0; j < outs.size() && !want_pair; ++j)
      for (size_t k = 0; k < j && !want_pair; ++k)
        if (memory_overlaps(outs[k], outs[j])) want_pair = std::pair{k, j};
    EXPECT_EQ(overlapping_outputs(outs), want_pair) << "trial " << trial;
    if (want_pair) continue;  // for_each_overlap takes disjoint outputs
    std::vector<std::pair<size_t, size_t>> want, got;
    for (size_t j = 0; j < outs.size(); ++j)
      for (size_t i = 0; i < ins.size(); ++i)
        if (memory_overlaps(outs[j], ins[i])) want.push_back({j, i});
    Status st = for_each_overlap(outs, ins, [&](size_t j, size_t i) {
      got.push_back({j, i});
      return Status::ok();
    });
    EXPECT_TRUE(st.is_ok());
    EXPECT_EQ(got, want) << "trial " << trial << ": " << outs.size() << " outputs, " << ins.size() << " inputs";
    if (!want.empty()) {  // a failing visit stops the walk with its status
      size_t visits = 0;
      st = for_each_overlap(outs, ins, [&](size_t, size_t) {
        ++visits;
        return Status::error(ErrorKind::invalid_problem, "stop");
      });
      EXPECT_EQ(visits, 1u);
      EXPECT_EQ(st.message(), "stop");
    }
  }
}

TEST(Broadcast, ShapesAndErrors) {
  std::vector<Shape> shapes{{3, 1, 5}, {4, 1}, {1}};
  std::vector<std::string> names{"a", "b", "c"};
  auto r = broadcast_shapes(shapes, names, "op");
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, (Shape{3, 4, 5}));
  std::vector<Shape> bad{{3, 4}, {5}};
  auto e = broadcast_shapes(bad, names, "add");
  ASSERT_FALSE(e);
  EXPECT_EQ(e.status().kind(), ErrorKind::invalid_problem);
  EXPECT_NE(e.status().message().find("'b' has size 5"), std::string::npos) << e.status().message();
}

TEST(Registry, CoversTheElementwiseInventory) {
  // ANCHORS.md section 1, "Elementwise" (fmod is torch's name for mod).
  const char* required[] = {
      "neg", "abs", "sign", "reciprocal", "square", "cube", "sqrt", "rsqrt", "cbrt", "exp", "exp2", "expm1", "log",
      "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh",
      "atanh", "floor", "ceil", "round", "trunc", "frac", "relu", "gelu", "gelu_tanh", "silu", "mish", "sigmoid",
      "softplus", "hardswish", "hardsigmoid", "hardtanh", "erf", "erfc", "lgamma", "logit", "softsign", "tanhshrink",
      "relu6", "selu", "leaky_relu", "elu", "hardshrink", "softshrink", "step", "threshold", "celu", "pow_scalar",
      "add", "sub", "mul", "div", "pow", "atan2", "hypot", "copysign", "nextafter", "fmin", "fmax", "maximum",
      "minimum", "floor_divide", "fmod", "remainder", "bitwise_and", "bitwise_or", "bitwise_xor",
      "bitwise_left_shift", "bitwise_right_shift", "bitwise_not", "logical_and", "logical_or", "logical_xor",
      "logical_not", "eq", "ne", "lt", "le", "gt", "ge", "clamp", "fma", "addcmul", "addcdiv", "lerp", "where",
      "cast", "affine", "fill", "prelu", "glu", "reglu", "swiglu", "geglu"};
  for (const char* name : required) {
    const OpInfo* op = find_op(name);
    ASSERT_NE(op, nullptr) << name;
    EXPECT_FALSE(op->dtypes.empty()) << name;
    if (!op->gradient.empty()) {
      EXPECT_NE(find_op(op->gradient), nullptr) << op->gradient;
    }
  }
  // Every differentiable float op has a backward plan.
  const char* not_differentiable[] = {"nextafter", "floor_divide", "bitwise_and", "bitwise_or", "bitwise_xor",
                                      "bitwise_left_shift", "bitwise_right_shift", "bitwise_not", "logical_and",
                                      "logical_or", "logical_xor", "logical_not", "eq", "ne", "lt", "le", "gt",
                                      "ge", "cast", "fill", "isnan", "isinf", "isfinite"};
  std::set<std::string> skip(std::begin(not_differentiable), std::end(not_differentiable));
  for (const OpInfo& op : registry()) {
    if (op.category != OpCategory::elementwise || op.direction == Direction::backward || skip.count(op.name)) continue;
    EXPECT_FALSE(op.gradient.empty()) << op.name << " has no backward";
  }
  // All four float dtypes wherever an op is a float op (not fp8 ops by definition: scaled_mm).
  for (const OpInfo& op : registry()) {
    if (op.dtypes.empty() || !is_floating(op.dtypes[0])) continue;
    if (op.dtypes[0] == DType::fp8_e4m3 || op.dtypes[0] == DType::fp8_e5m2) continue;
    for (DType d : {DType::f32, DType::f16, DType::bf16, DType::f64})
      EXPECT_NE(std::find(op.dtypes.begin(), op.dtypes.end(), d), op.dtypes.end()) << op.name << " lacks " << dtype_name(d);
  }
  // cast: every pair.
  EXPECT_EQ(find_op("cast")->dtypes.size(), size_t(kNumDTypes));
}

/// Issue 3's families (reductions, scans, softmax, norms, losses) take fp8
/// storage in every float forward but the three listed (the fused ones write
/// gradients; the running statistics stay in the four floats); the gradient
/// ops of the norm, scan and loss families refuse it and say why.
TEST(Registry, Fp8ForwardsOfTheRowFamilies) {
  const std::set<std::string> four_floats{"linear_cross_entropy_fused", "cross_entropy_fused", "instance_norm_running_stats"};
  const std::set<OpCategory> families{OpCategory::reduce, OpCategory::scan, OpCategory::softmax, OpCategory::norm,
                                      OpCategory::loss};
  int forwards = 0;
  for (const OpInfo& op : registry()) {
    if (!families.count(op.category) || op.direction != Direction::forward || op.dtypes.empty() ||
        !is_floating(op.dtypes[0]) || four_floats.count(op.name))
      continue;
    ++forwards;
    for (DType d : {DType::fp8_e4m3, DType::fp8_e5m2})
      EXPECT_NE(std::find(op.dtypes.begin(), op.dtypes.end(), d), op.dtypes.end()) << op.name << " lacks " << dtype_name(d);
  }
  EXPECT_GT(forwards, 40);
  const DType e4 = DType::fp8_e4m3, f32 = DType::f32;
  auto refused = [](const char* op, std::vector<TensorSpec> inputs) {
    auto d = infer(op, std::move(inputs));
    ASSERT_FALSE(d) << op << " took fp8";
    EXPECT_NE(d.status().message().find("no gradient"), std::string::npos) << op << ": " << d.status().message();
  };
  refused("layer_norm_backward", {{e4, {4, 8}}, {e4, {4, 8}}, {f32, {4}}, {f32, {4}}, {e4, {8}}});
  refused("rms_norm_backward", {{e4, {4, 8}}, {e4, {4, 8}}, {f32, {4}}, {e4, {8}}});
  refused("cumsum_backward", {{e4, {4, 8}}, {e4, {4, 8}}});
  refused("mse_loss_backward", {{e4, {}}, {e4, {4, 8}}, {e4, {4, 8}}});
  refused("cross_entropy_backward", {{e4, {}}, {e4, {4, 8}}, {DType::i64, {4}}, {e4, {0}}, {f32, {4}}});
  refused("ctc_loss_backward", {{e4, {}}, {e4, {6, 2, 5}}, {DType::i64, {2, 3}}, {DType::i64, {2}}, {DType::i64, {2}}});
  refused("linear_cross_entropy_backward", {{e4, {}}, {e4, {4, 8}}, {e4, {5, 8}}, {DType::i64, {4}}, {e4, {5}}, {e4, {0}}});
  refused("linear_cross_entropy_fused", {{e4, {4, 8}}, {e4, {5, 8}}, {DType::i64, {4}}, {e4, {5}}, {e4, {0}}});
  refused("group_norm_backward", {{e4, {2, 4, 3}}, {e4, {2, 4, 3}}, {f32, {2, 1}}, {f32, {2, 1}}, {e4, {4}}});
  refused("batch_norm_backward", {{e4, {2, 4, 3}}, {e4, {2, 4, 3}}, {f32, {4}}, {f32, {4}}, {f32, {4}}, {f32, {0}}, {f32, {0}}});
  // The forwards: fp8 output, f32 statistics.
  auto ln = infer("layer_norm", {{e4, {4, 8}}, {e4, {8}}, {e4, {8}}});
  ASSERT_TRUE(ln) << ln.status().to_string();
  EXPECT_EQ(ln->outputs[0].dtype, e4);
  EXPECT_EQ(ln->outputs[1].dtype, f32);
}

TEST(Select, ReasonsPreferenceAndSku) {
  OpDesc desc = *infer("gelu", {{DType::bf16, {8, 16}}});
  EXPECT_EQ(desc.outputs.size(), 1u);
  EXPECT_EQ(desc.outputs[0].shape, (Shape{8, 16}));
  auto host = select(Stream::host(), desc);
  ASSERT_TRUE(host) << host.status().to_string();
  KernelSku sku = (*host)->sku();
  EXPECT_EQ(sku.backend, Backend::host_reference);
  EXPECT_EQ(sku.category, OpCategory::elementwise);
  EXPECT_EQ(std::string(sku.op), "gelu");
  EXPECT_EQ(sku.element, DType::bf16);
  EXPECT_EQ((*host)->precision_guarantee().math, MathPrecision::f64);
  EXPECT_TRUE((*host)->precision_guarantee().deterministic);
  EXPECT_EQ((*host)->workspace_size(), 0u);

  PlanPreference cuda_only;
  cuda_only.backend = Backend::bespoke_cuda;
  auto none = select(Stream::host(), desc, cuda_only);
  ASSERT_FALSE(none);
  EXPECT_EQ(none.status().kind(), ErrorKind::unsupported);
  EXPECT_NE(none.status().message().find("host stream"), std::string::npos) << none.status().message();
  EXPECT_NE(none.status().message().find("preference asks for cuda"), std::string::npos);

  PlanPreference no_host;
  no_host.allow_host_fallback = false;
  EXPECT_FALSE(select(Stream::host(), desc, no_host));

  PlanPreference skip_one;
  skip_one.skip_candidates = 1;
  EXPECT_FALSE(select(Stream::host(), desc, skip_one));

  // cast records its target dtype as the aux element; compare ops record bool.
  auto cast = select(Stream::host(), *infer("cast", {{DType::f32, {4}}}, Attrs{{"dtype", double(int(DType::bf16))}}));
  ASSERT_TRUE(cast);
  EXPECT_EQ((*cast)->sku().aux_element, DType::bf16);
  EXPECT_EQ((*cast)->precision_guarantee().math, MathPrecision::exact);
}

TEST(Select, UnknownOpAndAttribute) {
  auto unknown = select(Stream::host(), OpDesc{"no_such_op", {}, {}, {}});
  ASSERT_FALSE(unknown);
  EXPECT_NE(unknown.status().message().find("no_such_op"), std::string::npos);
  OpDesc desc = *infer("relu", {{DType::f32, {4}}});
  desc.attrs.set("alpha", 2);
  auto bad_attr = select(Stream::host(), desc);
  ASSERT_FALSE(bad_attr);
  EXPECT_NE(bad_attr.status().message().find("unknown attribute 'alpha'"), std::string::npos);
}

TEST(Select, VerboseReasonsGoToStderr) {
  setenv("BARACUDA_VERBOSE_SELECT", "1", 1);
  testing::internal::CaptureStderr();
  auto plan = select(Stream::host(), *infer("exp", {{DType::f32, {4}}}));
  std::string err = testing::internal::GetCapturedStderr();
  unsetenv("BARACUDA_VERBOSE_SELECT");
  ASSERT_TRUE(plan);
  EXPECT_NE(err.find("cuda rejected"), std::string::npos) << err;
  EXPECT_NE(err.find("chose"), std::string::npos) << err;
}
