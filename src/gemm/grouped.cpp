// Grouped GEMM ops: grouped_mm (torch._grouped_mm: 2D x 3D split by row
// offsets, 3D x 3D, 2D x 2D split by K offsets) and grouped_mm_backward.
// Each binds to one or two GroupedProblems; the candidates are the bespoke
// CUDA kernels (offsets read on the device only: graph-capturable) and the
// host reference.
#include <algorithm>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "gemm/grouped.hpp"
#include "gemm/problem.hpp"

namespace baracuda {
namespace gemm {

GroupedTable& host_grouped() {
  static GroupedTable table;
  return table;
}
GroupedTable& cuda_grouped() {
  static GroupedTable table;
  return table;
}

namespace {

const std::vector<std::string> kForwardInputs{"a", "b", "offs"}, kBackwardInputs{"grad_output", "a", "b", "offs"};

/// The mode the operand ranks select, or an error naming the op.
Result<GroupedMode> mode_of(const std::string& op, const TensorSpec& a, const TensorSpec& b) {
  const size_t ra = a.shape.size(), rb = b.shape.size();
  if (ra == 2 && rb == 3) return GroupedMode::rows;
  if (ra == 3 && rb == 3) return GroupedMode::batch;
  if (ra == 2 && rb == 2) return GroupedMode::red;
  return invalid(op, ": 'a' ", shape_str(a.shape), " and 'b' ", shape_str(b.shape),
                 " must be 2D x 3D (offs over a's rows), 3D x 3D (no offs) or 2D x 2D (offs over K)");
}

/// grouped_mm's output for (a, b, offs), after the dtype checks.
Result<TensorSpec> product_spec(const std::string& op, const TensorSpec& a, const TensorSpec& b, const TensorSpec& offs) {
  auto mode = mode_of(op, a, b);
  if (!mode) return mode.status();
  const Shape& sa = a.shape;
  const Shape& sb = b.shape;
  const int64_t ka = sa.back(), kb = sb[sb.size() - 2];
  if (ka != kb)
    return invalid(op, ": 'a' ", shape_str(sa), " and 'b' ", shape_str(sb), " cannot be multiplied (", ka, " != ", kb, ")");
  if (offs.shape.size() != 1) return invalid(op, ": 'offs' must have rank 1, got shape ", shape_str(offs.shape));
  switch (*mode) {
    case GroupedMode::rows:
      if (offs.shape[0] != sb[0])
        return invalid(op, ": 'offs' must be [", sb[0], "] (one end row per group of 'b' ", shape_str(sb), "), got ",
                       shape_str(offs.shape));
      return TensorSpec{a.dtype, {sa[0], sb[2]}};
    case GroupedMode::batch:
      if (sa[0] != sb[0])
        return invalid(op, ": group counts differ: 'a' ", shape_str(sa), ", 'b' ", shape_str(sb));
      if (offs.shape[0] != 0)
        return invalid(op, ": 'offs' must be [0] (absent) for 3D x 3D, got ", shape_str(offs.shape));
      return TensorSpec{a.dtype, {sa[0], sa[1], sb[2]}};
    case GroupedMode::red:
      return TensorSpec{a.dtype, {offs.shape[0], sa[0], sb[1]}};
  }
  return internal_error(op, ": unknown mode");
}

Result<OpDesc> infer_grouped(bool backward, const OpDesc& partial) {
  OpDesc d = partial;
  const std::string op = backward ? "grouped_mm_backward" : "grouped_mm";
  const auto& names = backward ? kBackwardInputs : kForwardInputs;
  const size_t first = backward ? 1 : 0;
  BARACUDA_TRY(check_inputs(op, d, names, first));
  const DType t = d.inputs[first].dtype;
  if (t != DType::f32 && t != DType::f16 && t != DType::bf16 && t != DType::f64)
    return unsupported(op, ": dtype ", dtype_name(t), " is not supported (f32 f16 bf16 f64)");
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const DType want = names[i] == "offs" ? DType::i32 : t;
    if (d.inputs[i].dtype != want)
      return invalid(op, ": '", names[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want));
    if (d.inputs[i].shape.size() > size_t(kMaxRank))
      return invalid(op, ": '", names[i], "' has rank ", d.inputs[i].shape.size(), ", the maximum is ", kMaxRank);
  }
  auto out = product_spec(op, d.inputs[first], d.inputs[first + 1], d.inputs[first + 2]);
  if (!out) return out.status();
  std::vector<TensorSpec> outs{*out};
  if (backward) {
    if (d.inputs[0].shape != out->shape)
      return invalid(op, ": 'grad_output' shape ", shape_str(d.inputs[0].shape), ", expected grouped_mm's output ",
                     shape_str(out->shape));
    outs = {d.inputs[1], d.inputs[2]};
  }
  BARACUDA_TRY(set_outputs(op, d, outs, backward ? std::vector<std::string>{"grad_a", "grad_b"}
                                                 : std::vector<std::string>{"out"}));
  return d;
}

GroupedMat mat(const TensorView& v) {
  const int r = v.rank;
  return {static_cast<char*>(v.data), r == 3 ? v.stride[0] : 0, v.stride[r - 2], v.stride[r - 1]};
}

/// D = A @ B of a mode; `offs` null for batch.
GroupedProblem make_problem(GroupedMode mode, const TensorView& d, const TensorView& a, const TensorView& b,
                            const TensorView& offs) {
  GroupedProblem p;
  p.dtype = a.dtype;
  p.mode = mode;
  p.a = mat(a), p.b = mat(b), p.d = mat(d);
  p.m = a.shape[a.rank - 2], p.k = a.shape[a.rank - 1], p.n = b.shape[b.rank - 1];
  p.groups = mode == GroupedMode::red ? d.shape[0] : b.shape[0];
  if (mode != GroupedMode::batch) p.offs = static_cast<const int32_t*>(offs.data), p.offs_stride = offs.stride[0];
  return p;
}

/// The problems one run computes: the product, or the two gradients.
struct Bound {
  GroupedProblem problems[2];
  int count = 0;
};

Bound bind(bool backward, const OpArgs& args) {
  Bound bound;
  const auto& in = args.inputs;
  const auto& out = args.outputs;
  const size_t first = backward ? 1 : 0;
  const TensorView &a = in[first], &b = in[first + 1], &offs = in[first + 2];
  const GroupedMode mode = a.rank == 3 ? GroupedMode::batch : b.rank == 3 ? GroupedMode::rows : GroupedMode::red;
  if (!backward) {
    bound.problems[bound.count++] = make_problem(mode, out[0], a, b, offs);
    return bound;
  }
  const TensorView& g = in[0];
  auto add = [&](GroupedMode m, const TensorView& d, const TensorView& x, const TensorView& y) {
    bound.problems[bound.count++] = make_problem(m, d, x, y, offs);
  };
  switch (mode) {
    case GroupedMode::rows:  // out [M, N] = a [M, K] @ b[g] [K, N]
      add(GroupedMode::rows, out[0], g, transposed(b));
      add(GroupedMode::red, out[1], transposed(a), g);
      break;
    case GroupedMode::batch:
      add(GroupedMode::batch, out[0], g, transposed(b));
      add(GroupedMode::batch, out[1], transposed(a), g);
      break;
    case GroupedMode::red:  // out[g] [M, N] = a [M, Kg] @ b [Kg, N]
      add(GroupedMode::rows, transposed(out[0]), b, transposed(g));
      add(GroupedMode::rows, out[1], transposed(a), g);
      break;
  }
  return bound;
}

class GroupedPlan final : public FamilyPlan {
 public:
  GroupedPlan(const OpInfo& info, OpDesc desc, GroupedFn fn, KernelSku sku, bool backward)
      : FamilyPlan(info, std::move(desc)), fn_(fn), backward_(backward) {
    sku_ = sku;
  }

  Status can_implement(const OpArgs& args) const override {
    BARACUDA_TRY(FamilyPlan::can_implement(args));
    for (size_t j = 0; j < args.outputs.size(); ++j)
      for (size_t i = 0; i < args.inputs.size(); ++i)
        if (args.outputs[j].numel() > 0 && args.inputs[i].numel() > 0 && memory_overlaps(args.outputs[j], args.inputs[i]))
          return invalid(info_.name, ": output '", info_.output_names[j], "' overlaps input '", info_.input_names[i],
                         "'; a product cannot be written over its operands");
    return Status::ok();
  }

  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(can_implement(args));
    BARACUDA_TRY(check_workspace(info_.name, workspace, workspace_));
    const Bound bound = bind(backward_, args);
    for (int i = 0; i < bound.count; ++i)
      BARACUDA_TRY(fn_(bound.problems[i], stream.cuda_stream()).with_context(info_.name));
    return Status::ok();
  }

 private:
  GroupedFn fn_;
  bool backward_;
};

/// The sweep's cases from the output's shape: [M, N] 2D x 3D with 2 to 4
/// groups; [G, M, N] 3D x 3D for even M, 2D x 2D split over K for odd M.
/// Offsets come from the domain (sorted, 0..7), so M (raised to 7 where
/// smaller) and the split K stay >= 7.
std::optional<SampleShapes> grouped_samples(bool backward, const Shape& shape) {
  SampleShapes s;
  Shape out = shape;
  if (shape.size() == 2 && shape[0] > 0) {
    const int64_t m = std::max<int64_t>(shape[0], 7), n = shape[1], g = 2 + (m + n) % 3, k = 1 + (m * 31 + n) % 37;
    s.inputs = {{m, k}, {g, k, n}, {g}};
    out = {m, n};
  } else if (shape.size() == 3) {
    const int64_t g = shape[0], m = shape[1], n = shape[2], k = 1 + (m * 31 + n) % 37;
    if (m % 2 == 0) s.inputs = {{g, m, k}, {g, k, n}, {0}};
    else s.inputs = {{m, 7 + k}, {7 + k, n}, {g}};
  } else {
    return std::nullopt;
  }
  if (backward) s.inputs.insert(s.inputs.begin(), out);
  return s;
}

void add_grouped_op(std::vector<OpInfo>& ops, bool backward) {
  OpInfo info;
  info.name = backward ? "grouped_mm_backward" : "grouped_mm";
  info.category = OpCategory::gemm;
  info.family = "grouped_gemm";
  info.direction = backward ? Direction::backward : Direction::forward;
  info.gradient = backward ? "grouped_mm" : "grouped_mm_backward";
  info.input_names = backward ? kBackwardInputs : kForwardInputs;
  info.output_names = backward ? std::vector<std::string>{"grad_a", "grad_b"} : std::vector<std::string>{"out"};
  info.dtypes = {DType::f32, DType::f16, DType::bf16, DType::f64};
  info.backends = {Backend::bespoke_cuda, Backend::host_reference};
  info.doc = backward ? "gradients (grad_a, grad_b) of grouped_mm"
                      : "torch._grouped_mm: a [M, K] @ b [G, K, N] with group g over the rows [offs[g-1], offs[g]) "
                        "(rows past offs[G-1] are zero); a [G, M, K] @ b [G, K, N] with offs [0]; or a [M, K] @ "
                        "b [K, N] with group g over K [offs[g-1], offs[g]) -> [G, M, N]. offs: i32, non-decreasing";
  info.input_dtypes = [backward](DType primary) {
    std::vector<DType> d{primary, primary, DType::i32};
    if (backward) d.insert(d.begin(), primary);
    return d;
  };
  info.domains = {Domain{-2, 2}, Domain{-2, 2}, Domain{0, 7, false, false, true, true}};
  if (backward) info.domains.insert(info.domains.begin(), Domain{-1, 1});
  info.tolerance_scale = 8;
  info.in_place = false;
  info.sample_attrs = {Attrs{}};
  info.sample_shapes = [backward](DType, const Shape& shape, const Attrs&) { return grouped_samples(backward, shape); };
  info.infer = [backward](const OpDesc& partial) { return infer_grouped(backward, partial); };
  const size_t index = ops.size();
  info.make_plan = [backward, index](Backend backend, const Stream&, const OpDesc& desc,
                                     const PlanPreference&) -> Result<PlanPtr> {
    auto full = infer_grouped(backward, desc);
    if (!full) return full.status();
    const DType t = full->inputs[backward ? 1 : 0].dtype;
    const OpInfo& self = registry()[index];
    GroupedFn fn = (backend == Backend::host_reference ? host_grouped() : cuda_grouped()).find(launch_key("grouped_mm", t));
    if (!fn) return unsupported("no ", backend_name(backend), " kernel for grouped_mm ", dtype_name(t));
    KernelSku sku = bespoke_sku(OpCategory::gemm, self.name.c_str(), t, backend);
    return PlanPtr(std::make_unique<GroupedPlan>(self, std::move(*full), fn, sku, backward));
  };
  ops.push_back(std::move(info));
}

}  // namespace
}  // namespace gemm

void register_grouped_gemm_ops(std::vector<OpInfo>& ops) {
  gemm::add_grouped_op(ops, false);
  gemm::add_grouped_op(ops, true);
}

}  // namespace baracuda
