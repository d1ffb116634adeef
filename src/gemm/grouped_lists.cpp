// grouped_gemm: a list of G independent products, each with its own M, N
// and K known on the host (cuBLAS's GemmGroupedBatched, CUTLASS's grouped
// GEMM with host problem sizes), and grouped_gemm_backward. A variadic op
// (OpInfo::variadic): the descriptor lists every group's a, then every
// group's b; out[g] = alpha * a[g] @ b[g] + beta * out[g]. Each group binds
// to a gemm::Problem and runs on the engine of the plan's backend (cuBLASLt,
// the bespoke kernel for any strides, the host reference), in stream order.
//
// Note [A list of products]
// Unlike grouped_mm, whose groups split one operand at offsets read on the
// device, every group here is its own tensors, so the descriptor carries
// each group's shapes and the plan readies its engine for all of them at
// select time (cuBLASLt picks an algorithm per distinct problem over the
// contiguous probe views). A run binds and launches the groups one at a
// time (no host allocation, capturable): G launches, which is what a caller
// looping over mm would make; one launch for every group (CUTLASS's
// ptr-array kernel with the shapes from the host) is the next candidate to
// add.
#include <cmath>

#include "core/errors.hpp"
#include "core/family.hpp"
#include "core/registry_internal.hpp"
#include "core/tensor_util.hpp"
#include "gemm/engine.hpp"

namespace baracuda {
namespace gemm {
namespace {

const std::vector<std::string> kForwardInputs{"a", "b"}, kBackwardInputs{"grad_output", "a", "b"};
const std::vector<std::string> kForwardOutputs{"out"}, kBackwardOutputs{"grad_a", "grad_b"};

const char* op_name(bool backward) { return backward ? "grouped_gemm_backward" : "grouped_gemm"; }

/// Groups of a descriptor with `inputs` inputs, or an error naming the op.
Result<size_t> group_count(bool backward, size_t inputs) {
  const size_t per_group = backward ? kBackwardInputs.size() : kForwardInputs.size();
  if (inputs == 0 || inputs % per_group != 0)
    return invalid(op_name(backward), ": expected ", per_group, " inputs a group (",
                   backward ? "every grad_output, then every a, then every b" : "every a, then every b",
                   ") and at least one group, got ", inputs, " inputs");
  return inputs / per_group;
}

Result<OpDesc> infer_lists(bool backward, const OpDesc& partial) {
  OpDesc d = partial;
  const char* op = op_name(backward);
  auto groups = group_count(backward, d.inputs.size());
  if (!groups) return groups.status();
  const size_t g_count = *groups, first = backward ? g_count : 0;
  const OpInfo& info = *find_op(op);
  const std::vector<std::string> in_names = info.operand_names(true, d.inputs.size());
  const DType t = d.inputs[first].dtype;
  const bool floats = t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64;
  const bool ints = t == DType::i8 || t == DType::i32 || t == DType::i64;
  if (!floats && !(ints && !backward))
    return unsupported(op, ": dtype ", dtype_name(t), " is not supported (",
                       backward ? "f32 f16 bf16 f64" : "f32 f16 bf16 f64 i8 i32 i64", ")");
  const DType out_t = t == DType::i8 ? DType::i32 : t;  // int8 products accumulate into i32 (torch's _int_mm)
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    const DType want = backward && i < g_count ? out_t : t;
    if (d.inputs[i].dtype != want)
      return invalid(op, ": '", in_names[i], "' dtype ", dtype_name(d.inputs[i].dtype), ", expected ", dtype_name(want),
                     " (the dtype of '", in_names[first], "')");
    if (d.inputs[i].shape.size() != 2)
      return invalid(op, ": '", in_names[i], "' must be a matrix (rank 2), got shape ", shape_str(d.inputs[i].shape));
    BARACUDA_TRY(checked_numel(d.inputs[i].shape, cat(op, ": '", in_names[i], "'")).status());
  }
  const double alpha = d.attrs.get("alpha", 1), beta = d.attrs.get("beta", 0);
  if (ints && (alpha != std::trunc(alpha) || beta != std::trunc(beta)))
    return invalid(op, ": alpha and beta must be integers for integer dtypes, got ", alpha, " and ", beta);
  std::vector<TensorSpec> outs(backward ? 2 * g_count : g_count);
  for (size_t g = 0; g < g_count; ++g) {
    const TensorSpec &a = d.inputs[first + g], &b = d.inputs[first + g_count + g];
    if (a.shape[1] != b.shape[0])
      return invalid(op, ": 'a[", g, "]' ", shape_str(a.shape), " and 'b[", g, "]' ", shape_str(b.shape),
                     " cannot be multiplied (", a.shape[1], " != ", b.shape[0], ")");
    const TensorSpec product{out_t, {a.shape[0], b.shape[1]}};
    if (!backward) {
      outs[g] = product;
      continue;
    }
    if (d.inputs[g].shape != product.shape)
      return invalid(op, ": 'grad_output[", g, "]' shape ", shape_str(d.inputs[g].shape),
                     ", expected the product's ", shape_str(product.shape));
    outs[g] = a, outs[g_count + g] = b;
  }
  BARACUDA_TRY(set_outputs(op, d, outs, info.operand_names(false, outs.size())));
  return d;
}

/// Calls `fn(problem, k)` for each problem of a run, in order: output k,
/// out[g] (or grad_a[g], then every grad_b[g]), bound to its operands.
template <class F>
Status for_each_problem(bool backward, const OpDesc& desc, const OpArgs& args, F&& fn) {
  const auto& in = args.inputs;
  const auto& out = args.outputs;
  const size_t groups = out.size() / (backward ? 2 : 1), first = backward ? groups : 0;
  const double alpha = desc.attrs.get("alpha", 1), beta = desc.attrs.get("beta", 0);
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t g = k % groups;
    const TensorView &a = in[first + g], &b = in[first + groups + g], &d = out[k];
    Result<Problem> p = backward && k < groups ? bind_product(d, in[g], transposed(b))  // grad_a = grad @ b^T
                        : backward             ? bind_product(d, transposed(a), in[g])  // grad_b = a^T @ grad
                        : beta != 0            ? bind_product(d, a, b, d)               // out read as C
                                               : bind_product(d, a, b);
    if (!p) return p.status();
    p->alpha = alpha, p->beta = backward ? 0 : beta;
    BARACUDA_TRY(fn(*p, k));
  }
  return Status::ok();
}

class ListPlan final : public FamilyPlan {
 public:
  ListPlan(const OpInfo& info, OpDesc desc, std::unique_ptr<const Engine> engine, KernelSku sku, bool backward)
      : FamilyPlan(info, std::move(desc)), engine_(std::move(engine)), backward_(backward),
        input_names_(info.operand_names(true, desc_.inputs.size())),
        output_names_(info.operand_names(false, desc_.outputs.size())) {
    sku_ = sku;
    workspace_ = engine_->workspace();
  }

  Status can_implement(const OpArgs& args) const override {
    BARACUDA_TRY(check_shared(args));
    return for_each_problem(backward_, desc_, args, [&](const Problem& p, size_t k) {
      Status s = engine_->supports(p);
      if (!s) s.with_context(cat(info_.name, " on ", backend_name(sku_.backend), ", output '", output_names_[k], "'"));
      return s;
    });
  }

  /// The engine's layout check is left to engine->run (as GemmPlan does).
  Status run(const Stream& stream, Workspace workspace, const OpArgs& args) const override {
    BARACUDA_TRY(check_shared(args));
    BARACUDA_TRY(check_workspace(info_.name, workspace, workspace_));
    return for_each_problem(backward_, desc_, args, [&](const Problem& p, size_t k) {
      Status s = engine_->run(p, workspace, stream.cuda_stream());
      if (!s) s.with_context(cat(info_.name, ", output '", output_names_[k], "'"));  // (built on failure only)
      return s;
    });
  }

 private:
  /// The shared argument checks under the groups' names; no output over any input.
  Status check_shared(const OpArgs& args) const {
    BARACUDA_TRY(check_args(info_.name, args, desc_, input_names_, output_names_));
    return for_each_overlap(args.outputs, args.inputs, [&](size_t j, size_t i) {
      return invalid(info_.name, ": output '", output_names_[j], "' overlaps input '", input_names_[i],
                     "'; a product cannot be written over its operands");
    });
  }

  std::unique_ptr<const Engine> engine_;
  bool backward_;
  std::vector<std::string> input_names_, output_names_;
};

/// cuBLASLt readied for every group's contiguous layout; marks `sku` with
/// TF32 where asked and cuBLASLt's row-major layout.
Result<std::unique_ptr<Engine>> lt_engine(bool backward, const OpDesc& full, DType in, DType out,
                                          [[maybe_unused]] const PlanPreference& pref,
                                          [[maybe_unused]] KernelSku& sku) {
#ifdef BARACUDA_HAS_CUDA
  LtRequest request;
  request.in = in, request.out = out;
  request.tf32 = pref.allow_tf32 && in == DType::f32;
  request.max_workspace = std::min(pref.max_workspace_bytes, kLtWorkspace);
  ProbeViews probe(full);
  std::vector<Problem> problems;
  BARACUDA_TRY(for_each_problem(backward, full, OpArgs{probe.inputs, probe.outputs}, [&](const Problem& p, size_t) {
    problems.push_back(p);
    return Status::ok();
  }));
  auto lt = make_lt_engine(request, problems);
  if (lt) {
    if (request.tf32) sku.precision.math = MathPrecision::tf32;
    sku.layout = Layout::row_major;
  }
  return lt;
#else
  (void)backward, (void)full, (void)in, (void)out;
  return unsupported("built without CUDA");
#endif
}

Result<PlanPtr> make_list_plan(bool backward, const OpInfo& info, Backend backend, const OpDesc& desc,
                               const PlanPreference& pref) {
  auto full = infer_lists(backward, desc);
  if (!full) return full.status();
  const DType in = full->inputs[backward ? full->outputs.size() / 2 : 0].dtype, out = full->outputs[0].dtype;
  KernelSku sku = product_sku(info.name.c_str(), in, out, backend);
  auto engine =
      backend == Backend::cublaslt ? lt_engine(backward, *full, in, out, pref, sku) : table_engine(backend, in, out);
  if (!engine) return engine.status();
  return PlanPtr(std::make_unique<ListPlan>(info, std::move(*full), std::move(*engine), sku, backward));
}

/// The sweep's cases from a primary shape [M, N]: 1 to 3 groups whose M, N
/// and K all differ (a group of no rows among them), K from 1 to 23.
std::optional<SampleShapes> list_samples(bool backward, const Shape& shape) {
  if (shape.size() != 2) return std::nullopt;
  const int64_t m = shape[0], n = shape[1], groups = 1 + (m + n) % 3;
  std::vector<Shape> a, b, grad;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t mg = g == 2 ? 0 : m + 3 * g, ng = n + 5 * g, kg = 1 + (m * 7 + n * 3 + g * 11) % 23;
    a.push_back({mg, kg}), b.push_back({kg, ng}), grad.push_back({mg, ng});
  }
  SampleShapes s;
  if (backward) s.inputs = grad;
  s.inputs.insert(s.inputs.end(), a.begin(), a.end());
  s.inputs.insert(s.inputs.end(), b.begin(), b.end());
  return s;
}

void add_list_op(std::vector<OpInfo>& ops, bool backward) {
  OpInfo info;
  info.name = op_name(backward);
  info.category = OpCategory::gemm;
  info.family = "grouped_gemm";
  info.direction = backward ? Direction::backward : Direction::forward;
  info.gradient = op_name(!backward);
  info.input_names = backward ? kBackwardInputs : kForwardInputs;
  info.output_names = backward ? kBackwardOutputs : kForwardOutputs;
  info.variadic = true;
  info.dtypes = backward ? std::vector<DType>{DType::f32, DType::f16, DType::bf16, DType::f64}
                         : std::vector<DType>{DType::f32, DType::f16, DType::bf16, DType::f64, DType::i8, DType::i32,
                                              DType::i64};
  info.attrs = {{"alpha", 1, backward ? "grouped_gemm's alpha (scales every gradient)" : "scales every product"}};
  if (!backward)
    info.attrs.push_back({"beta", 0, "scales each out[g] before the product is added (0: out is not read)"});
  info.backends = {Backend::cublaslt, Backend::bespoke_cuda, Backend::host_reference};
  info.doc = backward ? "gradients of grouped_gemm: grad_a[g] = alpha * grad_output[g] @ b[g]^T, grad_b[g] = "
                        "alpha * a[g]^T @ grad_output[g] (inputs: every grad_output, every a, every b)"
                      : "a list of G products with their own M, N and K: out[g] = alpha * a[g] [M_g, K_g] @ b[g] "
                        "[K_g, N_g] + beta * out[g] (inputs: every a, then every b; int8 products into i32)";
  info.input_dtypes = [backward](DType primary) {
    std::vector<DType> d{primary, primary};
    if (backward) d.insert(d.begin(), primary);
    return d;
  };
  info.domains = {Domain{-2, 2}};
  info.tolerance_scale = 8;
  info.in_place = false;
  info.sample_attrs = {Attrs{}, Attrs{{"alpha", -2}}};
  info.sample_shapes = [backward](DType, const Shape& shape, const Attrs&) { return list_samples(backward, shape); };
  info.infer = [backward](const OpDesc& partial) { return infer_lists(backward, partial); };
  const size_t index = ops.size();
  info.make_plan = [backward, index](Backend backend, const Stream&, const OpDesc& desc,
                                     const PlanPreference& pref) -> Result<PlanPtr> {
    return make_list_plan(backward, registry()[index], backend, desc, pref);
  };
  ops.push_back(std::move(info));
}

}  // namespace
}  // namespace gemm

void register_grouped_gemm_list_ops(std::vector<OpInfo>& ops) {
  gemm::add_list_op(ops, false);
  gemm::add_list_op(ops, true);
}

}  // namespace baracuda
