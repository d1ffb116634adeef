// Normalization family: layer_norm and rms_norm (with and without affine
// parameters), the fused residual-add forms, and their backward plans.
#include <algorithm>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/rows.hpp"
#include "core/tensor_util.hpp"
#include "norm/backward_shape.hpp"
#include "norm/register.hpp"
#include "reduce/engine.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace norm {

NormTable& host_norms() {
  static NormTable table;
  return table;
}
NormTable& cuda_norms() {
  static NormTable table;
  return table;
}

namespace {

/// The host reference: each row in f64, parameter gradients summed in row order.
template <class S, class T, bool kBackward>
Status norm_on_host(const RowLaunch& l, const NormParams& p, int, CUstream_st*) {
  using M = math_t<T, true>;
  using Stat = stat_t<T>;
  const auto& st = l.inner.stride;
  auto at = [&](int k, const int64_t* off, int64_t c) -> T& {
    return reinterpret_cast<T*>(l.data[k])[off[k] + c * st[k][0]];
  };
  auto stat = [&](int k, const int64_t* off) -> Stat& { return reinterpret_cast<Stat*>(l.data[k])[off[k]]; };
  std::vector<M> h(l.cols);
  if constexpr (!kBackward) {
    const rows::OffsetCalc<S::kOperands, int64_t> outer(l.outer);
    for (int64_t r = 0; r < l.rows; ++r) {
      int64_t off[S::kOperands];
      outer.get(r, off);
      M sum = 0;
      for (int64_t c = 0; c < l.cols; ++c) {
        h[c] = convert<M>(at(S::kInput, off, c));
        if constexpr (S::kResidual) h[c] += convert<M>(at(S::kResidualIn, off, c));
      }
      const M shift = S::kRms ? M(0) : h[0];  // a constant row has exactly zero deviation
      for (int64_t c = 0; c < l.cols; ++c) sum += S::kRms ? h[c] * h[c] : h[c] - shift;
      M mean = 0, sq = sum;
      if constexpr (!S::kRms) {
        mean = shift + sum / M(l.cols);
        sq = 0;
        for (int64_t c = 0; c < l.cols; ++c) sq += (h[c] - mean) * (h[c] - mean);
        stat(S::kMean, off) = Stat(mean);
      }
      const M rstd = S::rstd(sq, l.cols, M(p.eps));
      stat(S::kRstd, off) = Stat(rstd);
      for (int64_t c = 0; c < l.cols; ++c) {
        M y = (h[c] - mean) * rstd;
        if constexpr (S::kWeight) y *= convert<M>(at(S::kWeightIn, off, c));
        if constexpr (S::kBias) y += convert<M>(at(S::kBiasIn, off, c));
        at(S::kOut, off, c) = convert<T>(y);
        if constexpr (S::kResidual) at(S::kResidualOut, off, c) = convert<T>(h[c]);
      }
    }
  } else {
    const rows::OffsetCalc<S::kBackwardOperands, int64_t> outer(l.outer);
    std::vector<M> dw(S::kWeight ? l.cols : 0, M(0)), db(S::kBias ? l.cols : 0, M(0));
    for (int64_t r = 0; r < l.rows; ++r) {
      int64_t off[S::kBackwardOperands];
      outer.get(r, off);
      const M mean = S::kRms ? M(0) : M(stat(S::kSavedMean, off)), rstd = M(stat(S::kSavedRstd, off));
      M a = 0, b = 0;
      for (int64_t c = 0; c < l.cols; ++c) {
        const M g = convert<M>(at(S::kGradOutput, off, c));
        const M wg = S::kWeight ? g * convert<M>(at(S::kSavedWeight, off, c)) : g;
        h[c] = (convert<M>(at(S::kSavedInput, off, c)) - mean) * rstd;  // xhat
        a += wg;
        b += wg * h[c];
        if constexpr (S::kWeight) dw[c] += g * h[c];
        if constexpr (S::kBias) db[c] += g;
      }
      for (int64_t c = 0; c < l.cols; ++c) {
        const M g = convert<M>(at(S::kGradOutput, off, c));
        const M wg = S::kWeight ? g * convert<M>(at(S::kSavedWeight, off, c)) : g;
        at(S::kGradInput, off, c) = convert<T>(S::grad_input(wg, h[c], a / M(l.cols), b / M(l.cols), rstd));
      }
    }
    const int64_t zero[S::kBackwardOperands] = {};
    for (int64_t c = 0; c < l.cols; ++c) {
      if constexpr (S::kWeight) at(S::kGradWeight, zero, c) = convert<T>(dw[c]);
      if constexpr (S::kBias) at(S::kGradBias, zero, c) = convert<T>(db[c]);
    }
  }
  return Status::ok();
}

template <class S, class T, bool kBackward>
struct HostNorm {
  static Status run(const RowLaunch& l, const NormParams& p, int splits, CUstream_st* s) {
    return norm_on_host<S, T, kBackward>(l, p, splits, s);
  }
};
[[maybe_unused]] const bool host_registered = register_norms<HostNorm, NormTypes>(host_norms());

struct Def {
  std::string name;
  bool backward, rms, weight, bias, residual;
  std::vector<std::string> inputs, outputs;
  std::vector<rows::Role> input_roles, output_roles;
};

std::vector<Def>& defs() {
  static std::vector<Def> all;
  return all;
}


/// Trailing dims normalised: the weight's rank, else the `normalized_dims` attribute.
int normalized_dims(const Def& def, const OpDesc& d) {
  if (def.weight) {
    const size_t w = def.backward ? d.inputs.size() - 1 : (def.residual ? 2 : 1);
    return static_cast<int>(d.inputs[w].shape.size());
  }
  return static_cast<int>(d.attrs.get("normalized_dims", 1));
}

Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  const size_t x_index = def.backward ? 1 : 0;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, x_index));
  const TensorSpec& x = d.inputs[x_index];
  const int rank = static_cast<int>(x.shape.size());
  BARACUDA_TRY(check_float_storage(op, x.dtype, def.backward));
  const int k = normalized_dims(def, d);
  if (k < 1 || k > rank)
    return invalid(op, ": normalized shape must cover 1 to ", rank, " trailing dims of '", def.inputs[x_index], "' ",
                   shape_str(x.shape), ", got ", k, def.weight ? " (the weight's rank)" : "");
  const Shape inner(x.shape.end() - k, x.shape.end()), outer(x.shape.begin(), x.shape.end() - k);
  auto expected = [&](rows::Role role, bool is_stat) {
    return TensorSpec{is_stat ? stat_dtype(x.dtype) : x.dtype,
                      role == rows::Role::full ? x.shape : role == rows::Role::per_row ? outer : inner};
  };
  auto is_stat_name = [](const std::string& n) { return n == "mean" || n == "rstd"; };
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const TensorSpec want = expected(def.input_roles[i], is_stat_name(def.inputs[i]));
    if (d.inputs[i].dtype != want.dtype)
      return invalid(op, ": '", def.inputs[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want.dtype));
    if (d.inputs[i].shape != want.shape)
      return invalid(op, ": '", def.inputs[i], "' shape ", shape_str(d.inputs[i].shape), ", expected ", shape_str(want.shape),
                     def.input_roles[i] == rows::Role::per_col ? " (the normalized shape)" : "");
  }
  std::vector<TensorSpec> outs;
  for (size_t j = 0; j < def.outputs.size(); ++j)
    outs.push_back(expected(def.output_roles[j], is_stat_name(def.outputs[j])));
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

class NormPlan final : public FamilyPlan {
 public:
  NormPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, NormFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const DType t = desc_.inputs[def.backward ? 1 : 0].dtype;
    sku_ = bespoke_sku(OpCategory::norm, info.name.c_str(), t, backend);  // parameter gradients merged in split order
    sku_.aux_element = stat_dtype(t);
    params_.eps = desc_.attrs.get("eps", def.rms ? -1 : 1e-5);
    if (params_.eps < 0)  // torch's rms_norm default: the dtype's machine epsilon
      params_.eps = t == DType::f64        ? 2.220446049250313e-16
                    : t == DType::f16      ? 9.765625e-4
                    : t == DType::bf16     ? 7.8125e-3
                    : t == DType::fp8_e4m3 ? 0.125
                    : t == DType::fp8_e5m2 ? 0.25
                                           : 1.1920928955078125e-7;
    const Shape& x = desc_.inputs[def.backward ? 1 : 0].shape;
    const int k = normalized_dims(def, desc_);
    for (size_t a = 0; a < x.size(); ++a) (a + k < x.size() ? rows_ : cols_) *= x[a];
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference) {
      if (def.backward && def.weight) {
        const FusedBackwardShape fused = fused_backward_shape(cols_, int(dtype_size(t)), current_sm_version() >= 90);
        splits_ = fused ? fused_backward_splits(fused, rows_, current_sm_count())
                        : red::choose_splits(cols_, rows_, current_sm_count());
        if (splits_ > 1) workspace_ = size_t(splits_) * 2 * size_t(cols_) * (t == DType::f64 ? 8 : 4);
      }
    }
#endif
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    if (rows_ == 0 || cols_ == 0) {
      // No rows: grad_weight / grad_bias (outputs 1 and 2) are sums over none, zeros as in torch.
      if (def_.backward && rows_ == 0)
        for (size_t j = 1; j < args.outputs.size(); ++j)
          BARACUDA_TRY(fill_bytes(args.outputs[j], 0, stream).with_context(def_.name));
      return Status::ok();
    }
    std::array<TensorView, rows::kMaxOperands> views;
    std::array<rows::Role, rows::kMaxOperands> roles;
    size_t n = 0;
    for (size_t j = 0; j < args.outputs.size(); ++j) views[n] = args.outputs[j], roles[n++] = def_.output_roles[j];
    for (size_t i = 0; i < args.inputs.size(); ++i) views[n] = args.inputs[i], roles[n++] = def_.input_roles[i];
    const Shape& x = desc_.inputs[def_.backward ? 1 : 0].shape;
    RowLaunch l = rows::make_rows(x, normalized_dims(def_, desc_), std::span(views.data(), n), std::span(roles.data(), n));
    if (l.inner.rank != 1)
      return unsupported(def_.name, ": the normalized dims of some operand cannot be walked as one (make them contiguous)");
    l.workspace = workspace.data;
    return fn_(l, params_, splits_, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  NormFn fn_;
  NormParams params_;
  int64_t rows_ = 1, cols_ = 1;
  int splits_ = 1;
};

template <class S>
void add_ops(std::vector<OpInfo>& ops) {
  using rows::Role;
  for (bool backward : {false, true}) {
    if (backward && !S::kHasBackward) continue;
    Def def{backward ? cat(S::name, "_backward") : std::string(S::name), backward, S::kRms, S::kWeight, S::kBias,
            S::kResidual, {}, {}, {}, {}};
    auto in = [&](const char* n, Role r) { def.inputs.push_back(n), def.input_roles.push_back(r); };
    auto out = [&](const char* n, Role r) { def.outputs.push_back(n), def.output_roles.push_back(r); };
    if (!backward) {
      out("out", Role::full);
      if (S::kResidual) out("residual_out", Role::full);
      if (!S::kRms) out("mean", Role::per_row);
      out("rstd", Role::per_row);
      in("input", Role::full);
      if (S::kResidual) in("residual", Role::full);
      if (S::kWeight) in("weight", Role::per_col);
      if (S::kBias) in("bias", Role::per_col);
    } else {
      out("grad_input", Role::full);
      if (S::kWeight) out("grad_weight", Role::per_col);
      if (S::kBias) out("grad_bias", Role::per_col);
      in("grad_output", Role::full);
      in("input", Role::full);
      if (!S::kRms) in("mean", Role::per_row);
      in("rstd", Role::per_row);
      if (S::kWeight) in("weight", Role::per_col);
    }
    defs().push_back(std::move(def));
    const Def& stored = defs().back();
    OpInfo info;
    info.name = stored.name;
    info.category = OpCategory::norm;
    info.family = "norm";
    info.direction = backward ? Direction::backward : Direction::forward;
    if (S::kHasBackward) info.gradient = backward ? std::string(S::name) : cat(S::name, "_backward");
    info.input_names = stored.inputs;
    info.output_names = stored.outputs;
    info.dtypes = backward ? dtypes_of<NormGradientTypes>() : dtypes_of<NormTypes>();
    info.attrs = {{"eps", S::kRms ? -1.0 : 1e-5, S::kRms ? "added to the mean square (-1: the dtype's epsilon, as torch)"
                                                        : "added to the variance"}};
    if (!S::kWeight) info.attrs.push_back({"normalized_dims", 1, "how many trailing dims are normalised"});
    info.backends = {Backend::bespoke_cuda, Backend::host_reference};
    info.doc = backward ? cat("gradients of ", S::name) : S::kResidual ? cat("residual add then ", S::kRms ? "rms_norm" : "layer_norm")
                                                                       : cat(S::kRms ? "RMS" : "layer", " normalization over the trailing dims");
    info.input_dtypes = [&stored](DType primary) {
      std::vector<DType> v;
      for (const auto& n : stored.inputs) v.push_back(n == "mean" || n == "rstd" ? stat_dtype(primary) : primary);
      return v;
    };
    // Inputs: x in [-2, 2]; saved statistics drawn where they are plausible.
    info.domains.clear();
    for (const auto& n : stored.inputs)
      info.domains.push_back(n == "rstd" ? Domain{0.5, 2} : n == "mean" ? Domain{-0.5, 0.5} : Domain{-2, 2});
    info.tolerance_scale = backward ? 8 : 4;
    // rms_norm's default eps depends on the dtype, so the f64 reference would differ: pin it.
    info.sample_attrs = {S::kRms ? Attrs{{"eps", 1e-6}} : Attrs{}};
    info.sample_shapes = [&stored](DType, const Shape& shape, const Attrs&) -> std::optional<SampleShapes> {
      if (shape.empty()) return std::nullopt;
      const Shape outer(shape.begin(), shape.end() - 1), inner{shape.back()};
      SampleShapes s;
      for (size_t i = 0; i < stored.inputs.size(); ++i)
        s.inputs.push_back(stored.input_roles[i] == Role::full ? shape : stored.input_roles[i] == Role::per_row ? outer : inner);
      return s;
    };
    const size_t index = ops.size();
    info.infer = [&stored](const OpDesc& partial) { return infer_desc(stored, partial); };
    info.make_plan = [&stored, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
      auto full = infer_desc(stored, desc);
      if (!full) return full.status();
      const DType t = full->inputs[stored.backward ? 1 : 0].dtype;
      const NormTable& table = backend == Backend::host_reference ? host_norms() : cuda_norms();
      NormFn fn = table.find(launch_key(stored.name, t));
      if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", stored.name, " ", dtype_name(t));
      return PlanPtr(std::make_unique<NormPlan>(stored, registry()[index], std::move(*full), backend, fn));
    };
    ops.push_back(std::move(info));
  }
}

// Note [Residual norm backward]
// add_rms_norm / add_layer_norm compute h = input + residual, return it as
// residual_out and normalise it, so their gradients are the plain norm's
// backward over h (the saved residual_out) plus the gradient that reaches
// residual_out from the residual stream: grad_input = grad_residual =
// norm_backward(grad_output, h, ...).grad_input + grad_residual_out. The
// plan runs the norm backward plan and, when grad_residual_out is given (not
// [0]), an in-place add, on the same backend: one more pass over the rows
// than a kernel that adds grad_residual_out as it writes grad_input would
// make (the next step for speed).
class ResidualBackwardPlan final : public FamilyPlan {
 public:
  ResidualBackwardPlan(const OpInfo& info, OpDesc desc, PlanPtr norm, PlanPtr add)
      : FamilyPlan(info, std::move(desc)), norm_(std::move(norm)), add_(std::move(add)) {
    sku_ = norm_->sku();
    sku_.op = info.name.c_str();
    workspace_ = std::max(norm_->workspace_size(), add_ ? add_->workspace_size() : 0);
  }

  Status can_implement(const OpArgs& args) const override {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    if (add_ && memory_overlaps(args.outputs[0], args.inputs[1]))
      return invalid(info_.name, ": output 'grad_input' overlaps input 'grad_residual_out' (it is written before "
                     "grad_residual_out is added)");
    const std::vector<TensorView> inner = norm_inputs(args);
    BARACUDA_TRY(norm_->can_implement(OpArgs{inner, args.outputs}).with_context(info_.name));
    if (!add_) return Status::ok();
    const TensorView sum_in[2] = {args.outputs[0], args.inputs[1]};
    return add_->can_implement(OpArgs{sum_in, std::span(args.outputs.data(), 1)}).with_context(info_.name);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(can_implement(args));
    BARACUDA_TRY(check_workspace(info_.name, workspace, workspace_));
    const std::vector<TensorView> inner = norm_inputs(args);
    BARACUDA_TRY(norm_->run(stream, workspace, OpArgs{inner, args.outputs}).with_context(info_.name));
    if (!add_) return Status::ok();
    const TensorView sum_in[2] = {args.outputs[0], args.inputs[1]};
    return add_->run(stream, workspace, OpArgs{sum_in, std::span(args.outputs.data(), 1)}).with_context(info_.name);
  }

 private:
  /// The norm backward's inputs: all but grad_residual_out (input 1).
  static std::vector<TensorView> norm_inputs(const OpArgs& args) {
    std::vector<TensorView> v(args.inputs.begin(), args.inputs.end());
    v.erase(v.begin() + 1);
    return v;
  }

  PlanPtr norm_, add_;
};

/// The norm backward's descriptor inside a residual one (grad_residual_out, input 1, left out).
OpDesc inner_backward(const std::string& norm_op, const OpDesc& d) {
  OpDesc inner{cat(norm_op, "_backward"), d.inputs, d.outputs, d.attrs};
  if (inner.inputs.size() > 1) inner.inputs.erase(inner.inputs.begin() + 1);
  return inner;
}

Result<OpDesc> infer_residual_backward(const std::string& op, const std::string& norm_op, const OpDesc& partial) {
  const OpInfo& norm_info = *find_op(cat(norm_op, "_backward"));
  std::vector<std::string> names = norm_info.input_names;
  names.insert(names.begin() + 1, "grad_residual_out");
  names[2] = "residual_out";
  BARACUDA_TRY(check_inputs(op, partial, names, 2));
  auto inner = norm_info.infer(inner_backward(norm_op, partial));
  if (!inner) {  // the norm backward's words, under this op's names
    std::string message = inner.status().message();
    if (message.rfind(norm_info.name, 0) == 0) message.replace(0, norm_info.name.size(), op);
    for (size_t at = message.find("'input'"); at != std::string::npos; at = message.find("'input'", at))
      message.replace(at, 7, "'residual_out'");
    return Status::error(inner.status().kind(), message);
  }
  const TensorSpec &g = partial.inputs[1], &h = partial.inputs[2];
  if (g.dtype != h.dtype)
    return invalid(op, ": 'grad_residual_out' dtype ", dtype_name(g.dtype), ", expected ", dtype_name(h.dtype));
  if (g.shape != h.shape && g.shape != Shape{0})
    return invalid(op, ": 'grad_residual_out' shape ", shape_str(g.shape), ", expected ", shape_str(h.shape),
                   " (residual_out's) or [0] (none)");
  OpDesc d = partial;
  d.outputs = inner->outputs;
  return d;
}

/// add_rms_norm_backward / add_layer_norm_backward (Note [Residual norm backward]).
void add_residual_backward(std::vector<OpInfo>& ops, const std::string& fused, const std::string& norm_op) {
  auto registered = [&](const std::string& name) -> OpInfo& {  // (the registry is still being built)
    return *std::find_if(ops.begin(), ops.end(), [&](const OpInfo& o) { return o.name == name; });
  };
  registered(fused).gradient = cat(fused, "_backward");
  const OpInfo& norm_info = registered(cat(norm_op, "_backward"));
  OpInfo info = norm_info;
  info.name = cat(fused, "_backward");
  info.gradient = fused;
  info.input_names.insert(info.input_names.begin() + 1, "grad_residual_out");
  info.input_names[2] = "residual_out";
  info.doc = cat("gradients of ", fused, ": grad_input (the gradient of both input and residual) = ", norm_op,
                 "_backward over residual_out + grad_residual_out ([0]: none), and the parameter gradients");
  info.input_dtypes = [base = norm_info.input_dtypes](DType primary) {
    std::vector<DType> v = base(primary);
    v.insert(v.begin() + 1, primary);
    return v;
  };
  info.domains.insert(info.domains.begin() + 1, Domain{-2, 2});
  // Rows of an odd length sample grad_residual_out as [0] (none).
  info.sample_shapes = [base = norm_info.sample_shapes](DType t, const Shape& shape,
                                                        const Attrs& attrs) -> std::optional<SampleShapes> {
    auto s = base(t, shape, attrs);
    if (s) s->inputs.insert(s->inputs.begin() + 1, shape.back() % 2 ? Shape{0} : shape);
    return s;
  };
  info.infer = [op = info.name, norm_op](const OpDesc& partial) {
    return infer_residual_backward(op, norm_op, partial);
  };
  const size_t index = ops.size();
  info.make_plan = [op = info.name, norm_op, index](Backend backend, const Stream& stream, const OpDesc& desc,
                                                    const PlanPreference& pref) -> Result<PlanPtr> {
    auto full = infer_residual_backward(op, norm_op, desc);
    if (!full) return full.status();
    PlanPreference sub = pref;
    sub.backend = backend, sub.skip_candidates = 0, sub.allow_host_fallback = backend == Backend::host_reference;
    auto norm = select(stream, inner_backward(norm_op, *full), sub);
    if (!norm) return norm.status();
    PlanPtr add;
    if (full->inputs[1].shape != Shape{0}) {
      const TensorSpec& g = full->inputs[1];
      auto sum = select(stream, OpDesc{"add", {g, g}, {g}, {}}, sub);
      if (!sum) return sum.status();
      add = std::move(*sum);
    }
    return PlanPtr(std::make_unique<ResidualBackwardPlan>(registry()[index], std::move(*full), std::move(*norm),
                                                          std::move(add)));
  };
  ops.push_back(std::move(info));
}

template <class... Ss>
void add_all(std::vector<OpInfo>& ops, SpecList<Ss...>) {
  (add_ops<Ss>(ops), ...);
  add_residual_backward(ops, AddRmsNorm::name, RmsNorm::name);
  add_residual_backward(ops, AddLayerNorm::name, LayerNorm::name);
}

}  // namespace
}  // namespace norm

void register_norm_ops(std::vector<OpInfo>& ops) {
  norm::defs().reserve(16);
  norm::add_all(ops, norm::NormSpecs{});
}

}  // namespace baracuda
