// Instantiates the CUDA scan launchers for every op and dtype of a list,
// recorded under "op:dtype" (cumsum_backward: the reversed cumsum).
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/rows.hpp"
#include "scan/ops.hpp"

struct CUstream_st;

namespace baracuda::scan {

/// Operands: 0 = values out, [1 = indices out], then the input.
struct ScanLaunch {
  rows::RowLaunch rows;
  bool indices = false;
  int64_t chunks = 1, chunk_len = 0;
  void* workspace = nullptr;  ///< rows x chunks states (chunks > 1)
};

/// Threads per block, elements per thread and per tile of the CUDA kernels.
inline constexpr int kBlock = 256, kItems = 8, kTile = kBlock * kItems;

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
