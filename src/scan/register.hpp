// Instantiates the CUDA scan launchers for every op and dtype of a list,
// recorded under "op:dtype"; the gradients are scans of the reversed views
// (Note [Scan gradients as reversed scans] in scan/ops.hpp).
#pragma once

#include <string>

#include "core/launch_table.hpp"
#include "core/fp8_traits.hpp"
#include "core/rows.hpp"
#include "scan/ops.hpp"

struct CUstream_st;

namespace baracuda::scan {

/// Operands: 0 = values out, [1 = indices out], then the input.
struct ScanLaunch {
  rows::RowLaunch rows;
  bool indices = false;
  bool split = false;  ///< rows cut across blocks (single pass, scan/kernels.cuh)
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

/// Threads per block, elements per thread and per tile of the CUDA kernels
/// (the single-pass kernel's tiles hold kTile elements or more).
inline constexpr int kBlock = 256, kItems = 8, kTile = kBlock * kItems;
/// Bytes of the largest scan state.
inline constexpr size_t kMaxStateBytes = 16;
/// Head of the single-pass workspace: the ticket counter.
inline constexpr size_t kTicketBytes = 256;

/// Workspace of the single-pass scan over `rows` rows of `cols` (a bound
/// for every state: two published slots a tile, a flag word and a state each).
constexpr size_t single_pass_workspace(int64_t rows, int64_t cols) {
  const size_t slots = 2 * size_t(rows) * size_t((cols + kTile - 1) / kTile);
  return kTicketBytes + slots * (8 + kMaxStateBytes) + 16;
}

// The operand adapters of the kernels (scan/kernels.cuh).
template <class Op, class T, class Out>
struct ScanIo;
template <class T>
struct CumProdGradIo;
template <class T>
struct LogCumSumExpGradIo;
template <class T>
struct CumExtremeGradIo;

using ScanFn = Status (*)(const ScanLaunch&, CUstream_st*);
using ScanTable = LaunchTable<ScanFn>;
ScanTable& cuda_scans();

/// Output storage: integer and bool sums and products accumulate in i64.
template <class T, bool kWidens>
using scan_out_t = std::conditional_t<kWidens && !is_float_v<T>, int64_t, T>;

/// `Launch<Io>::run` for every scan and T of `Types`.
template <template <class> class Launch, class Types>
bool register_scans(ScanTable& table) {
  for_each_type<Types>([&]<class T>(TypeTag<T>) {
    using M = scan_math_t<T>;
    constexpr DType d = dtype_of<T>;
    table.add(launch_key("cumsum", d), &Launch<ScanIo<CumSum<M>, T, scan_out_t<T, true>>>::run);
    table.add(launch_key("cumprod", d), &Launch<ScanIo<CumProd<M>, T, scan_out_t<T, true>>>::run);
    table.add(launch_key("cummax", d), &Launch<ScanIo<CumExtreme<M, true>, T, T>>::run);
    table.add(launch_key("cummin", d), &Launch<ScanIo<CumExtreme<M, false>, T, T>>::run);
    if constexpr (is_float_v<T>) table.add(launch_key("logcumsumexp", d), &Launch<ScanIo<LogCumSumExp<M>, T, T>>::run);
    if constexpr (has_gradient_v<T>) {
      table.add(launch_key("cumsum_backward", d), &Launch<ScanIo<CumSum<M>, T, T>>::run);
      table.add(launch_key("cumprod_backward", d), &Launch<CumProdGradIo<T>>::run);
      table.add(launch_key("logcumsumexp_backward", d), &Launch<LogCumSumExpGradIo<T>>::run);
      table.add(launch_key("cummax_backward", d), &Launch<CumExtremeGradIo<T>>::run);
      table.add(launch_key("cummin_backward", d), &Launch<CumExtremeGradIo<T>>::run);
    }
  });
  return true;
}

}  // namespace baracuda::scan
