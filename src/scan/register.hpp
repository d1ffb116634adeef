// Instantiates the CUDA scan launchers for every op and dtype of a list,
// recorded under "op:dtype" (cumsum_backward: the reversed cumsum).
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/rows.hpp"
#include "scan/ops.hpp"

struct CUstream_st;

namespace baracuda::scan {

/// Threads per block, elements per thread and per tile of the CUDA kernels.
inline constexpr int kBlock = 256, kItems = 8, kTile = kBlock * kItems;

/// Operands: 0 = values out, [1 = indices out], then the input.
struct ScanLaunch {
  rows::RowLaunch rows;
  bool indices = false;
  /// Single pass, one tile per block (see kernels.cuh). Workspace: a ticket
  /// counter (16 bytes), a flag per group, then the group totals at values_offset.
  bool lookback = false;
  int64_t tiles = 1;             ///< tiles per row
  int levels = 0;                ///< group levels: bit_width(tiles)
  int64_t level_base[32] = {};   ///< first group of each level
  int64_t values_offset = 0;     ///< bytes
  void* workspace = nullptr;
};

/// Fills the single-pass layout of `l` for `rows` rows of `cols` elements
/// whose state is `state_bytes`; returns the workspace bytes.
inline size_t plan_lookback(ScanLaunch& l, int64_t rows, int64_t cols, size_t state_bytes) {
  l.lookback = true;
  l.tiles = (cols + kTile - 1) / kTile;
  l.levels = 0;
  while ((int64_t(1) << l.levels) <= l.tiles) ++l.levels;
  int64_t groups = 0;
  for (int k = 0; k < l.levels; ++k) {
    l.level_base[k] = groups;
    groups += rows * (l.tiles >> k);
  }
  l.values_offset = (16 + groups * 4 + 15) / 16 * 16;
  return size_t(l.values_offset) + size_t(groups) * state_bytes;
}

using ScanFn = Status (*)(const ScanLaunch&, CUstream_st*);
using ScanTable = LaunchTable<ScanFn>;
ScanTable& cuda_scans();

/// Output storage: integer and bool sums and products accumulate in i64.
template <class T, bool kWidens>
using scan_out_t = std::conditional_t<kWidens && !is_float_v<T>, int64_t, T>;

/// `Launch<Op, T, Out>::run` for every scan and T of `Types`.
template <template <class, class, class> class Launch, class Types>
bool register_scans(ScanTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    using M = scan_math_t<T>;
    constexpr DType d = dtype_of<T>;
    table.add(launch_key("cumsum", d), &Launch<CumSum<M>, T, scan_out_t<T, true>>::run);
    table.add(launch_key("cumprod", d), &Launch<CumProd<M>, T, scan_out_t<T, true>>::run);
    table.add(launch_key("cummax", d), &Launch<CumExtreme<M, true>, T, T>::run);
    table.add(launch_key("cummin", d), &Launch<CumExtreme<M, false>, T, T>::run);
    if constexpr (is_float_v<T>) {
      table.add(launch_key("logcumsumexp", d), &Launch<LogCumSumExp<M>, T, T>::run);
      table.add(launch_key("cumsum_backward", d), &Launch<CumSum<M>, T, T>::run);
    }
  });
  return true;
}

}  // namespace baracuda::scan
