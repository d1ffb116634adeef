// Loss family: registry entries, shape rules and plans.
//  - pointwise losses: the per-element loss (elementwise launcher), written
//    to the output (reduction none) or to f32/f64 scratch that the reduction
//    family sums (mean, sum, batchmean); gradients are elementwise;
//  - class losses (cross_entropy, nll_loss): row kernels over the class dim;
//  - row losses (cosine_embedding, triplet_margin, multi_margin,
//    multilabel_margin): one loss per row of the last dim (row_losses.hpp),
//    then the mean or sum of the rows in a fixed order.
// Attribute `reduction` follows torch's codes: 0 none, 1 mean, 2 sum (3 batchmean).
#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "elementwise/prepare.hpp"
#include "loss/register.hpp"
#include "reduce/engine.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace loss {

PointwiseTable& cuda_pointwise() {
  static PointwiseTable table;
  return table;
}
ClassTable& cuda_class_losses() {
  static ClassTable table;
  return table;
}
RowTable& cuda_row_losses() {
  static RowTable table;
  return table;
}

namespace {

constexpr double kBatchmean = 3;

Status check_reduction(std::string_view op, double reduction, bool batchmean_ok) {
  if (reduction == 0 || reduction == 1 || reduction == 2 || (batchmean_ok && reduction == kBatchmean)) return Status::ok();
  return invalid(op, ": attribute 'reduction' must be 0 (none), 1 (mean) or 2 (sum)",
                 batchmean_ok ? " or 3 (batchmean)" : "", ", got ", reduction);
}

// ================================================================ pointwise losses

/// A registered loss op (pointwise or row) and its operands.
template <class Meta>
struct LossOpDef {
  std::string name;
  const Meta* meta;
  bool backward;
  std::vector<std::string> inputs, outputs;  ///< of this op (backward: grad_output first)
};

/// Defs of one kind, kept at stable addresses for the registry's lambdas.
template <class Meta>
std::vector<LossOpDef<Meta>>& loss_defs() {
  static std::vector<LossOpDef<Meta>> all;
  return all;
}

using PointwiseDef = LossOpDef<LossMeta>;
std::vector<PointwiseDef>& pointwise_defs() { return loss_defs<LossMeta>(); }

/// The loss ops' dtypes (core/family.hpp's check_float_storage).
std::vector<DType> loss_dtypes(bool gradient) {
  return gradient ? dtypes_of<FloatTypes>() : dtypes_of<Concat<FloatTypes, Fp8Types>::type>();
}

/// The forward descriptor (inputs = the loss's operands): checks and the output.
Result<OpDesc> infer_pointwise_forward(const PointwiseDef& def, const std::vector<std::string>& names, OpDesc d) {
  const std::string& op = def.name;
  BARACUDA_TRY(check_inputs(op, d, names, 0));
  const TensorSpec& x = d.inputs[0];
  BARACUDA_TRY(check_float_storage(op, x.dtype, def.backward));
  for (size_t i = 1; i < d.inputs.size(); ++i) {
    if (d.inputs[i].dtype != x.dtype)
      return invalid(op, ": '", names[i], "' dtype ", dtype_name(d.inputs[i].dtype), " != '", names[0], "' dtype ",
                     dtype_name(x.dtype));
    const Shape pair[2] = {x.shape, d.inputs[i].shape};
    const std::string labels[2] = {names[0], names[i]};
    auto b = broadcast_shapes(pair, labels, op);
    if (!b || *b != x.shape)
      return invalid(op, ": '", names[i], "' shape ", shape_str(d.inputs[i].shape), " does not broadcast to '", names[0],
                     "' shape ", shape_str(x.shape));
  }
  const double reduction = d.attrs.get("reduction", 1);
  BARACUDA_TRY(check_reduction(op, reduction, true));
  if ((def.meta->class_mean || reduction == kBatchmean) && x.shape.empty())
    return invalid(op, ": '", names[0], "' must have rank >= 1 (classes or batch along a dim), got a scalar");
  Shape out;
  if (reduction == 0) out = def.meta->class_mean ? Shape(x.shape.begin(), x.shape.end() - 1) : x.shape;
  BARACUDA_TRY(set_outputs(op, d, {TensorSpec{x.dtype, out}}, std::vector<std::string>{"out"}));
  return d;
}

/// A loss op's descriptor: the forward's own rule, or for the backward the
/// forward's rule on the operands after grad_output, grad_output shaped like
/// the loss, and one gradient per differentiable input shaped like it.
template <class Meta, class Forward>
Result<OpDesc> infer_loss_op(const LossOpDef<Meta>& def, const OpDesc& partial, Forward forward) {
  if (!def.backward) return forward(def, def.inputs, partial);
  BARACUDA_TRY(check_inputs(def.name, partial, def.inputs, 1));
  const std::vector<std::string> fwd_names(def.inputs.begin() + 1, def.inputs.end());
  OpDesc f{def.meta->name, std::vector<TensorSpec>(partial.inputs.begin() + 1, partial.inputs.end()), {}, partial.attrs};
  auto fwd = forward(def, fwd_names, f);
  if (!fwd) return fwd.status();
  const TensorSpec& want = fwd->outputs[0];
  if (partial.inputs[0].dtype != want.dtype || partial.inputs[0].shape != want.shape)
    return invalid(def.name, ": 'grad_output' must be ", dtype_name(want.dtype), shape_str(want.shape),
                   " (the loss's shape), got ", dtype_name(partial.inputs[0].dtype), shape_str(partial.inputs[0].shape));
  OpDesc d = partial;
  std::vector<TensorSpec> outs(partial.inputs.begin() + 1, partial.inputs.begin() + 1 + def.meta->grads);
  BARACUDA_TRY(set_outputs(def.name, d, outs, def.outputs));
  return d;
}

Result<OpDesc> infer_pointwise(const PointwiseDef& def, const OpDesc& partial) {
  return infer_loss_op(def, partial, [](const PointwiseDef& d, const std::vector<std::string>& names, OpDesc desc) {
    return infer_pointwise_forward(d, names, std::move(desc));
  });
}

/// The factor each per-element value is scaled by before the sum.
double pointwise_scale(const LossMeta& meta, const Shape& x, double reduction) {
  int64_t numel = 1;
  for (int64_t s : x) numel *= s;
  const double base = meta.class_mean ? 1.0 / double(std::max<int64_t>(x.back(), 1)) : 1.0;
  if (reduction == 1) return numel > 0 ? 1.0 / double(numel) : 0.0;
  if (reduction == kBatchmean) return x[0] > 0 ? base / double(x[0]) : 0.0;
  return base;
}

/// Bits of the axes the sum runs over (none: the classes of a class-mean loss).
uint32_t summed_mask(const LossMeta& meta, int rank, double reduction) {
  if (reduction == 0) return meta.class_mean ? 1u << (rank - 1) : 0u;
  return rank == 0 ? 0u : uint32_t((1u << rank) - 1);
}

class PointwisePlan final : public FamilyPlan {
 public:
  PointwisePlan(const PointwiseDef& def, const OpInfo& info, OpDesc desc, Backend backend, ew::LaunchFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), backend_(backend), fn_(fn) {
    const TensorSpec& x = desc_.inputs[def.backward ? 1 : 0];
    sku_ = bespoke_sku(OpCategory::loss, info.name.c_str(), x.dtype, backend);
    reduction_ = desc_.attrs.get("reduction", 1);
    for (int i = 0; i < 3; ++i)
      if (def.meta->attrs[i].name) params_.v[i] = desc_.attrs.get(def.meta->attrs[i].name, def.meta->attrs[i].value);
    params_.v[3] = pointwise_scale(*def.meta, x.shape, reduction_);
    mask_ = summed_mask(*def.meta, static_cast<int>(x.shape.size()), reduction_);
    scratch_dtype_ = math_dtype(x.dtype, backend);
  }

  /// The forward's sum step (when it reduces), chosen once the scratch dtype is known.
  Status prepare(PointwiseTable& table) {
    const TensorSpec& x = desc_.inputs[0];
    if (def_.backward || mask_ == 0) return Status::ok();
    scratch_fn_ = table.find(launch_key(def_.meta->name, x.dtype, scratch_dtype_));
    if (!scratch_fn_) return unsupported("no ", backend_name(backend_), " scratch kernel for ", def_.name);
    auto step = red::make_sum_step(backend_, scratch_dtype_, x.dtype, x.shape, mask_);
    if (!step) return step.status();
    sum_ = *step;
    scratch_bytes_ = (size_t(std::max<int64_t>(x.numel(), 1)) * dtype_size(scratch_dtype_) + 255) / 256 * 256;
    workspace_ = scratch_bytes_ + sum_.workspace;
    return Status::ok();
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    CUstream_st* s = stream.cuda_stream();
    const Shape& shape = desc_.inputs[def_.backward ? 1 : 0].shape;
    if (def_.backward) {
      int64_t n = 1;
      for (int64_t v : shape) n *= v;
      if (n == 0) return Status::ok();
      std::vector<TensorView> in(args.inputs.begin(), args.inputs.end());
      if (def_.meta->class_mean && reduction_ == 0) {  // grad_output [..] -> [.., classes] with stride 0
        TensorView& g = in[0];
        g.shape[g.rank] = shape.back();
        g.stride[g.rank] = 0;
        ++g.rank;
      }
      const ew::LaunchList list = ew::plan_launches(shape, args.outputs, in);
      for (int i = 0; i < list.count; ++i) BARACUDA_TRY(fn_(list.launches[i], params_, s).with_context(def_.name));
      return Status::ok();
    }
    if (mask_ == 0) {
      int64_t n = 1;
      for (int64_t v : shape) n *= v;
      if (n == 0) return Status::ok();
      const ew::LaunchList list = ew::plan_launches(shape, args.outputs, args.inputs);
      return fn_(list.launches[0], params_, s).with_context(def_.name);
    }
    auto scratch = TensorView::contiguous(workspace.data, scratch_dtype_, shape);
    if (!scratch) return scratch.status();
    if (scratch->numel() > 0) {
      const ew::LaunchList list = ew::plan_launches(shape, std::span(&*scratch, 1), args.inputs);
      BARACUDA_TRY(scratch_fn_(list.launches[0], params_, s).with_context(def_.name));
    }
    void* sum_workspace = static_cast<char*>(workspace.data) + scratch_bytes_;
    BARACUDA_TRY(red::run_sum_step(sum_, *scratch, args.outputs[0], mask_, sum_workspace, s).with_context(def_.name));
    if (scratch->numel() == 0 && (reduction_ == 1 || reduction_ == kBatchmean))  // a mean of nothing: 0 / 0, as torch
      BARACUDA_TRY(fill_bytes(args.outputs[0], 0xFF, stream).with_context(def_.name));
    return Status::ok();
  }

 private:
  const PointwiseDef& def_;
  Backend backend_;
  ew::LaunchFn fn_, scratch_fn_ = nullptr;
  ew::Params params_;
  double reduction_ = 1;
  uint32_t mask_ = 0;
  DType scratch_dtype_ = DType::f32;
  red::SumStep sum_;
  size_t scratch_bytes_ = 0;
};

std::vector<Attrs> reduction_samples(bool batchmean) {
  std::vector<Attrs> s{Attrs{{"reduction", 0}}, Attrs{{"reduction", 1}}, Attrs{{"reduction", 2}}};
  if (batchmean) s.push_back(Attrs{{"reduction", kBatchmean}});
  return s;
}

/// A loss op or its backward: its name and operands (backward: grad_output
/// first, one grad_<input> output per differentiable input).
template <class Def, class Meta>
Def loss_def(const Meta& meta, bool backward) {
  const std::vector<std::string> names(meta.input_names, meta.input_names + meta.inputs);
  Def def{backward ? cat(meta.name, "_backward") : std::string(meta.name), &meta, backward, names, {"out"}};
  if (backward) {
    def.inputs.insert(def.inputs.begin(), "grad_output");
    def.outputs.clear();
    for (int k = 0; k < meta.grads; ++k) def.outputs.push_back(cat("grad_", names[k]));
  }
  return def;
}

/// The registry fields every pointwise and row loss shares: names, gradient
/// link, float dtypes, both backends, the reduction attribute, the domains.
template <class Def, class Meta>
OpInfo loss_info(const Def& d, const Meta& meta, const char* family, const char* reduction_doc) {
  OpInfo info;
  info.name = d.name;
  info.category = OpCategory::loss;
  info.family = d.backward ? cat(family, "_backward") : std::string(family);
  info.direction = d.backward ? Direction::backward : Direction::forward;
  info.gradient = d.backward ? std::string(meta.name) : cat(meta.name, "_backward");
  info.input_names = d.inputs;
  info.output_names = d.outputs;
  info.dtypes = loss_dtypes(d.backward);
  info.attrs = {{"reduction", 1, reduction_doc}};
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = d.backward ? cat("gradients of ", meta.name, " with respect to ", d.outputs.size(), " operand(s)") : meta.doc;
  for (int i = 0; i < meta.inputs; ++i) info.domains.push_back(meta.domains[i]);
  if (d.backward) info.domains.insert(info.domains.begin(), Domain{-1, 1});
  info.tolerance_scale = 4;
  return info;
}

template <class L>
void add_pointwise(std::vector<OpInfo>& ops) {
  const LossMeta& meta = L::meta;
  for (bool backward : {false, true}) {
    pointwise_defs().push_back(loss_def<PointwiseDef>(meta, backward));
    const PointwiseDef& d = pointwise_defs().back();
    OpInfo info = loss_info(d, meta, "pointwise_loss", "0 none, 1 mean, 2 sum, 3 batchmean (sum / size of dim 0)");
    for (const auto& a : meta.attrs)
      if (a.name) info.attrs.push_back({a.name, a.value, ""});
    info.input_dtypes = [n = d.inputs.size()](DType primary) { return std::vector<DType>(n, primary); };
    info.sample_attrs = reduction_samples(std::string_view(meta.name) == "kl_div");
    if (std::string_view(meta.name) == "kl_div") info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"log_target", 1}});
    if (std::string_view(meta.name) == "poisson_nll_loss")
      info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"log_input", 0}, {"full", 1}});
    if (std::string_view(meta.name) == "huber_loss") info.sample_attrs.push_back(Attrs{{"reduction", 2}, {"delta", 0.5}});
    if (std::string_view(meta.name) == "smooth_l1_loss") info.sample_attrs.push_back(Attrs{{"reduction", 2}, {"beta", 0.3}});
    if (std::string_view(meta.name) == "gaussian_nll_loss") info.sample_attrs.push_back(Attrs{{"reduction", 2}, {"full", 1}});
    info.sample_shapes = [&d, backward](DType primary, const Shape& shape, const Attrs& attrs) -> std::optional<SampleShapes> {
      if ((d.meta->class_mean || attrs.get("reduction", 1) == kBatchmean) && shape.empty()) return std::nullopt;
      std::vector<Shape> in(d.meta->inputs, shape);
      if (!backward) return SampleShapes{in, {}};
      OpDesc f{d.meta->name, {}, {}, attrs};
      for (const Shape& s : in) f.inputs.push_back(TensorSpec{primary, s});
      auto fwd = infer_pointwise_forward(d, std::vector<std::string>(d.inputs.begin() + 1, d.inputs.end()), f);
      if (!fwd) return std::nullopt;
      in.insert(in.begin(), fwd->outputs[0].shape);
      return SampleShapes{in, {}};
    };
    const size_t index = ops.size();
    info.infer = [&d](const OpDesc& partial) { return infer_pointwise(d, partial); };
    info.make_plan = [&d, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      auto full = infer_pointwise(d, desc);
      if (!full) return full.status();
      const DType t = full->inputs[d.backward ? 1 : 0].dtype;
      PointwiseTable& table = backend == Backend::host_reference ? host_pointwise() : cuda_pointwise();
      ew::LaunchFn fn = table.find(launch_key(d.name, t));
      if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", d.name, " ", dtype_name(t));
      auto plan = std::make_unique<PointwisePlan>(d, registry()[index], std::move(*full), backend, fn);
      BARACUDA_TRY(plan->prepare(table));
      return PlanPtr(std::move(plan));
    };
    ops.push_back(std::move(info));
  }
}

// ================================================================ class losses

struct ClassDef {
  std::string name;
  bool logits;  ///< cross_entropy (else nll_loss)
  Mode mode;
  std::vector<std::string> inputs, outputs;
};

std::vector<ClassDef>& class_defs() {
  static std::vector<ClassDef> all;
  return all;
}


/// The class dim: 1, or 0 for an input of rank 1 (a single sample).
int class_dim(const Shape& x) { return x.size() == 1 ? 0 : 1; }

Shape without_class_dim(const Shape& x) {
  Shape s = x;
  s.erase(s.begin() + class_dim(x));
  return s;
}

/// Index of an operand in this op's inputs, or -1.
int input_index(const ClassDef& def, std::string_view name) {
  for (size_t i = 0; i < def.inputs.size(); ++i)
    if (def.inputs[i] == name) return static_cast<int>(i);
  return -1;
}

Result<OpDesc> infer_class(const ClassDef& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  const int xi = input_index(def, "input"), ti = input_index(def, "target"), wi = input_index(def, "weight");
  BARACUDA_TRY(check_inputs(op, d, def.inputs, static_cast<size_t>(xi)));
  const TensorSpec& x = d.inputs[xi];
  BARACUDA_TRY(check_float_storage(op, x.dtype, def.mode != Mode::forward));
  if (x.shape.empty()) return invalid(op, ": 'input' must have a class dim (rank >= 1), got a scalar");
  const int64_t classes = x.shape[class_dim(x.shape)];
  if (classes < 1) return invalid(op, ": 'input' ", shape_str(x.shape), " has no classes (dim ", class_dim(x.shape), " is 0)");
  const Shape outer = without_class_dim(x.shape);
  const TensorSpec& t = d.inputs[ti];
  const bool probs = is_floating(t.dtype);
  if (probs) {
    if (!def.logits) return invalid(op, ": 'target' must hold class indices (i64 or i32), got ", dtype_name(t.dtype));
    if (t.dtype != x.dtype || t.shape != x.shape)
      return invalid(op, ": a probability 'target' must be ", dtype_name(x.dtype), shape_str(x.shape), " like 'input', got ",
                     dtype_name(t.dtype), shape_str(t.shape));
  } else {
    if (t.dtype != DType::i64 && t.dtype != DType::i32)
      return invalid(op, ": 'target' must hold class indices (i64 or i32) or probabilities, got ", dtype_name(t.dtype));
    if (t.shape != outer)
      return invalid(op, ": 'target' shape ", shape_str(t.shape), " != ", shape_str(outer),
                     " ('input' without its class dim ", class_dim(x.shape), ")");
  }
  const TensorSpec& w = d.inputs[wi];
  if (w.dtype != x.dtype || w.shape.size() != 1 || (w.shape[0] != classes && w.shape[0] != 0))
    return invalid(op, ": 'weight' must be ", dtype_name(x.dtype), "[", classes, "] (one per class) or ",
                   dtype_name(x.dtype), "[0] (no class weights), got ", dtype_name(w.dtype), shape_str(w.shape));
  const double reduction = d.attrs.get("reduction", 1);
  BARACUDA_TRY(check_reduction(op, reduction, false));
  const double smoothing = d.attrs.get("label_smoothing", 0);
  if (!(smoothing >= 0 && smoothing <= 1)) return invalid(op, ": 'label_smoothing' must be in [0, 1], got ", smoothing);
  const double ignore = d.attrs.get("ignore_index", -100);
  if (ignore != std::floor(ignore)) return invalid(op, ": 'ignore_index' must be an integer, got ", ignore);
  const TensorSpec loss{x.dtype, reduction == 0 ? outer : Shape{}};
  const int gi = input_index(def, "grad_output"), li = input_index(def, "lse");
  if (gi >= 0 && (d.inputs[gi].dtype != loss.dtype || d.inputs[gi].shape != loss.shape))
    return invalid(op, ": 'grad_output' must be ", dtype_name(loss.dtype), shape_str(loss.shape), " (the loss's shape), got ",
                   dtype_name(d.inputs[gi].dtype), shape_str(d.inputs[gi].shape));
  const TensorSpec lse{stat_dtype(x.dtype), outer};
  if (li >= 0 && (d.inputs[li].dtype != lse.dtype || d.inputs[li].shape != lse.shape))
    return invalid(op, ": 'lse' must be ", dtype_name(lse.dtype), shape_str(lse.shape), " (saved by the forward), got ",
                   dtype_name(d.inputs[li].dtype), shape_str(d.inputs[li].shape));
  std::vector<TensorSpec> outs;
  for (const std::string& o : def.outputs) outs.push_back(o == "out" ? loss : o == "lse" ? lse : x);
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

class ClassPlan final : public FamilyPlan {
 public:
  ClassPlan(const ClassDef& def, const OpInfo& info, OpDesc desc, Backend backend, ClassFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const TensorSpec& x = desc_.inputs[input_index(def, "input")];
    sku_ = bespoke_sku(OpCategory::loss, info.name.c_str(), x.dtype, backend);
    sku_.aux_element = desc_.inputs[input_index(def, "target")].dtype;
    params_.mode = def.mode;
    params_.reduction = static_cast<Reduction>(int(desc_.attrs.get("reduction", 1)));
    params_.weighted = desc_.inputs[input_index(def, "weight")].shape[0] != 0;
    params_.ignore_index = static_cast<int64_t>(desc_.attrs.get("ignore_index", -100));
    params_.smoothing = def.logits ? desc_.attrs.get("label_smoothing", 0) : 0;
    dim_ = class_dim(x.shape);
    moved_ = rows::move_axis_last(x.shape, dim_);
    int64_t rows = 1;
    for (size_t a = 0; a < x.shape.size(); ++a)
      if (int(a) != dim_) rows *= x.shape[a];
    if (backend != Backend::host_reference)
      workspace_ = size_t(scratch_elements(rows)) * dtype_size(stat_dtype(x.dtype));
    // Where each operand goes, decided once (run only follows the list).
    const bool none = params_.reduction == Reduction::none;
    for (const std::string& n : def.inputs) {
      const bool indices = n == "target" && !is_floating(desc_.inputs[input_index(def, "target")].dtype);
      inputs_.push_back(n == "input"                    ? Binding{kInput, How::full}
                        : n == "target"                 ? Binding{kTarget, indices ? How::per_row : How::full}
                        : n == "lse"                    ? Binding{kLse, How::per_row}
                        : n == "grad_output" && none    ? Binding{kGradOutput, How::per_row}
                        : n == "grad_output"            ? Binding{kGradOutput, How::broadcast}
                        : n == "weight" && params_.weighted ? Binding{kWeight, How::per_col}
                                                        : Binding{kSlots, How::unused});
    }
    for (const std::string& n : def.outputs)
      outputs_.push_back(n == "out" && none ? Binding{kOut, How::per_row}
                         : n == "out"      ? Binding{kSlots, How::scalar}
                         : n == "lse"      ? Binding{kLse, How::per_row}
                                           : Binding{kGradInput, How::full});
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    std::array<TensorView, kSlots> views;
    std::array<rows::Role, kSlots> roles;
    const TensorView x = rows::move_axis_last(args.inputs[input_index(def_, "input")], dim_);
    views.fill(x);  // unused slots: a harmless view
    roles.fill(rows::Role::full);
    ClassLaunch cl;
    auto bind = [&](const Binding& b, const TensorView& v) {
      switch (b.how) {
        case How::full: views[b.slot] = rows::move_axis_last(v, dim_); break;
        case How::per_row: views[b.slot] = v, roles[b.slot] = rows::Role::per_row; break;
        case How::per_col: views[b.slot] = v, roles[b.slot] = rows::Role::per_col; break;
        case How::broadcast:  // a scalar over every element
          views[b.slot] = x;
          views[b.slot].data = v.data;
          views[b.slot].dtype = v.dtype;
          for (int a = 0; a < x.rank; ++a) views[b.slot].stride[a] = 0;
          break;
        case How::scalar: cl.scalar_out = v.data; break;
        case How::unused: break;
      }
    };
    for (size_t i = 0; i < inputs_.size(); ++i) bind(inputs_[i], args.inputs[i]);
    for (size_t j = 0; j < outputs_.size(); ++j) bind(outputs_[j], args.outputs[j]);
    cl.rows = rows::make_rows(moved_, 1, std::span(views.data(), kSlots), std::span(roles.data(), kSlots));
    cl.scratch = workspace.data;
    return fn_(cl, params_, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  enum class How : uint8_t { full, per_row, per_col, broadcast, scalar, unused };
  struct Binding {
    Slot slot;
    How how;
  };
  const ClassDef& def_;
  ClassFn fn_;
  ClassParams params_;
  int dim_ = 0;
  Shape moved_;
  std::vector<Binding> inputs_, outputs_;
};

void add_class_op(std::vector<OpInfo>& ops, ClassDef def_in, const char* doc) {
  class_defs().push_back(std::move(def_in));
  const ClassDef& def = class_defs().back();
  const std::string base = def.logits ? "cross_entropy" : "nll_loss";
  OpInfo info;
  info.name = def.name;
  info.category = OpCategory::loss;
  info.family = "class_loss";
  info.direction = def.mode == Mode::backward ? Direction::backward : Direction::forward;
  info.gradient = def.mode == Mode::forward ? base + "_backward" : def.mode == Mode::backward ? base : "";
  info.input_names = def.inputs;
  info.output_names = def.outputs;
  info.dtypes = loss_dtypes(def.mode != Mode::forward);
  info.attrs = {{"reduction", 1, "0 none, 1 mean (over the target weights), 2 sum"},
                {"ignore_index", -100, "rows whose target is this index count for nothing"}};
  if (def.logits) info.attrs.push_back({"label_smoothing", 0, "mix the target with the uniform distribution"});
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = doc;
  info.input_dtypes = [&def](DType primary) {
    std::vector<DType> d;
    for (const std::string& n : def.inputs) d.push_back(n == "target" ? DType::i64 : n == "lse" ? stat_dtype(primary) : primary);
    return d;
  };
  for (const std::string& n : def.inputs)
    info.domains.push_back(n == "target" ? Domain{-1, 1, false, false, true} : n == "weight" ? Domain{0.5, 2}
                           : n == "lse" ? Domain{3, 4} : n == "grad_output" ? Domain{-1, 1} : Domain{-4, 4});
  info.tolerance_scale = 4;
  // Targets are drawn from {-1, 0, 1}: -1 is the ignored index.
  for (double r : {0.0, 1.0, 2.0}) info.sample_attrs.push_back(Attrs{{"reduction", r}, {"ignore_index", -1}});
  if (def.logits) info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"ignore_index", -1}, {"label_smoothing", 0.2}});
  if (def.logits) info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"ignore_index", -1}, {"label_smoothing", 0.1}});
  info.sample_shapes = [&def](DType, const Shape& shape, const Attrs& attrs) -> std::optional<SampleShapes> {
    if (shape.empty() || shape[class_dim(shape)] < 2) return std::nullopt;
    const bool none = attrs.get("reduction", 1) == 0;
    // Without class weights (weight [0]) for sum and for smoothing 0.2, with them otherwise.
    const bool weighted = attrs.get("reduction", 1) != 2 && attrs.get("label_smoothing", 0) != 0.2;
    const Shape outer = without_class_dim(shape);
    SampleShapes s;
    for (const std::string& n : def.inputs) {
      const Shape sh = n == "target" || n == "lse" ? outer : n == "weight" ? Shape{weighted ? shape[class_dim(shape)] : 0}
                       : n == "grad_output" ? (none ? outer : Shape{}) : shape;
      s.inputs.push_back(sh);
    }
    return s;
  };
  const size_t index = ops.size();
  info.infer = [&def](const OpDesc& partial) { return infer_class(def, partial); };
  info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
    auto full = infer_class(def, desc);
    if (!full) return full.status();
    const DType t = full->inputs[input_index(def, "input")].dtype, target = full->inputs[input_index(def, "target")].dtype;
    const ClassTable& table = backend == Backend::host_reference ? host_class_losses() : cuda_class_losses();
    ClassFn fn = table.find(launch_key(def.logits ? "cross_entropy" : "nll_loss", t, target));
    if (!fn)
      return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(t), " with ",
                         dtype_name(target), " targets");
    return PlanPtr(std::make_unique<ClassPlan>(def, registry()[index], std::move(*full), backend, fn));
  };
  ops.push_back(std::move(info));
}


// ================================================================ row losses

using RowDef = LossOpDef<RowLossMeta>;
std::vector<RowDef>& row_defs() { return loss_defs<RowLossMeta>(); }

bool index_target(const RowLossMeta& m) {
  return m.target == TargetKind::index_per_row || m.target == TargetKind::index_list;
}

Status check_row_attrs(const std::string& op, const RowLossMeta& m, const Attrs& attrs) {
  const std::string_view name = m.name;
  const double p = attrs.get("p", name == "multi_margin_loss" ? 1 : 2);
  if (name == "multi_margin_loss" && p != 1 && p != 2) return invalid(op, ": attribute 'p' must be 1 or 2, got ", p);
  if (name == "triplet_margin_loss" && !(p > 0 && std::isfinite(p)))
    return invalid(op, ": attribute 'p' (the norm) must be finite and > 0, got ", p);
  return Status::ok();
}

/// The forward descriptor (inputs = the loss's operands): checks and the output.
Result<OpDesc> infer_row_forward(const RowDef& def, const std::vector<std::string>& names, OpDesc d) {
  const std::string& op = def.name;
  const RowLossMeta& m = *def.meta;
  BARACUDA_TRY(check_inputs(op, d, names, 0));
  const TensorSpec& x = d.inputs[0];
  BARACUDA_TRY(check_float_storage(op, x.dtype, def.backward));
  const size_t rank = x.shape.size();
  const char* dim = index_target(m) ? "C" : "D";
  if (rank == 0 || (m.max_rank != 0 && rank > size_t(m.max_rank)))
    return invalid(op, ": '", names[0], "' must be ",
                   m.max_rank != 0 ? cat("[N, ", dim, "] or [", dim, "]") : std::string("of rank >= 1 (rows along the last dim)"),
                   ", got ", shape_str(x.shape));
  const Shape outer(x.shape.begin(), x.shape.end() - 1);
  for (int k = 1; k < m.grads; ++k)
    if (d.inputs[k].dtype != x.dtype || d.inputs[k].shape != x.shape)
      return invalid(op, ": '", names[k], "' must be ", dtype_name(x.dtype), shape_str(x.shape), " like '", names[0],
                     "', got ", dtype_name(d.inputs[k].dtype), shape_str(d.inputs[k].shape));
  if (m.target != TargetKind::none) {
    const TensorSpec& t = d.inputs[m.grads];
    const bool indices = t.dtype == DType::i64 || t.dtype == DType::i32;
    if (!indices && !(m.target == TargetKind::sign && t.dtype == x.dtype))
      return invalid(op, ": 'target' must be i64 or i32", m.target == TargetKind::sign ? cat(" or ", dtype_name(x.dtype)) : "",
                     ", got ", dtype_name(t.dtype));
    const Shape want = m.target == TargetKind::index_list ? x.shape : outer;
    if (t.shape != want)
      return invalid(op, ": 'target' shape ", shape_str(t.shape), " != ", shape_str(want), " ('", names[0], "' shape",
                     m.target == TargetKind::index_list ? ")" : " without its last dim)");
  }
  if (index_target(m) && x.shape.back() == 0) return invalid(op, ": '", names[0], "' ", shape_str(x.shape), " has no classes");
  if (m.inputs > m.grads + 1) {
    const TensorSpec& w = d.inputs[m.grads + 1];
    const int64_t classes = x.shape.back();
    if (w.dtype != x.dtype || w.shape.size() != 1 || (w.shape[0] != classes && w.shape[0] != 0))
      return invalid(op, ": 'weight' must be ", dtype_name(x.dtype), "[", classes, "] (one per class) or ", dtype_name(x.dtype),
                     "[0] (no class weights), got ", dtype_name(w.dtype), shape_str(w.shape));
  }
  const double reduction = d.attrs.get("reduction", 1);
  BARACUDA_TRY(check_reduction(op, reduction, false));
  BARACUDA_TRY(check_row_attrs(op, m, d.attrs));
  BARACUDA_TRY(set_outputs(op, d, {TensorSpec{x.dtype, reduction == 0 ? outer : Shape{}}}, std::vector<std::string>{"out"}));
  return d;
}

Result<OpDesc> infer_row(const RowDef& def, const OpDesc& partial) {
  return infer_loss_op(def, partial, [](const RowDef& d, const std::vector<std::string>& names, const OpDesc& desc) {
    return infer_row_forward(d, names, desc);
  });
}

class RowPlan final : public FamilyPlan {
 public:
  RowPlan(const RowDef& def, const OpInfo& info, OpDesc desc, Backend backend, RowFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const RowLossMeta& m = *def.meta;
    const int in = def.backward ? 1 : 0;
    const TensorSpec& x = desc_.inputs[in];
    sku_ = bespoke_sku(OpCategory::loss, info.name.c_str(), x.dtype, backend);
    if (m.target != TargetKind::none) sku_.aux_element = desc_.inputs[in + m.grads].dtype;
    for (int i = 0; i < 4; ++i)
      if (m.attrs[i].name) params_.v[i] = desc_.attrs.get(m.attrs[i].name, m.attrs[i].value);
    params_.reduction = static_cast<int>(desc_.attrs.get("reduction", 1));
    params_.backward = def.backward;
    params_.weighted = m.inputs > m.grads + 1 && desc_.inputs[in + m.grads + 1].shape[0] != 0;
    shape_ = x.shape;
    int64_t rows = 1;
    for (size_t a = 0; a + 1 < x.shape.size(); ++a) rows *= x.shape[a];
    if (backend != Backend::host_reference) {
      if (!def.backward && params_.reduction != 0) workspace_ = (size_t(rows) * dtype_size(stat_dtype(x.dtype)) + 255) / 256 * 256;
      if (m.target == TargetKind::index_list) workspace_ += size_t(rows) * size_t(x.shape.back());
    }
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const RowLossMeta& m = *def_.meta;
    const int in = def_.backward ? 1 : 0;
    const bool none = params_.reduction == 0;
    std::array<TensorView, rows::kMaxOperands> views;
    std::array<rows::Role, rows::kMaxOperands> roles;
    views.fill(args.inputs[in]);  // unused slots: a harmless view
    roles.fill(rows::Role::full);
    RowLossLaunch rl;
    int slot = 0;
    auto bind = [&](const TensorView& v, rows::Role role) { views[slot] = v, roles[slot] = role, ++slot; };
    for (size_t i = 0; i < args.inputs.size(); ++i) {
      const int k = static_cast<int>(i) - in;  // the operand of the loss
      const TensorView& v = args.inputs[i];
      if (k < 0 && !none) rl.scalar_grad = v.data, ++slot;
      else if (k < 0) bind(v, rows::Role::per_row);
      else if (k < m.grads || (k == m.grads && m.target == TargetKind::index_list)) bind(v, rows::Role::full);
      else if (k == m.grads && m.target != TargetKind::none) bind(v, rows::Role::per_row);
      else if (params_.weighted) bind(v, rows::Role::per_col);
      else ++slot;
    }
    for (const TensorView& v : args.outputs) {
      if (def_.backward) bind(v, rows::Role::full);
      else if (none) bind(v, rows::Role::per_row);
      else rl.scalar_out = v.data, ++slot;
    }
    rl.rows = rows::make_rows(shape_, 1, std::span(views.data(), slot), std::span(roles.data(), slot));
    rl.workspace = workspace.data;
    return fn_(rl, params_, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const RowDef& def_;
  RowFn fn_;
  RowParams params_;
  Shape shape_;
};

std::string row_attr_doc(std::string_view loss, std::string_view attr) {
  if (attr == "margin") return loss == "cosine_embedding_loss" ? "cos above it costs where target = -1" : "the margin of the hinge";
  if (attr == "p") return loss == "multi_margin_loss" ? "exponent of the hinge: 1 or 2" : "the norm of the distances (> 0)";
  if (attr == "eps") return "added to the difference before the norm (pairwise_distance)";
  if (attr == "swap") return "1: the negative distance is min(d(anchor, negative), d(positive, negative))";
  return "";
}

template <class L>
void add_row_op(std::vector<OpInfo>& ops) {
  const RowLossMeta& meta = L::meta;
  for (bool backward : {false, true}) {
    row_defs().push_back(loss_def<RowDef>(meta, backward));
    const RowDef& d = row_defs().back();
    OpInfo info = loss_info(d, meta, "row_loss", "0 none, 1 mean (over the rows), 2 sum");
    for (const auto& a : meta.attrs)
      if (a.name) info.attrs.push_back({a.name, a.value, row_attr_doc(meta.name, a.name)});
    info.input_dtypes = [&d](DType primary) {
      std::vector<DType> t;
      for (const std::string& n : d.inputs)
        t.push_back(n == "target" && d.meta->target != TargetKind::sign ? DType::i64 : primary);
      return t;
    };
    // The backward of multilabel_margin reads the input after writing gradients of listed classes.
    info.in_place = !(backward && meta.target == TargetKind::index_list);
    for (double r : {0.0, 1.0, 2.0}) info.sample_attrs.push_back(Attrs{{"reduction", r}});
    const std::string_view n = meta.name;
    if (n == "cosine_embedding_loss") {
      info.sample_attrs.push_back(Attrs{{"reduction", 0}, {"margin", 0.3}});
      info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"margin", -0.2}});
    } else if (n == "triplet_margin_loss") {
      info.sample_attrs.push_back(Attrs{{"reduction", 0}, {"p", 1}, {"swap", 1}});
      info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"p", 3}, {"margin", 0.5}, {"swap", 1}});
      info.sample_attrs.push_back(Attrs{{"reduction", 2}, {"p", 1.5}, {"eps", 0.01}});
    } else if (n == "multi_margin_loss") {
      info.sample_attrs.push_back(Attrs{{"reduction", 0}, {"p", 2}, {"margin", 0.7}});
      info.sample_attrs.push_back(Attrs{{"reduction", 1}, {"p", 2}});
    }
    info.sample_shapes = [&d](DType, const Shape& shape, const Attrs& attrs) -> std::optional<SampleShapes> {
      const RowLossMeta& m = *d.meta;
      if (shape.empty() || (m.max_rank != 0 && shape.size() > size_t(m.max_rank))) return std::nullopt;
      if (index_target(m) && shape.back() < 2) return std::nullopt;  // targets are drawn from {0, 1} (and -1)
      // An index list costs O(listed x C) per row: a broadcast [65537] lists 65537 classes (minutes on the host).
      if (m.target == TargetKind::index_list && shape.back() > 4096) return std::nullopt;
      const Shape outer(shape.begin(), shape.end() - 1);
      const bool none = attrs.get("reduction", 1) == 0;
      SampleShapes s;
      if (d.backward) s.inputs.push_back(none ? outer : Shape{});
      for (int k = 0; k < m.inputs; ++k) {
        if (k < m.grads) s.inputs.push_back(shape);
        else if (k == m.grads) s.inputs.push_back(m.target == TargetKind::index_list ? shape : outer);
        else s.inputs.push_back(Shape{attrs.get("reduction", 1) != 2 ? shape.back() : 0});  // weighted but for sum
      }
      return s;
    };
    const size_t index = ops.size();
    info.infer = [&d](const OpDesc& partial) { return infer_row(d, partial); };
    info.make_plan = [&d, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      auto full = infer_row(d, desc);
      if (!full) return full.status();
      const int in = d.backward ? 1 : 0;
      const DType t = full->inputs[in].dtype;
      const DType target = d.meta->target == TargetKind::none ? t : full->inputs[in + d.meta->grads].dtype;
      if (backend != Backend::host_reference && d.meta->target == TargetKind::index_list && t != DType::f64 &&
          full->inputs[in].shape.back() > (int64_t(1) << 24))
        return unsupported(d.name, ": over 2^24 classes (the CUDA kernel counts them in f32)");
      const RowTable& table = backend == Backend::host_reference ? host_row_losses() : cuda_row_losses();
      RowFn fn = table.find(launch_key(d.meta->name, t, target));
      if (!fn)
        return unsupported("no ", backend_name(backend), " kernel for ", d.name, " ", dtype_name(t), " with ",
                           dtype_name(target), " targets");
      return PlanPtr(std::make_unique<RowPlan>(d, registry()[index], std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

}  // namespace
}  // namespace loss

void register_loss_ops(std::vector<OpInfo>& ops) {
  using namespace loss;
  pointwise_defs().reserve(64);
  class_defs().reserve(8);
  row_defs().reserve(16);
  [&]<class... Ls>(LossList<Ls...>) { (add_pointwise<Ls>(ops), ...); }(PointwiseLosses{});
  using S = std::vector<std::string>;
  add_class_op(ops, {"cross_entropy", true, Mode::forward, S{"input", "target", "weight"}, S{"out", "lse"}},
               "cross entropy of logits (class dim 1) against class indices or probabilities; also returns the "
               "per-row logsumexp for the backward");
  add_class_op(ops, {"cross_entropy_backward", true, Mode::backward, S{"grad_output", "input", "target", "weight", "lse"},
                     S{"grad_input"}},
               "gradient of cross_entropy with respect to the logits");
  add_class_op(ops, {"cross_entropy_fused", true, Mode::fused, S{"input", "target", "weight"}, S{"out", "grad_input"}},
               "cross_entropy and its gradient for grad_output = 1 in one pass over the logits (scale the "
               "gradient by grad_output afterwards)");
  add_class_op(ops, {"nll_loss", false, Mode::forward, S{"input", "target", "weight"}, S{"out"}},
               "negative log-likelihood of log-probabilities (class dim 1) at class-index targets");
  add_class_op(ops, {"nll_loss_backward", false, Mode::backward, S{"grad_output", "input", "target", "weight"},
                     S{"grad_input"}},
               "gradient of nll_loss with respect to the log-probabilities");
  [&]<class... Ls>(RowLossList<Ls...>) { (add_row_op<Ls>(ops), ...); }(RowLosses{});
}

}  // namespace baracuda
