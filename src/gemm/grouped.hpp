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

  /// Rows (mode rows) or K (mode red) that offs split: offs must not exceed it.
  BCD_HD int64_t split_extent() const { return mode == GroupedMode::rows ? m : k; }
};

/// Runs a problem: the host reference (f64; checks offs and fails on
/// decreasing or out-of-range values) or the bespoke CUDA kernels. Key "grouped_mm:dtype".
using GroupedFn = Status (*)(const GroupedProblem&, CUstream_st*);
using GroupedTable = LaunchTable<GroupedFn>;
GroupedTable& host_grouped();
GroupedTable& cuda_grouped();

}  // namespace baracuda::gemm
