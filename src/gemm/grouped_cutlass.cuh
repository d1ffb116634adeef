// The CUTLASS sm_90a grouped GEMM backend (bf16/f16, f32 accumulate): our
// setup kernel turns a GroupedProblem and its device offsets into CUTLASS's
// per-group arrays, then one persistent ptr-array kernel (TMA + WGMMA,
// warp-specialised cooperative) computes every group. Included by one
// translation unit per dtype (grouped_cutlass_<dtype>.cu), built only with
// the CUTLASS headers (BARACUDA_HAS_CUTLASS).
//
// Note [CUTLASS grouped GEMM]
// - Problem shapes stay on the device: GroupProblemShape gets the device
//   array and no host copy (host_problem_shapes = nullptr). CUTLASS then
//   (a) skips its host alignment checks (can_implement checks nothing per
//   group), (b) launches a persistent grid of sm_count CTAs (it cannot count
//   tiles), (c) builds its TMA descriptors on the host from a placeholder
//   shape and rewrites shape, strides and base in the per-SM tensormaps
//   (workspace) on the device for each group. So run never syncs and is
//   graph-capturable; the workspace is the arrays below + get_workspace_size.
// - TMA needs 16-byte aligned bases and leading dims. cutlass_view() checks
//   the leading dims and group strides on the host; the setup kernel checks
//   each group's bases on the device. A group it cannot take gets a 0 x 0 x 0
//   problem (no tiles) and a flag in `only`; the bespoke kernel then runs
//   the flagged groups only. CUTLASS also leaves the accumulators unset when
//   K = 0 (ScaleOut::Zero is applied by the first WGMMA), so an empty K range
//   of the K-split form is flagged too (the bespoke kernel writes its zeros).
// - Rows past offs[G-1] (2D x 3D) are zeroed by the setup kernel.
// - D is row-major for CUTLASS: a column-major D (the 3D x 2D form, and
//   transposed outputs) is computed as D^T = B^T A^T.
#pragma once

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "core/cuda_check.hpp"
#include "gemm/cutlass_element.cuh"
#include "gemm/grouped.hpp"

namespace baracuda::gemm::cutlass_grouped_impl {

using ProblemShape = cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>;  // (M, N, K) per group
using Extent = ProblemShape::UnderlyingProblemShape;
using RowMajor = cutlass::layout::RowMajor;
using ColumnMajor = cutlass::layout::ColumnMajor;

/// One kernel: 128 x 256 x 64 CTA tiles, 2 x 1 clusters, cooperative (two
/// consumer warp groups on one tile), 16-byte alignment, D = A @ B.
/// A RowMajor: K-contiguous; B ColumnMajor: K-contiguous (CUTLASS's B is N x K).
template <class T, class LayoutA, class LayoutB>
struct Config {
  using Value = T;
  using E = typename cutlass_element<T>::type;
  static constexpr int kAlign = 16 / sizeof(E);
  using TileShape = cute::Shape<cute::_128, cute::_256, cute::_64>;
  using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, RowMajor*, kAlign, E, RowMajor*, kAlign,
      cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, E, LayoutA*, kAlign, E, LayoutB*, kAlign, float, TileShape,
      ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::InternalStrideA;
  using StrideB = typename Kernel::InternalStrideB;
  using StrideC = typename Kernel::InternalStrideC;
  using StrideD = typename Kernel::InternalStrideD;
};

constexpr size_t kStrideBytes = 32;  // room for any of the stride tuples below
constexpr size_t kAlignBytes = 256;

inline size_t round_up(size_t x) { return (x + kAlignBytes - 1) / kAlignBytes * kAlignBytes; }

/// The per-group arrays at the front of the workspace.
struct Arrays {
  Extent* extents;
  const void** a;
  const void** b;
  void** d;
  char* stride_a;
  char* stride_b;
  char* stride_d;
  uint8_t* only;
  char* cutlass;  ///< CUTLASS's own workspace

  static size_t bytes(int64_t groups) {
    const size_t g = size_t(groups);
    return round_up(g * sizeof(Extent)) + 3 * round_up(g * sizeof(void*)) + 3 * round_up(g * kStrideBytes) +
           round_up(g);
  }
  static Arrays carve(void* ws, int64_t groups) {
    const size_t g = size_t(groups);
    char* at = static_cast<char*>(ws);
    auto take = [&](size_t n) {
      char* p = at;
      at += round_up(n);
      return p;
    };
    Arrays r;
    r.extents = reinterpret_cast<Extent*>(take(g * sizeof(Extent)));
    r.a = reinterpret_cast<const void**>(take(g * sizeof(void*)));
    r.b = reinterpret_cast<const void**>(take(g * sizeof(void*)));
    r.d = reinterpret_cast<void**>(take(g * sizeof(void*)));
    r.stride_a = take(g * kStrideBytes);
    r.stride_b = take(g * kStrideBytes);
    r.stride_d = take(g * kStrideBytes);
    r.only = reinterpret_cast<uint8_t*>(take(g));
    r.cutlass = at;
    return r;
  }
};

/// A packed-by-ld stride tuple: (ld, 1, 0) or (1, ld, 0), whichever mode is dynamic.
template <class Stride>
__device__ __forceinline__ Stride leading(int64_t ld) {
  Stride s{};
  if constexpr (std::is_same_v<std::decay_t<decltype(cute::get<0>(s))>, int64_t>) cute::get<0>(s) = ld;
  else cute::get<1>(s) = ld;
  if constexpr (std::is_same_v<std::decay_t<decltype(cute::get<2>(s))>, int64_t>) cute::get<2>(s) = 0;
  return s;
}

/// One thread per group: its extents, bases and strides (or a flag for the
/// bespoke kernel); every thread then zeroes its share of the rows past the
/// last group (mode rows).
template <class Cfg>
__global__ void setup(const GroupedProblem p, const CutlassView v, const Arrays w) {
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, threads = int64_t(gridDim.x) * blockDim.x;
  const size_t es = sizeof(typename Cfg::E);
  for (int64_t g = tid; g < p.groups; g += threads) {
    const int64_t s = p.mode == GroupedMode::batch ? 0 : p.end_of(g - 1);
    const int64_t e = p.mode == GroupedMode::batch ? 0 : max(p.end_of(g), s);
    int64_t m = p.m, k = p.k;
    const char* a = p.a.data + g * p.a.group * es;
    const char* b = p.b.data + g * p.b.group * es;
    char* d = p.d.data + g * p.d.group * es;
    if (p.mode == GroupedMode::rows) m = e - s, a += s * p.a.row * es, d += s * p.d.row * es;
    if (p.mode == GroupedMode::red) k = e - s, a += s * p.a.col * es, b += s * p.b.row * es;
    const bool aligned = ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
                           reinterpret_cast<uintptr_t>(d)) & 15) == 0;
    const bool work = m > 0 && p.n > 0, take = work && aligned && k > 0;
    w.only[g] = work && !take;
    w.extents[g] = take ? (v.transpose ? Extent{int(p.n), int(m), int(k)} : Extent{int(m), int(p.n), int(k)})
                        : Extent{0, 0, 0};
    w.a[g] = v.transpose ? b : a;
    w.b[g] = v.transpose ? a : b;
    w.d[g] = d;
    reinterpret_cast<typename Cfg::StrideA*>(w.stride_a)[g] = leading<typename Cfg::StrideA>(v.lda);
    reinterpret_cast<typename Cfg::StrideB*>(w.stride_b)[g] = leading<typename Cfg::StrideB>(v.ldb);
    reinterpret_cast<typename Cfg::StrideD*>(w.stride_d)[g] = leading<typename Cfg::StrideD>(v.ldd);
  }
  if (p.mode != GroupedMode::rows) return;
  const int64_t tail = p.groups ? p.end_of(p.groups - 1) : 0, rows = p.m - tail;
  typename Cfg::E* out = reinterpret_cast<typename Cfg::E*>(p.d.data);
  const bool row_fast = p.d.col != 1;  // walk the unit stride
  for (int64_t i = tid; i < rows * p.n; i += threads) {
    const int64_t r = tail + (row_fast ? i % rows : i / p.n), c = row_fast ? i / rows : i % p.n;
    out[r * p.d.row + c * p.d.col] = typename Cfg::E(0.f);
  }
}

template <class Cfg>
typename Cfg::Gemm::Arguments arguments(int64_t groups, int sm_count, const Arrays* w) {
  using E = typename Cfg::E;
  typename Cfg::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGrouped;
  args.problem_shape = {int(groups), w ? w->extents : nullptr, nullptr};
  if (w) {
    args.mainloop = {reinterpret_cast<const E**>(w->a), reinterpret_cast<typename Cfg::StrideA*>(w->stride_a),
                     reinterpret_cast<const E**>(w->b), reinterpret_cast<typename Cfg::StrideB*>(w->stride_b)};
    args.epilogue.ptr_C = nullptr;
    args.epilogue.dC = nullptr;
    args.epilogue.ptr_D = reinterpret_cast<E**>(w->d);
    args.epilogue.dD = reinterpret_cast<typename Cfg::StrideD*>(w->stride_d);
  }
  args.epilogue.thread.alpha = 1.f;
  args.epilogue.thread.beta = 0.f;
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
  return args;
}

template <class Cfg>
size_t cutlass_bytes(int64_t groups, int sm_count) {
  return Cfg::Gemm::get_workspace_size(arguments<Cfg>(groups, sm_count, nullptr));
}

template <class T>
using ConfigKK = Config<T, RowMajor, ColumnMajor>;
template <class T>
using ConfigKN = Config<T, RowMajor, RowMajor>;
template <class T>
using ConfigMK = Config<T, ColumnMajor, ColumnMajor>;
template <class T>
using ConfigMN = Config<T, ColumnMajor, RowMajor>;

template <class T>
size_t workspace_bytes(int64_t groups, int sm_count) {
  const size_t own = std::max({cutlass_bytes<ConfigKK<T>>(groups, sm_count), cutlass_bytes<ConfigKN<T>>(groups, sm_count),
                               cutlass_bytes<ConfigMK<T>>(groups, sm_count), cutlass_bytes<ConfigMN<T>>(groups, sm_count)});
  return Arrays::bytes(groups) + own;
}

template <class Cfg>
Status run_config(const GroupedProblem& p, const CutlassView& v, void* ws, int sm_count, cudaStream_t stream) {
  static_assert(sizeof(typename Cfg::StrideA) <= kStrideBytes && sizeof(typename Cfg::StrideB) <= kStrideBytes &&
                sizeof(typename Cfg::StrideD) <= kStrideBytes);
  const Arrays w = Arrays::carve(ws, p.groups);
  constexpr int kSetupThreads = 256;
  const int64_t tail_work = p.mode == GroupedMode::rows ? p.m * p.n : 0;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(int64_t(sm_count) * 4, (std::max(p.groups, tail_work / 8) + kSetupThreads - 1) / kSetupThreads));
  setup<Cfg><<<unsigned(blocks), kSetupThreads, 0, stream>>>(p, v, w);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  typename Cfg::Gemm gemm;
  auto args = arguments<Cfg>(p.groups, sm_count, &w);
  int device = 0;
  BARACUDA_CUDA_TRY(cudaGetDevice(&device));
  args.hw_info.device_id = device;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess)
    return internal_error("grouped_mm: CUTLASS rejects the grouped arguments");
  if (gemm.initialize(args, w.cutlass, stream) != cutlass::Status::kSuccess)
    return internal_error("grouped_mm: CUTLASS initialize failed");
  if (gemm.run(stream) != cutlass::Status::kSuccess) return internal_error("grouped_mm: CUTLASS launch failed");
  BARACUDA_CUDA_TRY(cudaGetLastError());
  // Groups CUTLASS could not take: the bespoke kernel, flagged groups only.
  if (p.mode == GroupedMode::red || !v.split_aligned) {
    GroupedFn bespoke = cuda_grouped().find(launch_key("grouped_mm", dtype_of<typename Cfg::Value>));
    if (!bespoke) return internal_error("grouped_mm: no bespoke kernel for the CUTLASS fallback groups");
    GroupedProblem rest = p;
    rest.only = w.only;
    BARACUDA_TRY(bespoke(rest, stream));
  }
  return Status::ok();
}

template <class T>
struct Launch {
  static size_t workspace(int64_t groups, int sm_count) { return workspace_bytes<T>(groups, sm_count); }
  static Status run(const GroupedProblem& p, const CutlassView& v, void* ws, int sm_count, CUstream_st* stream) {
    if (v.a_k_major && v.b_k_major) return run_config<ConfigKK<T>>(p, v, ws, sm_count, stream);
    if (v.a_k_major) return run_config<ConfigKN<T>>(p, v, ws, sm_count, stream);
    if (v.b_k_major) return run_config<ConfigMK<T>>(p, v, ws, sm_count, stream);
    return run_config<ConfigMN<T>>(p, v, ws, sm_count, stream);
  }
};

}  // namespace baracuda::gemm::cutlass_grouped_impl
