// batch_norm and batch_norm_backward: descriptor checks, the plan that binds
// a BatchNormLaunch, and registration. Candidates: the bespoke CUDA kernels
// (batch_norm_kernels.cu), then the host reference (batch_norm_host.cpp).
//
// Operands (absent optional ones are [0] tensors, as elsewhere in baracuda):
//   batch_norm(input [N, C, *], weight, bias, running_mean, running_var)
//     -> out, save_mean, save_invstd, running_mean_out, running_var_out
//   batch_norm_backward(grad_output, input, weight, save_mean, save_invstd,
//                       running_mean, running_var) -> grad_input, grad_weight, grad_bias
// The running statistics are updated "in place" by passing the same tensors
// as running_mean_out / running_var_out (an output may alias an input of the
// same layout); they are [0] when no running stats are given.
#include <algorithm>
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "elementwise/prepare.hpp"
#include "norm/batch_norm.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {
namespace norm::bn {

BatchNormTable& cuda_batch_norm() {
  static BatchNormTable table;
  return table;
}

namespace {

struct Def {
  std::string name;
  bool backward;
  std::vector<std::string> inputs, outputs;
};

const Def& forward_def() {
  static const Def d{"batch_norm", false, {"input", "weight", "bias", "running_mean", "running_var"},
                     {"out", "save_mean", "save_invstd", "running_mean_out", "running_var_out"}};
  return d;
}
const Def& backward_def() {
  static const Def d{"batch_norm_backward", true,
                     {"grad_output", "input", "weight", "save_mean", "save_invstd", "running_mean", "running_var"},
                     {"grad_input", "grad_weight", "grad_bias"}};
  return d;
}

bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }
bool is_stat(const std::string& n) { return n == "save_mean" || n == "save_invstd"; }

/// The input's index among the operands.
size_t x_index(const Def& def) { return def.backward ? 1 : 0; }

/// The dtype of weight, bias and running stats: the first one given (the
/// input's dtype when none is, f32 for fp8 inputs).
DType param_dtype(const Def& def, const OpDesc& d) {
  for (size_t i = 0; i < def.inputs.size(); ++i)
    if (!is_stat(def.inputs[i]) && i != x_index(def) && def.inputs[i] != "grad_output" && d.inputs[i].shape != Shape{0})
      return d.inputs[i].dtype;
  return is_fp8(d.inputs[x_index(def)].dtype) ? DType::f32 : d.inputs[x_index(def)].dtype;
}

bool given(const OpDesc& d, const Def& def, const char* name) {
  for (size_t i = 0; i < def.inputs.size(); ++i)
    if (def.inputs[i] == name) return d.inputs[i].shape != Shape{0};
  return false;
}

int64_t space_count(const Shape& x) {
  int64_t n = 1;
  for (size_t a = 0; a < x.size(); ++a)
    if (a != 1) n *= x[a];
  return n;
}

Result<OpDesc> infer_desc(const Def& def, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string& op = def.name;
  BARACUDA_TRY(check_inputs(op, d, def.inputs, x_index(def)));
  const TensorSpec& x = d.inputs[x_index(def)];
  BARACUDA_TRY(check_float_storage(op, x.dtype, def.backward));
  if (x.shape.size() < 2)
    return invalid(op, ": 'input' must be [N, C, *] (rank >= 2, channels in dim 1), got shape ", shape_str(x.shape));
  const double training = d.attrs.get("training", 0), eps = d.attrs.get("eps", 1e-5);
  const double momentum = d.attrs.get("momentum", 0.1);
  if (training != 0 && training != 1) return invalid(op, ": 'training' must be 0 or 1, got ", training);
  if (!(eps >= 0) || !std::isfinite(eps)) return invalid(op, ": 'eps' must be finite and >= 0, got ", eps);
  if (!std::isfinite(momentum)) return invalid(op, ": 'momentum' must be finite, got ", momentum);
  const int64_t channels = x.shape[1];
  const DType p = param_dtype(def, d), s = stat_dtype(x.dtype);
  if (is_fp8(x.dtype) && p != DType::f32)
    return invalid(op, ": parameter dtype ", dtype_name(p), ", expected f32 (the parameters and running stats of an ",
                   dtype_name(x.dtype), " input)");
  if (p != x.dtype && !(is_half(x.dtype) && p == DType::f32) && !is_fp8(x.dtype))
    return invalid(op, ": parameter dtype ", dtype_name(p), ", expected ", dtype_name(x.dtype),
                   is_half(x.dtype) ? " or f32" : "", " (input dtype ", dtype_name(x.dtype), ")");
  for (size_t i = 0; i < def.inputs.size(); ++i) {
    const std::string& name = def.inputs[i];
    const TensorSpec& t = d.inputs[i];
    if (i == x_index(def)) continue;
    if (name == "grad_output") {
      if (t.dtype != x.dtype || t.shape != x.shape)
        return invalid(op, ": 'grad_output' ", dtype_name(t.dtype), shape_str(t.shape), " != 'input' ", dtype_name(x.dtype),
                       shape_str(x.shape));
      continue;
    }
    const DType want = is_stat(name) ? s : p;
    if (t.dtype != want && t.shape != Shape{0})  // an absent operand's dtype does not matter
      return invalid(op, ": '", name, "' dtype ", dtype_name(t.dtype), ", expected ", dtype_name(want),
                     is_stat(name) ? "" : " (weight, bias and running stats share one dtype)");
    if (t.shape != Shape{channels} && t.shape != Shape{0})
      return invalid(op, ": '", name, "' shape ", shape_str(t.shape), ", expected [", channels,
                     "] (the channel count, input dim 1) or [0] (absent)");
  }
  const bool train = training == 1;
  const bool running = given(d, def, "running_mean");
  if (running != given(d, def, "running_var"))
    return invalid(op, ": give both 'running_mean' and 'running_var', or neither");
  if (!train && !running) return invalid(op, ": eval mode (training=0) needs 'running_mean' and 'running_var'");
  std::vector<TensorSpec> outs;
  if (!def.backward) {
    if (train && space_count(x.shape) == 1)
      return invalid(op, ": expected more than 1 value per channel when training, got input size ", shape_str(x.shape));
    const Shape r = running ? Shape{channels} : Shape{0};
    outs = {{x.dtype, x.shape}, {s, {channels}}, {s, {channels}}, {p, r}, {p, r}};
  } else {
    if (train && !(given(d, def, "save_mean") && given(d, def, "save_invstd")))
      return invalid(op, ": training=1 needs 'save_mean' and 'save_invstd' (from the forward)");
    outs = {{x.dtype, x.shape}, {p, {channels}}, {p, {channels}}};
  }
  BARACUDA_TRY(set_outputs(op, d, outs, def.outputs));
  return d;
}

/// Chunks of each channel's space for the CUDA walks (Note [Batch norm
/// layout]). Channels-first: about two waves of 256-thread blocks, at least
/// 4096 elements a chunk. Channels-last: two chunks an SM for each tile of
/// 32 channel vectors, at least 64 positions a chunk: one wave of blocks
/// that each walk far, and few partials to merge (H100, bf16 32x256x56x56:
/// the grad_input pass took 69 us in 264 chunks, 82 us in 1024).
struct Splits {
  int first = 1, last = 1;
};
[[maybe_unused]] Splits choose_splits(int64_t channels, int64_t count, int sm_count) {
  const int64_t target = int64_t(sm_count) * 16;
  const int64_t by_parallelism = (target + channels - 1) / std::max<int64_t>(channels, 1);
  const int first = int(std::clamp<int64_t>(std::min(by_parallelism, count / 4096), 1, 1024));
  const int last = int(std::clamp<int64_t>(std::min<int64_t>(2 * int64_t(sm_count), count / 64), 1, 1024));
  return {first, last};
}

class BatchNormPlan final : public FamilyPlan {
 public:
  BatchNormPlan(const Def& def, const OpInfo& info, OpDesc desc, Backend backend, BatchNormFn fn)
      : FamilyPlan(info, std::move(desc)), def_(def), fn_(fn) {
    const TensorSpec& x = desc_.inputs[x_index(def)];
    sku_ = bespoke_sku(OpCategory::norm, info.name.c_str(), x.dtype, backend);
    sku_.aux_element = param_dtype(def, desc_);
    channels_ = x.shape[1];
    count_ = space_count(x.shape);
    training_ = desc_.attrs.get("training", 0) == 1;
    momentum_ = desc_.attrs.get("momentum", 0.1);
    eps_ = desc_.attrs.get("eps", 1e-5);
#ifdef BARACUDA_HAS_CUDA
    if (backend != Backend::host_reference && count_ > 0) {
      splits_ = choose_splits(channels_, count_, current_sm_count());
      // The per-channel coefficients (3 forward, 4 backward), then the
      // partials (3 forward, 2 backward) of the walk with more splits, in f32
      // (f64 for f64): batch_norm_kernels.cu.
      const size_t acc = x.dtype == DType::f64 ? 8 : 4;
      const size_t partials = def.backward ? 2 : 3, coefficients = def.backward ? 4 : 3;
      workspace_ = size_t(channels_) * acc * (partials * size_t(std::max(splits_.first, splits_.last)) + coefficients);
    }
#endif
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    if (channels_ == 0) return Status::ok();
    BatchNormLaunch l;
    l.channels = channels_;
    l.count = count_;
    l.training = training_, l.momentum = momentum_, l.eps = eps_;
    l.workspace = workspace.data;
    auto vec = [](const TensorView& v) {
      return v.numel() == 0 ? ChannelVec{} : ChannelVec{static_cast<char*>(v.data), v.stride[0]};
    };
    const TensorView& x = args.inputs[x_index(def_)];
    const TensorView& y = args.outputs[0];
    const TensorView* g = def_.backward ? &args.inputs[0] : nullptr;
    if (!def_.backward) {
      l.weight = vec(args.inputs[1]), l.bias = vec(args.inputs[2]);
      l.running_mean = vec(args.inputs[3]), l.running_var = vec(args.inputs[4]);
      l.save_mean = vec(args.outputs[1]), l.save_invstd = vec(args.outputs[2]);
      l.running_mean_out = vec(args.outputs[3]), l.running_var_out = vec(args.outputs[4]);
    } else {
      l.weight = vec(args.inputs[2]);
      l.save_mean = vec(args.inputs[3]), l.save_invstd = vec(args.inputs[4]);
      l.running_mean = vec(args.inputs[5]), l.running_var = vec(args.inputs[6]);
      l.grad_weight = vec(args.outputs[1]), l.grad_bias = vec(args.outputs[2]);
    }
    // The space: every dim but the channel, innermost first, over x, y, g.
    const TensorView* full[kFull] = {&x, &y, g};
    ew::Problem space;
    space.n_operands = kFull;
    for (int a = x.rank - 1; a >= 0; --a) {
      if (a == 1) continue;
      space.shape[space.rank] = x.shape[a];
      for (int k = 0; k < kFull; ++k) space.stride[k][space.rank] = full[k] ? full[k]->stride[a] : 0;
      ++space.rank;
    }
    for (int k = 0; k < kFull; ++k) {
      l.data[k] = full[k] ? static_cast<char*>(full[k]->data) : nullptr;
      l.channel_stride[k] = full[k] ? full[k]->stride[1] : 0;
    }
    if (count_ > 0) {
      ew::drop_unit_dims(space);
      ew::sort_dims(space);
      ew::coalesce(space);
      l.row_len = space.rank ? space.shape[0] : 1;
      for (int k = 0; k < kFull; ++k) l.row_stride[k] = space.rank ? space.stride[k][0] : 0;
      ew::Problem rows = space;  // the dims above the row
      rows.rank = std::max(space.rank - 1, 0);
      for (int d = 0; d < rows.rank; ++d) {
        rows.shape[d] = space.shape[d + 1];
        for (int k = 0; k < kFull; ++k) rows.stride[k][d] = space.stride[k][d + 1];
      }
      l.rows = rows.numel();
      l.row_offsets = ew::OffsetCalc<kFull, int64_t>(rows);
    }
    l.channels_last = x.stride[1] == 1 && channels_ > 1;
    l.splits = l.channels_last ? splits_.last : splits_.first;
    return fn_(l, stream.cuda_stream()).with_context(def_.name);
  }

 private:
  const Def& def_;
  BatchNormFn fn_;
  int64_t channels_ = 0, count_ = 0;
  bool training_ = false;
  double momentum_ = 0.1, eps_ = 1e-5;  ///< attributes, read once at plan time
  Splits splits_;
};

std::optional<SampleShapes> sample_shapes(const Def& def, const Shape& shape, const Attrs& attrs) {
  if (shape.empty()) return std::nullopt;
  const Shape x = shape.size() == 1 ? Shape{shape[0], 3} : shape;
  if (!def.backward && attrs.get("training", 0) == 1 && space_count(x) == 1) return std::nullopt;
  const Shape c{x[1]};
  SampleShapes s;
  for (size_t i = 0; i < def.inputs.size(); ++i) s.inputs.push_back(i <= x_index(def) ? x : c);
  return s;
}

void add_op(std::vector<OpInfo>& ops, const Def& def) {
  OpInfo info;
  info.name = def.name;
  info.category = OpCategory::norm;
  info.family = "batch_norm";
  info.direction = def.backward ? Direction::backward : Direction::forward;
  info.gradient = def.backward ? "batch_norm" : "batch_norm_backward";
  info.input_names = def.inputs;
  info.output_names = def.outputs;
  info.dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
  if (!def.backward) info.dtypes.insert(info.dtypes.end(), {DType::fp8_e4m3, DType::fp8_e5m2});  // f32 parameters
  info.attrs = {{"training", 0, "1: normalise by the batch statistics (and update the running stats given); "
                                "0: by running_mean / running_var"},
                {"eps", 1e-5, "added to the variance"}};
  if (!def.backward)
    info.attrs.push_back({"momentum", 0.1, "running = (1 - momentum) * running + momentum * batch statistic "
                                           "(unbiased variance), training only"});
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = def.backward
                 ? "gradients of batch_norm: training uses save_mean / save_invstd, eval running_mean / running_var "
                   "(absent ones [0]); grad_weight = sum g * xhat and grad_bias = sum g per channel, also without "
                   "a weight"
                 : "batch normalization of input [N, C, *] over N and the spatial dims per channel (torch's "
                   "native_batch_norm). weight, bias, running_mean, running_var: [C] or [0] (absent), the input "
                   "dtype or f32 for f16/bf16 input (f32 for fp8 input). save_mean / save_invstd: f32 (f64 for f64), the batch "
                   "statistics (training) or the running ones used (eval). running_mean_out / running_var_out "
                   "([C] when running stats are given, else [0]): the updated stats in training, a copy in eval; "
                   "pass the running stats themselves to update them in place";
  // The sweep exercises the mixed form (f32 parameters) for the halves; the
  // dedicated tests run same-dtype parameters.
  info.input_dtypes = [&def](DType primary) {
    const DType p = is_half(primary) || is_fp8(primary) ? DType::f32 : primary;
    std::vector<DType> v;
    for (size_t i = 0; i < def.inputs.size(); ++i)
      v.push_back(i <= x_index(def) ? primary : is_stat(def.inputs[i]) ? stat_dtype(primary) : p);
    return v;
  };
  for (const auto& n : def.inputs)
    info.domains.push_back(n == "running_var" || n == "save_invstd" ? Domain{0.5, 2}
                           : n == "running_mean" || n == "save_mean" ? Domain{-0.5, 0.5}
                                                                     : Domain{-2, 2});
  info.tolerance_scale = def.backward ? 8 : 4;
  info.sample_attrs = {Attrs{{"training", 1}}, Attrs{{"training", 0}, {"eps", 1e-3}}};
  if (!def.backward) info.sample_attrs.push_back(Attrs{{"training", 1}, {"momentum", 0.3}, {"eps", 1e-4}});
  info.sample_shapes = [&def](DType, const Shape& shape, const Attrs& attrs) { return sample_shapes(def, shape, attrs); };
  const size_t index = ops.size();
  info.infer = [&def](const OpDesc& partial) { return infer_desc(def, partial); };
  info.make_plan = [&def, index](Backend backend, const Stream&, const OpDesc& desc, const PlanPreference&) -> Result<PlanPtr> {
    auto full = infer_desc(def, desc);
    if (!full) return full.status();
    const DType t = full->inputs[x_index(def)].dtype, p = param_dtype(def, *full);
    const BatchNormTable& table = backend == Backend::host_reference ? host_batch_norm() : cuda_batch_norm();
    BatchNormFn fn = table.find(launch_key(def.name, t, p));
    if (!fn) return unsupported("no ", backend_name(backend), " kernel for ", def.name, " ", dtype_name(t), " with ",
                                dtype_name(p), " parameters");
    return PlanPtr(std::make_unique<BatchNormPlan>(def, registry()[index], std::move(*full), backend, fn));
  };
  ops.push_back(std::move(info));
}

}  // namespace
}  // namespace norm::bn

void register_batch_norm_ops(std::vector<OpInfo>& ops) {
  norm::bn::add_op(ops, norm::bn::forward_def());
  norm::bn::add_op(ops, norm::bn::backward_def());
}

}  // namespace baracuda
