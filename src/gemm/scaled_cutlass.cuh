// scaled_mm's CUTLASS sm_90a kernels: fp8 A [M, K] (K contiguous) x fp8 B
// [K, N] (K contiguous) -> bf16/f16/f32 D [M, N] (row-major), TMA + WGMMA,
// warp-specialised cooperative, persistent. Included by one translation
// unit per scale form (scaled_cutlass_{rowwise,blockwise}.cu), built only
// with the CUTLASS headers (BARACUDA_HAS_CUTLASS).
//
// Note [scaled_mm on CUTLASS]
// - Row-wise scales (scale_a [M, 1], scale_b [1, N]) stay out of the
//   mainloop: CUTLASS's fp8 mainloop (its f32 promotion every 4 WGMMA k-blocks,
//   not the fast-accumulation one) sums A B, and an epilogue visitor tree
//   computes D = scale_b[n] * (scale_a[m] * acc) + bias[n] (a column
//   broadcast of scale_a, row broadcasts of scale_b and the bias).
// - Block-wise scales (DeepSeek's 1 x 128 for A, 128 x 128 for B) change
//   along K: CUTLASS's blockwise fp8 mainloop sums each 128-deep K tile in
//   its own accumulators, then adds them scaled by scale_a[m, kb] *
//   scale_b[kb, n / 128]. The same epilogue runs with null scale vectors
//   (read as 1). Sm90 takes the scales M- and N-major only: scale_a as
//   [ceil(K/128)] rows of M floats (TMA loads it: M and the row stride
//   multiples of 4, a 16-byte base), scale_b as [ceil(K/128)] rows of
//   ceil(N/128) floats. Scales already laid out so (scale_a [M, kb] with
//   strides [1, ld_a], M % 4 == 0; scale_b [kb, nb] row-major: torch's
//   layouts) are read in place; others are repacked into the workspace by a
//   small kernel first (scale_a padded with zero rows to a multiple of 4).
// - CUTLASS has no K = 0 (accumulators unset) and TMA needs 16-byte bases,
//   leading dims and contiguous extents (K, and N of D):
//   cutlass_scaled_fits refuses the rest with the reason, and select's next
//   candidate (the bespoke kernel) runs them.
// - One tile config: 128 x 128 x 128 CTA tiles (the blockwise mainloop's K
//   tile is its scale block), 1 x 2 clusters (A multicast).
#pragma once

#include <algorithm>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/detail/blockwise_scale_layout.hpp>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_compute_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_load_tma_warpspecialized.hpp>
#include <cutlass/epilogue/fusion/sm90_visitor_tma_warpspecialized.hpp>
#include <cutlass/functional.h>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/dispatch_policy.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "core/cuda_check.hpp"
#include "core/dtype_traits.hpp"
#include "gemm/cutlass_element.cuh"
#include "gemm/scaled_cutlass.hpp"

namespace baracuda::gemm::cutlass_scaled_impl {

using namespace cute;
namespace fusion = cutlass::epilogue::fusion;

using TileShape = cute::Shape<_128, _128, _128>;
using ClusterShape = cute::Shape<_1, _2, _1>;
using ProblemShape = cute::Shape<int, int, int, int>;  // M, N, K, L (L = 1)
constexpr int kFp8Align = 16;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

/// D = scale_b[n] * (scale_a[m] * acc) + bias[n]; a null scale reads 1, a null bias 0.
template <class Out, class Bias>
struct ScaledEpilogue {
  using ScaleA = fusion::Sm90ColBroadcast<0, TileShape, float, float, cute::Stride<_1, _0, int64_t>, 1>;
  using ScaleB = fusion::Sm90RowBroadcast<0, TileShape, float, float, cute::Stride<_0, _1, int64_t>, 1>;
  using BiasRow = fusion::Sm90RowBroadcast<0, TileShape, Bias, float, cute::Stride<_0, _1, int64_t>, 1>;
  using ScaledAcc = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::multiplies, float, float, kRound>, ScaleA,
                                    fusion::Sm90AccFetch>;
  using Tree = fusion::Sm90EVT<fusion::Sm90Compute<cutlass::homogeneous_multiply_add, Out, float, kRound>, ScaleB,
                               ScaledAcc, BiasRow>;
  static constexpr int kAlign = 16 / int(sizeof(Out));
  using Collective = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, void, cutlass::layout::RowMajor, kAlign, Out,
      cutlass::layout::RowMajor, kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative, Tree>::CollectiveOp;

  static typename Tree::Arguments arguments(const float* scale_a, const float* scale_b, const Bias* bias) {
    return {{scale_b, 1.f, {}}, {{scale_a, 1.f, {}}, {}, {}}, {bias, Bias(0.f), {}}, {}};
  }
};

/// Block-wise scales: 1 x 128 for A, 128 x 128 for B, M- and N-major.
static_assert(kScaleBlock == 128, "the tile's K and N extents are the scale block");
using BlockScales = cutlass::detail::Sm90BlockwiseScaleConfig<1, 128, 128>;
using LayoutSFA = decltype(BlockScales::deduce_layoutSFA());
using LayoutSFB = decltype(BlockScales::deduce_layoutSFB());

template <class A, class B, class Out, class Bias, bool kBlockwise>
struct Config {
  using EA = typename cutlass_element<A>::type;
  using EB = typename cutlass_element<B>::type;
  using EOut = typename cutlass_element<Out>::type;
  using EBias = typename cutlass_element<Bias>::type;
  using Epilogue = ScaledEpilogue<EOut, EBias>;
  using LayoutA = std::conditional_t<kBlockwise, cute::tuple<cutlass::layout::RowMajor, LayoutSFA>, cutlass::layout::RowMajor>;
  using LayoutB =
      std::conditional_t<kBlockwise, cute::tuple<cutlass::layout::ColumnMajor, LayoutSFB>, cutlass::layout::ColumnMajor>;
  using Schedule = std::conditional_t<kBlockwise, cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8Blockwise,
                                      cutlass::gemm::KernelTmaWarpSpecializedCooperative>;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, EA, LayoutA, kFp8Align, EB, LayoutB, kFp8Align, float,
      TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(
          sizeof(typename Epilogue::Collective::SharedStorage))>,
      Schedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, typename Epilogue::Collective>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
  using StrideA = typename Kernel::StrideA;
  using StrideB = typename Kernel::StrideB;
  using StrideD = typename Kernel::StrideD;
};

constexpr size_t kAlignBytes = 256;
inline size_t round_up(size_t x, size_t to = kAlignBytes) { return (x + to - 1) / to * to; }
BCD_HD int64_t blocks(int64_t n) { return (n + kScaleBlock - 1) / kScaleBlock; }

/// Where the block-wise scales are read: in place, or repacked in the
/// workspace (Note [scaled_mm on CUTLASS]).
struct BlockScaleView {
  const float* sfa = nullptr;
  const float* sfb = nullptr;
  int64_t rows_a = 0;          ///< scale_a's M extent as TMA sees it: a multiple of 4 (CUTLASS's check)
  int64_t ld_a = 0, ld_b = 0;  ///< row strides (over K blocks)
  bool pack_a = false, pack_b = false;
};

/// Bytes of the repacked scales of an M x N x K problem (each part 256-byte aligned).
inline size_t packed_a_bytes(int64_t m, int64_t k) { return round_up(size_t(blocks(k)) * round_up(size_t(m), 4) * 4); }
inline size_t packed_b_bytes(int64_t n, int64_t k) { return round_up(size_t(blocks(k)) * size_t(blocks(n)) * 4); }

/// scale_a is read in place when M-major with M a multiple of 4 and a
/// 16-byte row stride and base (TMA loads it); scale_b when N-major.
inline BlockScaleView block_scale_view(const Problem& p, void* ws) {
  BlockScaleView v;
  const int64_t kb = blocks(p.k), nb = blocks(p.n);
  const ScaleOperand &sa = p.scale_a, &sb = p.scale_b;
  const bool a_in_place = p.m % 4 == 0 && sa.stride == 1 && (kb == 1 || (sa.k_stride % 4 == 0 && sa.k_stride >= p.m)) &&
                          reinterpret_cast<uintptr_t>(sa.data) % 16 == 0;
  v.pack_a = !a_in_place;
  v.rows_a = int64_t(round_up(size_t(p.m), 4));
  v.ld_a = a_in_place && kb > 1 ? sa.k_stride : v.rows_a;
  v.sfa = a_in_place ? static_cast<const float*>(sa.data) : static_cast<const float*>(ws);
  const bool b_in_place = (nb == 1 || sb.stride == 1) && (kb == 1 || sb.k_stride >= nb);
  v.pack_b = !b_in_place;
  v.ld_b = b_in_place && kb > 1 ? sb.k_stride : nb;
  v.sfb = b_in_place ? static_cast<const float*>(sb.data)
                     : reinterpret_cast<const float*>(static_cast<char*>(ws) + packed_a_bytes(p.m, p.k));
  return v;
}

/// Copies scale_a (M x kb, any strides) to [kb][rows_a] (zeros past M) and
/// scale_b (nb x kb) to [kb][nb].
template <class Scale>
__global__ void pack_block_scales(const Problem p, Scale* sfa, int64_t rows_a, Scale* sfb) {
  const int64_t kb = blocks(p.k), nb = blocks(p.n);
  const int64_t tid = int64_t(blockIdx.x) * blockDim.x + threadIdx.x, threads = int64_t(gridDim.x) * blockDim.x;
  const Scale* sa = static_cast<const Scale*>(p.scale_a.data);
  const Scale* sb = static_cast<const Scale*>(p.scale_b.data);
  if (sfa)
    for (int64_t i = tid; i < kb * rows_a; i += threads) {
      const int64_t k = i / rows_a, m = i % rows_a;
      sfa[i] = m < p.m ? sa[m * p.scale_a.stride + k * p.scale_a.k_stride] : Scale(0);
    }
  if (sfb)
    for (int64_t i = tid; i < kb * nb; i += threads) {
      const int64_t k = i / nb, n = i % nb;
      sfb[i] = sb[n * p.scale_b.stride + k * p.scale_b.k_stride];
    }
}

template <class Stride>
Stride packed_stride(int64_t ld, int64_t rows) {
  Stride s{};
  get<0>(s) = ld;
  get<2>(s) = ld * rows;
  return s;
}

template <class Cfg, bool kBlockwise>
typename Cfg::Gemm::Arguments arguments(const Problem* p, int64_t m, int64_t n, int64_t k, int sm_count,
                                        const BlockScaleView& scales) {
  using EA = typename Cfg::EA;
  using EB = typename Cfg::EB;
  using EOut = typename Cfg::EOut;
  using EBias = typename Cfg::EBias;
  typename Cfg::Gemm::Arguments args{};
  args.mode = cutlass::gemm::GemmUniversalMode::kGemm;
  args.problem_shape = ProblemShape{int(m), int(n), int(k), 1};
  const int64_t lda = cutlass_leading_dim(p ? p->a.row_stride : k, m, k);
  const int64_t ldb = cutlass_leading_dim(p ? p->b.col_stride : k, n, k);
  const int64_t ldd = cutlass_leading_dim(p ? p->d.row_stride : n, m, n);
  args.mainloop.ptr_A = p ? reinterpret_cast<const EA*>(p->a.data) : nullptr;
  args.mainloop.dA = packed_stride<typename Cfg::StrideA>(lda, m);
  args.mainloop.ptr_B = p ? reinterpret_cast<const EB*>(p->b.data) : nullptr;
  args.mainloop.dB = packed_stride<typename Cfg::StrideB>(ldb, n);
  if constexpr (kBlockwise) {
    const int kb = int(blocks(k)), nb = int(blocks(n));
    args.mainloop.ptr_SFA = scales.sfa;
    args.mainloop.layout_SFA = make_layout(make_shape(make_shape(_1{}, int(scales.rows_a)), make_shape(_128{}, kb), 1),
                                           make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, int(scales.ld_a)),
                                                       int(scales.ld_a * kb)));
    args.mainloop.ptr_SFB = scales.sfb;
    args.mainloop.layout_SFB = make_layout(make_shape(make_shape(_128{}, nb), make_shape(_128{}, kb), 1),
                                           make_stride(make_stride(_0{}, _1{}), make_stride(_0{}, int(scales.ld_b)),
                                                       int(scales.ld_b * kb)));
    args.epilogue.thread = Cfg::Epilogue::arguments(nullptr, nullptr, p ? reinterpret_cast<const EBias*>(p->bias.data) : nullptr);
  } else {
    args.epilogue.thread = Cfg::Epilogue::arguments(p ? static_cast<const float*>(p->scale_a.data) : nullptr,
                                                    p ? static_cast<const float*>(p->scale_b.data) : nullptr,
                                                    p ? reinterpret_cast<const EBias*>(p->bias.data) : nullptr);
  }
  args.epilogue.ptr_C = nullptr;
  args.epilogue.ptr_D = p ? reinterpret_cast<EOut*>(p->d.data) : nullptr;
  args.epilogue.dD = packed_stride<typename Cfg::StrideD>(ldd, m);
  args.hw_info.device_id = 0;
  args.hw_info.sm_count = sm_count;
  return args;
}

template <class A, class B, class Out, class Bias, bool kBlockwise>
struct Launch {
  using Cfg = Config<A, B, Out, Bias, kBlockwise>;

  static size_t cutlass_bytes(int64_t m, int64_t n, int64_t k, int sm_count) {
    return Cfg::Gemm::get_workspace_size(arguments<Cfg, kBlockwise>(nullptr, m, n, k, sm_count, BlockScaleView{}));
  }
  static size_t scale_bytes(int64_t m, int64_t n, int64_t k) {
    return kBlockwise ? packed_a_bytes(m, k) + packed_b_bytes(n, k) : 0;
  }
  static size_t workspace(int64_t m, int64_t n, int64_t k, int sm_count) {
    return scale_bytes(m, n, k) + cutlass_bytes(m, n, k, sm_count);
  }

  static Status run(const Problem& p, void* ws, size_t ws_bytes, int sm_count, CUstream_st* stream) {
    if (p.m == 0 || p.n == 0) return Status::ok();
    const size_t own = scale_bytes(p.m, p.n, p.k), need = own + cutlass_bytes(p.m, p.n, p.k, sm_count);
    if (ws_bytes < need) return internal_error("scaled_mm: CUTLASS needs ", need, " workspace bytes, got ", ws_bytes);
    if (need && reinterpret_cast<uintptr_t>(ws) % kCutlassAlign != 0)
      return invalid("scaled_mm: the CUTLASS kernel's workspace must be ", kCutlassAlign, "-byte aligned (TMA)");
    BlockScaleView scales;
    if constexpr (kBlockwise) {
      scales = block_scale_view(p, ws);
      if (scales.pack_a || scales.pack_b) {
        constexpr int kThreads = 256;
        const int64_t work = blocks(p.k) * std::max(scales.rows_a, blocks(p.n));
        const unsigned grid = unsigned(std::min<int64_t>((work + kThreads - 1) / kThreads, 1024));
        pack_block_scales<float><<<grid, kThreads, 0, stream>>>(p, scales.pack_a ? const_cast<float*>(scales.sfa) : nullptr,
                                                         scales.rows_a,
                                                         scales.pack_b ? const_cast<float*>(scales.sfb) : nullptr);
        BARACUDA_CUDA_TRY(cudaGetLastError());
      }
    }
    auto args = arguments<Cfg, kBlockwise>(&p, p.m, p.n, p.k, sm_count, scales);
    int device = 0;
    BARACUDA_CUDA_TRY(cudaGetDevice(&device));
    args.hw_info.device_id = device;
    typename Cfg::Gemm gemm;
    if (gemm.can_implement(args) != cutlass::Status::kSuccess)
      return internal_error("scaled_mm: CUTLASS rejects the arguments of ", p.m, " x ", p.n, " x ", p.k);
    void* cutlass_ws = own ? static_cast<void*>(static_cast<char*>(ws) + own) : ws;
    if (gemm.initialize(args, cutlass_ws, stream) != cutlass::Status::kSuccess)
      return internal_error("scaled_mm: CUTLASS initialize failed");
    if (gemm.run(stream) != cutlass::Status::kSuccess) return internal_error("scaled_mm: CUTLASS launch failed");
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

/// The bias a kernel reads: the output's dtype for 16-bit outputs (torch's
/// rule on cuBLASLt), bf16 for f32.
template <class Out>
using BiasOf = std::conditional_t<std::is_same_v<Out, float>, __nv_bfloat16, Out>;

/// Registers the e4m3 x e4m3 kernels of a form for bf16, f16 and f32 outputs.
template <bool kBlockwise>
bool register_kernels(const char* const (&names)[3]) {
  using Fp8 = __nv_fp8_e4m3;
  const CutlassScales form = kBlockwise ? CutlassScales::blockwise : CutlassScales::rowwise;
  int i = 0;
  for_each_type<TypeList<__nv_bfloat16, __half, float>>([&]<class Out>(TypeTag<Out>) {
    using L = Launch<Fp8, Fp8, Out, BiasOf<Out>, kBlockwise>;
    static const CutlassScaledKernel kernel{names[i++], dtype_of<BiasOf<Out>>, &L::workspace, &L::run};
    cutlass_scaled().add(cutlass_scaled_key(form, DType::fp8_e4m3, DType::fp8_e4m3, dtype_of<Out>), &kernel);
  });
  return true;
}

}  // namespace baracuda::gemm::cutlass_scaled_impl
