// Pieces every bespoke family's plans share.
#pragma once

#include <optional>

#include "baracuda/registry.hpp"

namespace baracuda {

/// The sku of a bespoke-family plan: any strided layout; math and
/// accumulation in f64 on the host reference and for f64, f32 otherwise;
/// bitwise deterministic (these families use fixed reduction orders and no
/// float atomics); the arch of the current device for CUDA plans.
KernelSku bespoke_sku(OpCategory category, const char* op, DType element, Backend backend);

/// The fp8 dtypes (e4m3, e5m2).
inline bool is_fp8(DType t) { return t == DType::fp8_e4m3 || t == DType::fp8_e5m2; }

/// The storage a float family takes: f32, f16, bf16, f64, and fp8 for the
/// forwards (computed in f32; fp8 has no gradient ops). An error naming
/// `op`, the dtype and what is taken otherwise.
Status check_float_storage(const std::string& op, DType t, bool gradient);

/// Saved statistics a plan returns (mean, rstd, lse, ...): f32, f64 for f64.
inline DType stat_dtype(DType t) { return t == DType::f64 ? DType::f64 : DType::f32; }

/// Scratch kept in the math type: f64 on the host reference and for f64, f32 otherwise.
inline DType math_dtype(DType t, Backend backend) {
  return backend == Backend::host_reference || t == DType::f64 ? DType::f64 : DType::f32;
}

/// The precision of a bespoke plan (bespoke_sku's): math and accumulation in
/// math_dtype, or exact math accumulating in `exact_accumulator` when given
/// (casts, integer math, max/min, indices); bitwise deterministic.
PrecisionGuarantee bespoke_precision(DType element, Backend backend, std::optional<DType> exact_accumulator = {});

/// Contiguous views of a descriptor's operands at aligned addresses that are
/// never dereferenced: the common layout a vendor library (cuBLASLt's
/// heuristics, cuDNN's graphs) is prepared for at plan time.
struct ProbeViews {
  std::vector<TensorView> inputs, outputs;
  explicit ProbeViews(const OpDesc& desc);
};

/// An error naming `op` unless `workspace` holds `needed` bytes.
Status check_workspace(std::string_view op, const Workspace& workspace, size_t needed);

/// What every bespoke family's plan shares: the descriptor, the sku, the
/// exact workspace size, and can_implement by the shared argument checks
/// (names from the op's registry entry). A plan sets sku_ and workspace_ in
/// its constructor and starts `run` with check_run.
class FamilyPlan : public Plan {
 public:
  FamilyPlan(const OpInfo& info, OpDesc desc) : info_(info), desc_(std::move(desc)) {}
  const OpDesc& desc() const override { return desc_; }
  size_t workspace_size() const override { return workspace_; }
  KernelSku sku() const override { return sku_; }
  Status can_implement(const OpArgs& args) const override;

 protected:
  /// The arguments (can_implement), then the workspace size.
  Status check_run(const Workspace& workspace, const OpArgs& args) const;

  const OpInfo& info_;
  OpDesc desc_;
  KernelSku sku_;
  size_t workspace_ = 0;
};

}  // namespace baracuda
