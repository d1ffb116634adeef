// Tile sizes of the bespoke CUDA attention kernels and the shared memory
// they need, visible to the plan (which refuses what a device cannot hold).
#pragma once

#include <cstddef>
#include <cstdint>

namespace baracuda::attn::tiles {

constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kMaxDim = 256;          ///< head_dim and value_dim
constexpr int kRowsPerWarp = 2;       ///< forward and dQ: rows of a warp
constexpr int kRows = kWarps * kRowsPerWarp;
constexpr int kKeys = 32;             ///< forward and dQ: keys per tile (one per lane)
constexpr int kRowsBwd = 32;          ///< dK/dV: query rows per tile (one per lane)
/// dK/dV: keys each warp owns (f64 keeps fewer: its accumulators are twice the registers).
constexpr int keys_per_warp(size_t acc_bytes) { return acc_bytes == 8 ? 2 : 4; }

inline size_t forward_smem(int64_t d, int64_t dv, size_t acc) {
  return acc * size_t(kRows * d + kKeys * (d + 1) + kKeys * dv + kRows * kKeys);
}
inline size_t grad_q_smem(int64_t d, int64_t dv, size_t acc) {
  return acc * size_t(kRows * d + kRows * dv + kKeys * (d + 1) + kKeys * (dv + 1) + kRows * kKeys);
}
inline size_t grad_kv_smem(int64_t d, int64_t dv, size_t acc) {
  const int64_t keys = kWarps * keys_per_warp(acc);
  return acc * size_t(keys * d + keys * dv + kRowsBwd * (d + 1) + kRowsBwd * (dv + 1) + 2 * kRowsBwd);
}

}  // namespace baracuda::attn::tiles
