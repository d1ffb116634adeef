// ctc_loss and ctc_loss_backward: registry entries, shape rules and the plan
// (the recursions are in ctc.hpp; host reference ctc_host.cpp, CUDA ctc_kernels.cu).
// Attributes: reduction (0 none, 1 mean, 2 sum), blank, zero_infinity.
#include <algorithm>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/launch_table.hpp"
#include "core/registry_internal.hpp"
#include "core/sizes.hpp"
#include "core/tensor_util.hpp"
#include "loss/ctc.hpp"
#include "loss/register.hpp"

namespace baracuda {
namespace loss::ctc {

LaunchTable<Fn>& host_ctc() {
  static LaunchTable<Fn> table;
  return table;
}
LaunchTable<Fn>& cuda_ctc() {
  static LaunchTable<Fn> table;
  return table;
}

namespace {

using Names = std::vector<std::string>;
const Names kForwardInputs{"log_probs", "targets", "input_lengths", "target_lengths"};
const Names kBackwardInputs{"grad_output", "log_probs", "targets", "input_lengths", "target_lengths"};

/// T, N, C, S of a descriptor (S: padded targets' dim 1, or the concatenated length).
struct Dims {
  int64_t T = 0, N = 0, C = 0, S = 0;
  bool batched = true, concatenated = false;
  Shape loss;  ///< the forward output's shape
};

bool is_index(DType d) { return d == DType::i64 || d == DType::i32; }

/// `backward`: the gradient op, which refuses fp8 log-probabilities (fp8 forwards have no gradient).
Result<Dims> check_operands(const std::string& op, bool backward, const std::vector<TensorSpec>& in, const Attrs& attrs) {
  const TensorSpec &lp = in[0], &tg = in[1], &il = in[2], &tl = in[3];
  BARACUDA_TRY(check_float_storage(op + ": 'log_probs'", lp.dtype, backward));
  if (lp.shape.size() != 3 && lp.shape.size() != 2)
    return invalid(op, ": 'log_probs' must be [T, N, C] or [T, C] (unbatched), got ", shape_str(lp.shape));
  Dims d;
  d.batched = lp.shape.size() == 3;
  d.T = lp.shape[0];
  d.N = d.batched ? lp.shape[1] : 1;
  d.C = lp.shape.back();
  for (int k = 1; k < 4; ++k)
    if (!is_index(in[k].dtype))
      return invalid(op, ": '", kForwardInputs[k], "' must be i64 or i32, got ", dtype_name(in[k].dtype));
  if (d.batched && tg.shape.size() == 2 && tg.shape[0] == d.N) {
    d.S = tg.shape[1];
  } else if (tg.shape.size() == 1) {
    d.S = tg.shape[0];
    d.concatenated = d.batched;
  } else {
    return invalid(op, ": 'targets' must be ",
                   d.batched ? cat("[", d.N, ", S] (padded) or [sum of target_lengths] (concatenated)") : cat("[S]"),
                   " for 'log_probs' ", shape_str(lp.shape), ", got ", shape_str(tg.shape));
  }
  const Shape lengths = d.batched ? Shape{d.N} : Shape{};
  if (il.shape != lengths) return invalid(op, ": 'input_lengths' shape ", shape_str(il.shape), " != ", shape_str(lengths));
  if (tl.shape != lengths) return invalid(op, ": 'target_lengths' shape ", shape_str(tl.shape), " != ", shape_str(lengths));
  const double reduction = attrs.get("reduction", 1), blank = attrs.get("blank", 0), zi = attrs.get("zero_infinity", 0);
  if (reduction != 0 && reduction != 1 && reduction != 2)
    return invalid(op, ": attribute 'reduction' must be 0 (none), 1 (mean) or 2 (sum), got ", reduction);
  if (blank != std::floor(blank) || blank < 0 || blank >= double(d.C))
    return invalid(op, ": attribute 'blank' must be a class index in [0, ", d.C, "), got ", blank);
  if (zi != 0 && zi != 1) return invalid(op, ": attribute 'zero_infinity' must be 0 or 1, got ", zi);
  if (reduction == 0 && d.batched) d.loss = {d.N};
  return d;
}

Result<OpDesc> infer_ctc(bool backward, const OpDesc& partial) {
  const std::string op = backward ? "ctc_loss_backward" : "ctc_loss";
  const Names& names = backward ? kBackwardInputs : kForwardInputs;
  BARACUDA_TRY(check_inputs(op, partial, names, backward ? 1 : 0));
  OpDesc d = partial;
  const std::vector<TensorSpec> fwd(d.inputs.begin() + (backward ? 1 : 0), d.inputs.end());
  auto dims = check_operands(op, backward, fwd, d.attrs);
  if (!dims) return dims.status();
  const DType t = fwd[0].dtype;
  if (!backward) {
    BARACUDA_TRY(set_outputs(op, d, {TensorSpec{t, dims->loss}}, Names{"out"}));
    return d;
  }
  if (d.inputs[0].dtype != t || d.inputs[0].shape != dims->loss)
    return invalid(op, ": 'grad_output' must be ", dtype_name(t), shape_str(dims->loss), " (the loss's shape), got ",
                   dtype_name(d.inputs[0].dtype), shape_str(d.inputs[0].shape));
  BARACUDA_TRY(set_outputs(op, d, {fwd[0]}, Names{"grad_log_probs"}));
  return d;
}

constexpr size_t kSmemBytes = 48 * 1024;

class CtcPlan final : public FamilyPlan {
 public:
  CtcPlan(const OpInfo& info, OpDesc desc, Backend backend, Fn fn, bool backward)
      : FamilyPlan(info, std::move(desc)), fn_(fn), backward_(backward) {
    const size_t k = backward ? 1 : 0;
    dims_ = *check_operands(info.name, backward, std::vector<TensorSpec>(desc_.inputs.begin() + k, desc_.inputs.end()), desc_.attrs);
    const DType t = desc_.inputs[k].dtype;
    sku_ = bespoke_sku(OpCategory::loss, info.name.c_str(), t, backend);
    sku_.aux_element = desc_.inputs[k + 1].dtype;
    blank_ = static_cast<int64_t>(desc_.attrs.get("blank", 0));
    reduction_ = static_cast<int>(desc_.attrs.get("reduction", 1));
    zero_infinity_ = desc_.attrs.get("zero_infinity", 0) != 0;
    if (backend == Backend::host_reference) return;
    const size_t m = t == DType::f64 ? 8 : 4;
    const size_t rows = size_t(dims_.concatenated ? 2 * dims_.S + dims_.N : dims_.N * (2 * dims_.S + 1));
    rows_in_smem_ = kRollingRows * size_t(2 * dims_.S + 1) * m <= kSmemBytes;
    loss_bytes_ = workspace_aligned(!backward && reduction_ != 0 ? size_t(dims_.N) * m : 0);
    alpha_bytes_ = workspace_aligned(backward ? size_t(dims_.T) * rows * m : 0);
    rows_bytes_ = workspace_aligned(rows_in_smem_ ? 0 : kRollingRows * rows * m);
    const size_t next = backward ? 2 * size_t(dims_.concatenated ? dims_.S : dims_.N * dims_.S) * 4 : 0;
    workspace_ = loss_bytes_ + alpha_bytes_ + rows_bytes_ + workspace_aligned(next);
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_run(workspace, args));
    const size_t k = backward_ ? 1 : 0;
    const TensorView &lp = args.inputs[k], &tg = args.inputs[k + 1], &il = args.inputs[k + 2], &tl = args.inputs[k + 3];
    const TensorView& dst = args.outputs[0];
    const bool b = dims_.batched;
    Problem p;
    p.log_probs = lp.data;
    p.lp_t = lp.stride[0], p.lp_n = b ? lp.stride[1] : 0, p.lp_c = lp.stride[lp.rank - 1];
    p.targets = tg.data;
    p.tg_n = b && !dims_.concatenated ? tg.stride[0] : 0, p.tg_s = tg.stride[tg.rank - 1];
    p.input_lengths = il.data, p.target_lengths = tl.data;
    p.il_stride = b ? il.stride[0] : 0, p.tl_stride = b ? tl.stride[0] : 0;
    p.targets64 = tg.dtype == DType::i64, p.il64 = il.dtype == DType::i64, p.tl64 = tl.dtype == DType::i64;
    p.dst = dst.data;
    if (backward_) {
      const TensorView& go = args.inputs[0];
      p.grad_output = go.data;
      p.go_stride = go.rank == 1 ? go.stride[0] : 0;
      p.dst_t = dst.stride[0], p.dst_n = b ? dst.stride[1] : 0, p.dst_c = dst.stride[dst.rank - 1];
    } else {
      p.dst_n = dst.rank == 1 ? dst.stride[0] : 0;
    }
    p.T = dims_.T, p.N = dims_.N, p.C = dims_.C, p.S = dims_.S;
    p.concatenated = dims_.concatenated;
    p.blank = blank_, p.reduction = reduction_, p.zero_infinity = zero_infinity_;
    char* ws = static_cast<char*>(workspace.data);
    p.ws_loss = ws;
    p.ws_alpha = ws + loss_bytes_;
    p.ws_rows = ws + loss_bytes_ + alpha_bytes_;
    p.ws_next = reinterpret_cast<int32_t*>(ws + loss_bytes_ + alpha_bytes_ + rows_bytes_);
    p.rows_in_smem = rows_in_smem_;
    return fn_(p, backward_, stream.cuda_stream()).with_context(info_.name);
  }

 private:
  Fn fn_;
  bool backward_;
  Dims dims_;
  int64_t blank_ = 0;  ///< attributes, read once at plan time
  int reduction_ = 1;
  bool zero_infinity_ = false;
  bool rows_in_smem_ = true;
  size_t loss_bytes_ = 0, alpha_bytes_ = 0, rows_bytes_ = 0;
};

/// The sweep's cases from its primary shape: rank 1 {n} an unbatched case
/// (n <= 8) or n / 16 + 1 samples, rank 2 {a, C} a / 16 samples (about as
/// many log-probabilities as the shape has elements), rank 3 {T - 16, N, C}. Lengths and
/// labels come from the domains (input 8..16, target 0..3, labels 1..4), so
/// every case is feasible (finite loss) and blank 0 or 5 is never a label.
std::optional<SampleShapes> ctc_samples(bool backward, const Shape& shape, const Attrs& attrs) {
  int64_t T = 16, N = 1, C = 6, S = 3;
  bool batched = true;
  if (shape.size() == 1 && shape[0] >= 1 && shape[0] <= 8) batched = false, C = 6 + shape[0];
  else if (shape.size() == 1 && shape[0] <= 2048) N = shape[0] / 16 + (shape[0] == 0 ? 0 : 1);
  else if (shape.size() == 2) T = 16 + shape[0] % 7, N = shape[0] == 0 ? 0 : std::max<int64_t>(shape[0] / 16, 1), C = std::max<int64_t>(shape[1], 6), S = 3 + shape[1] % 3;
  else if (shape.size() == 3) T = 16 + shape[0], N = shape[1], C = std::max<int64_t>(shape[2], 6), S = 3 + shape[2] % 4;
  else return std::nullopt;
  SampleShapes s;
  if (backward) s.inputs.push_back(attrs.get("reduction", 1) == 0 && batched ? Shape{N} : Shape{});
  s.inputs.push_back(batched ? Shape{T, N, C} : Shape{T, C});
  s.inputs.push_back(batched ? Shape{N, S} : Shape{S});
  s.inputs.push_back(batched ? Shape{N} : Shape{});
  s.inputs.push_back(batched ? Shape{N} : Shape{});
  return s;
}

void add_ctc_op(std::vector<OpInfo>& ops, bool backward) {
  OpInfo info;
  info.name = backward ? "ctc_loss_backward" : "ctc_loss";
  info.category = OpCategory::loss;
  info.family = "ctc_loss";
  info.direction = backward ? Direction::backward : Direction::forward;
  info.gradient = backward ? "ctc_loss" : "ctc_loss_backward";
  info.input_names = backward ? kBackwardInputs : kForwardInputs;
  info.output_names = {backward ? "grad_log_probs" : "out"};
  info.dtypes = backward ? dtypes_of<FloatTypes>() : dtypes_of<LossTypes>();
  info.attrs = {{"reduction", 1, "0 none, 1 mean (each loss over its target length, then over the batch), 2 sum"},
                {"blank", 0, "the blank class"},
                {"zero_infinity", 0, "1: infinite losses (no feasible alignment) and their gradients become 0"}};
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = backward ? "gradient of ctc_loss with respect to the log-probabilities (torch's ctc_loss_backward)"
                      : "connectionist temporal classification loss of log-probabilities [T, N, C] against padded "
                        "[N, S] or concatenated targets";
  info.input_dtypes = [backward](DType primary) {
    std::vector<DType> d{primary, DType::i64, DType::i64, DType::i64};
    if (backward) d.insert(d.begin(), primary);
    return d;
  };
  info.domains = {Domain{-3, -0.2}, Domain{1, 4, false, false, true}, Domain{8, 16, false, false, true},
                  Domain{0, 3, false, false, true}};
  if (backward) info.domains.insert(info.domains.begin(), Domain{-1, 1});
  info.tolerance_scale = 8;
  info.in_place = false;
  info.sample_attrs = {Attrs{{"reduction", 0}}, Attrs{{"reduction", 1}}, Attrs{{"reduction", 2}},
                       Attrs{{"reduction", 1}, {"blank", 5}}, Attrs{{"reduction", 0}, {"zero_infinity", 1}}};
  info.sample_shapes = [backward](DType, const Shape& shape, const Attrs& attrs) {
    return ctc_samples(backward, shape, attrs);
  };
  info.infer = [backward](const OpDesc& partial) { return infer_ctc(backward, partial); };
  const size_t index = ops.size();
  info.make_plan = [backward, index](Backend backend, const Stream&, const OpDesc& desc,
                                     const PlanPreference&) -> Result<PlanPtr> {
    auto full = infer_ctc(backward, desc);
    if (!full) return full.status();
    const DType t = full->inputs[backward ? 1 : 0].dtype;
    Fn fn = (backend == Backend::host_reference ? host_ctc() : cuda_ctc()).find(launch_key("ctc_loss", t));
    if (!fn) return unsupported("no ", backend_name(backend), " kernel for ctc_loss ", dtype_name(t));
    return PlanPtr(std::make_unique<CtcPlan>(registry()[index], std::move(*full), backend, fn, backward));
  };
  ops.push_back(std::move(info));
}

}  // namespace
}  // namespace loss::ctc

void register_ctc_ops(std::vector<OpInfo>& ops) {
  loss::ctc::add_ctc_op(ops, false);
  loss::ctc::add_ctc_op(ops, true);
}

}  // namespace baracuda
