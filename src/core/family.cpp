#include "core/family.hpp"

#include "core/errors.hpp"
#include "core/tensor_util.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#endif

namespace baracuda {

Status check_float_storage(const std::string& op, DType t, bool gradient) {
  if (t == DType::f32 || t == DType::f16 || t == DType::bf16 || t == DType::f64 || (is_fp8(t) && !gradient))
    return Status::ok();
  return unsupported(op, ": dtype ", dtype_name(t), " is not supported (f32 f16 bf16 f64",
                     gradient ? "; fp8 forwards have no gradient)" : " fp8_e4m3 fp8_e5m2)");
}

KernelSku bespoke_sku(OpCategory category, const char* op, DType element, Backend backend) {
  KernelSku sku;
  sku.category = category;
  sku.op = op;
  sku.element = element;
  sku.layout = Layout::any_strided;
  sku.backend = backend;
#ifdef BARACUDA_HAS_CUDA
  sku.arch = backend == Backend::host_reference ? 0 : current_sm_version();
#endif
  sku.precision = bespoke_precision(element, backend);
  return sku;
}

PrecisionGuarantee bespoke_precision(DType element, Backend backend, std::optional<DType> exact_accumulator) {
  PrecisionGuarantee g;
  if (exact_accumulator) {
    g.math = MathPrecision::exact;
    g.accumulator = *exact_accumulator;
  } else {
    g.accumulator = math_dtype(element, backend);
    g.math = g.accumulator == DType::f64 ? MathPrecision::f64 : MathPrecision::f32;
  }
  g.bit_stable_on_same_hardware = true;
  g.deterministic = true;  // fixed summation orders, no float atomics
  return g;
}

Status check_workspace(std::string_view op, const Workspace& workspace, size_t needed) {
  if (workspace.bytes >= needed) return Status::ok();
  return Status::too_small(ErrorKind::workspace_too_small, needed, workspace.bytes,
                           cat(op, ": workspace of ", workspace.bytes, " bytes, needs ", needed));
}

ProbeViews::ProbeViews(const OpDesc& desc) {
  uintptr_t address = uintptr_t(1) << 40;  // 2^36 bytes apart: no two operands overlap
  auto view = [&](const TensorSpec& s) {
    auto v = TensorView::contiguous(reinterpret_cast<void*>(address), s.dtype, s.shape);
    address += uintptr_t(1) << 36;
    return *v;
  };
  for (const auto& s : desc.inputs) inputs.push_back(view(s));
  for (const auto& s : desc.outputs) outputs.push_back(view(s));
}

Status FamilyPlan::can_implement(const OpArgs& args) const {
  return check_args(info_.name, args, desc_, info_.input_names, info_.output_names);
}

Status FamilyPlan::check_run(const Workspace& workspace, const OpArgs& args) const {
  BARACUDA_TRY(can_implement(args));
  return check_workspace(info_.name, workspace, workspace_);
}

}  // namespace baracuda
