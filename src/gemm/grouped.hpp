// Grouped GEMM (torch._grouped_mm, the MoE expert product): G products whose
// extents along M or K come from device offsets, and the launchers that run
// them on the host reference and the bespoke CUDA backend.
#pragma once

#include "baracuda/core.hpp"
#include "core/dtype_traits.hpp"
#include "core/launch_table.hpp"

struct CUstream_st;

namespace baracuda::gemm {

/// How the G products split their operands.
/// - rows  (2D x 3D, MoE forward): A [M, K] rows split by offs, B [G, K, N], D [M, N];
///         rows at or past offs[G-1] are written as zeros.
/// - batch (3D x 3D): A [G, M, K], B [G, K, N], D [G, M, N]; no offs.
/// - red   (2D x 2D, the weight gradient): A [M, K], B [K, N], K split by offs, D [G, M, N];
///         an empty group's D is zeros.
enum class GroupedMode : int { rows = 0, batch = 1, red = 2 };

/// A matrix operand: element strides of its group (0 when shared), row and column.
struct GroupedMat {
  char* data = nullptr;
  int64_t group = 0, row = 0, col = 0;
};

/// D[g] = A[g] @ B[g] over the rows (mode rows) or the K range (mode red) of
/// group g: [offs[g-1], offs[g]) with offs[-1] = 0. `m` and `k` are the
/// extents of A (the whole of them in modes rows and red).
struct GroupedProblem {
  DType dtype = DType::f32;
  GroupedMode mode = GroupedMode::batch;
  int64_t groups = 0, m = 0, n = 0, k = 0;
  GroupedMat a, b, d;
  const int32_t* offs = nullptr;  ///< modes rows and red; `offs_stride` elements apart
  int64_t offs_stride = 1;
  /// Bespoke kernels only: when set, groups g with only[g] == 0 are left to
  /// another kernel (the CUTLASS backend's fallback groups); the zero rows
  /// past the last group are written either way.
  const uint8_t* only = nullptr;

  /// Rows (mode rows) or K (mode red) that offs split: offs must not exceed it.
  BCD_HD int64_t split_extent() const { return mode == GroupedMode::rows ? m : k; }
  /// offs[g] clamped into [0, split_extent()]; offs[-1] = 0 (device side:
  /// Note [Offsets on the device] in grouped_kernels.cu).
  BCD_HD int64_t end_of(int64_t g) const {
    if (g < 0) return 0;
    const int64_t o = offs[g * offs_stride], e = split_extent();
    return o < 0 ? 0 : o > e ? e : o;
  }
};

/// Runs a problem: the host reference (f64; checks offs and fails on
/// decreasing or out-of-range values) or the bespoke CUDA kernels. Key "grouped_mm:dtype".
using GroupedFn = Status (*)(const GroupedProblem&, CUstream_st*);
using GroupedTable = LaunchTable<GroupedFn>;
GroupedTable& host_grouped();
GroupedTable& cuda_grouped();

/// How the CUTLASS kernel takes a problem (Note [CUTLASS grouped GEMM] in
/// grouped_cutlass.cuh): its D is row-major, so a column-major D is computed
/// as D^T = B^T A^T (`transpose`); then A is K- or M-contiguous, B K- or
/// N-contiguous, with 16-byte multiple leading dims. Host only, no CUDA call.
struct CutlassView {
  const char* why = nullptr;  ///< why CUTLASS cannot take the problem; null when it can
  bool transpose = false;
  bool a_k_major = true, b_k_major = true;  ///< after `transpose`
  int64_t lda = 0, ldb = 0, ldd = 0;        ///< after `transpose`
  /// Offsets along the split dim (modes rows and red) always give 16-byte
  /// aligned group starts; else the device checks each group.
  bool split_aligned = true;
};
CutlassView cutlass_view(const GroupedProblem& p);

/// The CUTLASS sm_90a ptr-array grouped GEMM of one dtype (bf16, f16), in
/// builds with the CUTLASS headers. Key "grouped_mm:dtype".
struct CutlassGroupedKernel {
  const char* name;
  /// Workspace bytes for problems of up to `groups` groups (arrays + CUTLASS's own).
  size_t (*workspace)(int64_t groups, int sm_count);
  /// Runs p; groups CUTLASS cannot take (misaligned starts, empty K) go to the
  /// bespoke kernel. `ws` holds workspace(p.groups, sm_count) bytes.
  Status (*run)(const GroupedProblem& p, const CutlassView& view, void* ws, int sm_count, CUstream_st* stream);
};
LaunchTable<const CutlassGroupedKernel*>& cutlass_grouped();

}  // namespace baracuda::gemm
