// scaled_mm's CUTLASS sm_90a candidate (Note [scaled_mm on CUTLASS] in
// scaled_cutlass.cuh): the kernels' interface, which builds without the
// CUTLASS headers, and the host-side check of the layouts they take.
#pragma once

#include "baracuda/core.hpp"
#include "core/launch_table.hpp"
#include "gemm/problem.hpp"

struct CUstream_st;

namespace baracuda::gemm {

/// TMA's alignment: bases, leading dims and contiguous extents in 16 bytes.
inline constexpr int64_t kCutlassAlign = 16;

/// The leading dim CUTLASS gets for a matrix of `outer` rows of `inner`
/// elements stored `stride` apart: a single row takes a packed one.
inline int64_t cutlass_leading_dim(int64_t stride, int64_t outer, int64_t inner) {
  return outer > 1 ? stride : (inner + kCutlassAlign - 1) / kCutlassAlign * kCutlassAlign;
}

/// The two scale forms the CUTLASS kernels serve (per-tensor scales run on cuBLASLt).
enum class CutlassScales : int { rowwise = 0, blockwise = 1 };

/// One CUTLASS kernel: fp8 A x fp8 B -> out with row-wise or block-wise
/// scales and an optional bias (of `bias` dtype). Key cutlass_scaled_key().
struct CutlassScaledKernel {
  const char* name;
  DType bias;  ///< the bias dtype it reads
  /// Exact workspace bytes for an M x N x K problem (CUTLASS's own and, for
  /// block-wise scales, room to repack them).
  size_t (*workspace)(int64_t m, int64_t n, int64_t k, int sm_count);
  /// Runs p (which cutlass_scaled_fits accepted); no allocation, no sync.
  Status (*run)(const Problem& p, void* ws, size_t ws_bytes, int sm_count, CUstream_st* stream);
};
LaunchTable<const CutlassScaledKernel*>& cutlass_scaled();
/// "scaled_mm_cutlass_{rowwise,blockwise}:a:b:out".
std::string cutlass_scaled_key(CutlassScales form, DType a, DType b, DType out);

/// Whether the CUTLASS kernels take the problem's views (TMA: A and B
/// K-contiguous, D row-major, 16-byte leading dims and bases; contiguous
/// row-wise scale vectors and bias); the reason naming the operand if not.
/// Host only, no CUDA call.
Status cutlass_scaled_fits(const Problem& p, CutlassScales form);

}  // namespace baracuda::gemm
