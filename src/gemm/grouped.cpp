// Grouped GEMM ops: grouped_mm (torch._grouped_mm: 2D x 3D split by row
// offsets, 3D x 3D, 2D x 2D split by K offsets, 3D x 2D split by column
// offsets) and grouped_mm_backward. Each binds to one or two
// GroupedProblems (3D x 2D as the transposed 2D x 3D product); the
// candidates are CUTLASS's sm_90a ptr-array kernel (bf16/f16), the bespoke
// CUDA kernels (offsets read on the device only: graph-capturable) and the
// host reference.
#include <algorithm>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "gemm/grouped.hpp"
#include "gemm/problem.hpp"
#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

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
LaunchTable<const CutlassGroupedKernel*>& cutlass_grouped() {
  static LaunchTable<const CutlassGroupedKernel*> table;
  return table;
}

CutlassView cutlass_view(const GroupedProblem& p) {
  CutlassView v;
  constexpr int64_t kVec = 8;  // b16 elements in 16 bytes (TMA's alignment)
  constexpr int64_t kMaxExtent = 0x7fffffff;
  auto fail = [&](const char* why) {
    v.why = why;
    return v;
  };
  if (p.m > kMaxExtent || p.n > kMaxExtent || p.k > kMaxExtent) return fail("an extent exceeds 2^31 - 1");
  if (p.k == 0 && p.mode != GroupedMode::red) return fail("K is 0 (CUTLASS leaves the accumulators unset)");
  if ((reinterpret_cast<uintptr_t>(p.a.data) | reinterpret_cast<uintptr_t>(p.b.data) |
       reinterpret_cast<uintptr_t>(p.d.data)) % 16 != 0)
    return fail("an operand's base is not 16-byte aligned");
  if (p.a.group % kVec || p.b.group % kVec || p.d.group % kVec)
    return fail("a group stride is not a multiple of 16 bytes");
  // CUTLASS's D is row-major: a column-major D computes D^T = B^T A^T.
  if (p.d.col == 1) v.transpose = false, v.ldd = p.d.row;
  else if (p.d.row == 1) v.transpose = true, v.ldd = p.d.col;
  else return fail("'out' has no unit stride");
  // A (rows x K) and B (K x cols) as CUTLASS sees them, after the transpose.
  const int64_t a_row = v.transpose ? p.b.col : p.a.row, a_k = v.transpose ? p.b.row : p.a.col;
  const int64_t b_k = v.transpose ? p.a.col : p.b.row, b_col = v.transpose ? p.a.row : p.b.col;
  if (a_k == 1) v.a_k_major = true, v.lda = a_row;
  else if (a_row == 1) v.a_k_major = false, v.lda = a_k;
  else return fail("an operand has no unit stride");
  if (b_k == 1) v.b_k_major = true, v.ldb = b_col;
  else if (b_col == 1) v.b_k_major = false, v.ldb = b_k;
  else return fail("an operand has no unit stride");
  if (v.lda % kVec || v.ldb % kVec || v.ldd % kVec || v.lda <= 0 || v.ldb <= 0 || v.ldd <= 0)
    return fail("a leading dimension is not a positive multiple of 16 bytes");
  if (p.mode == GroupedMode::rows) v.split_aligned = p.a.row % kVec == 0 && p.d.row % kVec == 0;
  if (p.mode == GroupedMode::red) v.split_aligned = p.a.col % kVec == 0 && p.b.row % kVec == 0;
  return v;
}

namespace {

const std::vector<std::string> kForwardInputs{"a", "b", "offs"}, kBackwardInputs{"grad_output", "a", "b", "offs"};

/// The op's forms: the problem modes, and 3D x 2D (a [G, M, K] @ b [K, N]
/// split over N by offs -> [M, N]), bound as mode rows of the transposed product.
enum class Form { rows, batch, red, cols };

Form form_of(int rank_a, int rank_b) {
  return rank_a == 3 ? (rank_b == 3 ? Form::batch : Form::cols) : rank_b == 3 ? Form::rows : Form::red;
}

/// The form the operand ranks select, or an error naming the op.
Result<Form> mode_of(const std::string& op, const TensorSpec& a, const TensorSpec& b) {
  const size_t ra = a.shape.size(), rb = b.shape.size();
  if ((ra == 2 || ra == 3) && (rb == 2 || rb == 3)) return form_of(int(ra), int(rb));
  return invalid(op, ": 'a' ", shape_str(a.shape), " and 'b' ", shape_str(b.shape),
                 " must be 2D x 3D (offs over a's rows), 3D x 3D (no offs), 2D x 2D (offs over K) or 3D x 2D "
                 "(offs over b's columns)");
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
    case Form::rows:
      if (offs.shape[0] != sb[0])
        return invalid(op, ": 'offs' must be [", sb[0], "] (one end row per group of 'b' ", shape_str(sb), "), got ",
                       shape_str(offs.shape));
      return TensorSpec{a.dtype, {sa[0], sb[2]}};
    case Form::batch:
      if (sa[0] != sb[0])
        return invalid(op, ": group counts differ: 'a' ", shape_str(sa), ", 'b' ", shape_str(sb));
      if (offs.shape[0] != 0)
        return invalid(op, ": 'offs' must be [0] (absent) for 3D x 3D, got ", shape_str(offs.shape));
      return TensorSpec{a.dtype, {sa[0], sa[1], sb[2]}};
    case Form::red:
      return TensorSpec{a.dtype, {offs.shape[0], sa[0], sb[1]}};
    case Form::cols:
      if (offs.shape[0] != sa[0])
        return invalid(op, ": 'offs' must be [", sa[0], "] (one end column per group of 'a' ", shape_str(sa),
                       "), got ", shape_str(offs.shape));
      return TensorSpec{a.dtype, {sa[1], sb[1]}};
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
  const Form form = form_of(a.rank, b.rank);
  auto add = [&](GroupedMode m, const TensorView& d, const TensorView& x, const TensorView& y) {
    bound.problems[bound.count++] = make_problem(m, d, x, y, offs);
  };
  if (!backward) {
    if (form == Form::cols) add(GroupedMode::rows, transposed(out[0]), transposed(b), transposed(a));  // out^T = b^T @ a[g]^T
    else add(form == Form::rows ? GroupedMode::rows : form == Form::batch ? GroupedMode::batch : GroupedMode::red,
             out[0], a, b);
    return bound;
  }
  const TensorView& g = in[0];
  switch (form) {
    case Form::rows:  // out [M, N] = a [M, K] @ b[g] [K, N]
      add(GroupedMode::rows, out[0], g, transposed(b));
      add(GroupedMode::red, out[1], transposed(a), g);
      break;
    case Form::batch:
      add(GroupedMode::batch, out[0], g, transposed(b));
      add(GroupedMode::batch, out[1], transposed(a), g);
      break;
    case Form::red:  // out[g] [M, N] = a [M, Kg] @ b [Kg, N]
      add(GroupedMode::rows, transposed(out[0]), b, transposed(g));
      add(GroupedMode::rows, out[1], transposed(a), g);
      break;
    case Form::cols:  // out [M, Ng] = a[g] [M, K] @ b [K, Ng]
      add(GroupedMode::red, out[0], g, transposed(b));
      add(GroupedMode::rows, transposed(out[1]), transposed(g), a);
      break;
  }
  return bound;
}

/// `fn` runs the problems, or with `cutlass` set, the problems CUTLASS
/// cannot take (cutlass_view: layouts, base alignment), decided per run.
class GroupedPlan final : public FamilyPlan {
 public:
  GroupedPlan(const OpInfo& info, OpDesc desc, GroupedFn fn, KernelSku sku, bool backward,
              const CutlassGroupedKernel* cutlass = nullptr, int sm_count = 0, size_t workspace = 0)
      : FamilyPlan(info, std::move(desc)), fn_(fn), backward_(backward), cutlass_(cutlass), sm_count_(sm_count) {
    sku_ = sku;
    workspace_ = workspace;
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
    for (int i = 0; i < bound.count; ++i) {  // in stream order: the problems share the workspace
      const GroupedProblem& p = bound.problems[i];
      const bool empty = p.m == 0 || p.n == 0 || p.groups == 0;
      const CutlassView view = cutlass_ && !empty ? cutlass_view(p) : CutlassView{"no CUTLASS"};
      if (!view.why)
        BARACUDA_TRY(cutlass_->run(p, view, workspace.data, sm_count_, stream.cuda_stream()).with_context(info_.name));
      else
        BARACUDA_TRY(fn_(p, stream.cuda_stream()).with_context(info_.name));
    }
    return Status::ok();
  }

 private:
  GroupedFn fn_;
  bool backward_;
  const CutlassGroupedKernel* cutlass_;
  int sm_count_;
};

/// Groups of the problems a descriptor binds to.
int64_t groups_of(const OpDesc& d, bool backward) {
  const size_t first = backward ? 1 : 0;
  const Shape &a = d.inputs[first].shape, &b = d.inputs[first + 1].shape, &offs = d.inputs[first + 2].shape;
  return a.size() == 3 ? a[0] : b.size() == 3 ? b[0] : offs[0];
}

/// The sweep's cases from the output's shape: [M, N] 2D x 3D with 2 to 4
/// groups for even M + N, 3D x 2D split over N for odd M + N; [G, M, N] 3D x
/// 3D for even M, 2D x 2D split over K for odd M. Offsets come from the
/// domain (sorted, 0..7), so the split M or N (raised to 7 where smaller)
/// and the split K stay >= 7.
std::optional<SampleShapes> grouped_samples(bool backward, const Shape& shape) {
  SampleShapes s;
  Shape out = shape;
  if (shape.size() == 2 && shape[0] > 0 && (shape[0] + shape[1]) % 2 == 1) {
    const int64_t m = shape[0], n = std::max<int64_t>(shape[1], 7), g = 2 + (m + n) % 3, k = 1 + (m * 31 + n) % 37;
    s.inputs = {{g, m, k}, {k, n}, {g}};
    out = {m, n};
  } else if (shape.size() == 2 && shape[0] > 0) {
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
  info.backends = {Backend::cutlass, Backend::bespoke_cuda, Backend::host_reference};
  info.doc = backward ? "gradients (grad_a, grad_b) of grouped_mm"
                      : "torch._grouped_mm: a [M, K] @ b [G, K, N] with group g over the rows [offs[g-1], offs[g]) "
                        "(rows past offs[G-1] are zero); a [G, M, K] @ b [G, K, N] with offs [0]; a [M, K] @ "
                        "b [K, N] with group g over K [offs[g-1], offs[g]) -> [G, M, N]; or a [G, M, K] @ b [K, N] "
                        "with group g over the columns [offs[g-1], offs[g]) -> [M, N] (columns past offs[G-1] "
                        "are zero). offs: i32, non-decreasing";
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
    if (backend != Backend::cutlass) return PlanPtr(std::make_unique<GroupedPlan>(self, std::move(*full), fn, sku, backward));
    if (t != DType::bf16 && t != DType::f16) return unsupported("CUTLASS grouped GEMM takes bf16 and f16, not ", dtype_name(t));
    const CutlassGroupedKernel* kernel = cutlass_grouped().find(launch_key("grouped_mm", t));
    if (!kernel) return unsupported("built without the CUTLASS headers or without sm_90a (scripts/carry_cutlass.sh)");
#ifdef BARACUDA_HAS_CUDA
    if (current_sm_version() != 90)
      return unsupported("the CUTLASS grouped GEMM is built for sm_90a, the device is sm_", current_sm_version());
    const int sms = current_sm_count();
#else
    const int sms = 0;
#endif
    const size_t ws = kernel->workspace(std::max<int64_t>(groups_of(*full, backward), 1), sms);
    sku.kernel = kernel->name;
    return PlanPtr(std::make_unique<GroupedPlan>(self, std::move(*full), fn, sku, backward, kernel, sms, ws));
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
