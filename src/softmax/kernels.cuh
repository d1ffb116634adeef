// CUDA softmax family. Rows along `dim`:
//  - cluster kernel (cluster.cuh): long rows in whole vectors on sm_90,
//    split over the blocks of a thread-block cluster, held in registers;
//  - held rows kernel: rows in whole vectors of up to 2048 vectors (forward)
//    or 64 (backward), held in registers by 1 to 512 threads (Note [Softmax
//    rows in registers]);
//  - rows kernel: TPR threads per row; the row is kept in shared memory (in
//    its storage type) when it fits, so memory is read once and written once
//    (a forward row in whole vectors arrives by cp.async, every load of it in
//    flight at once); otherwise each pass re-reads it (L2 usually holds it);
//  - columns kernel: when the rows are adjacent in memory and a row is
//    strided (softmax over a non-inner dim), one thread per row, so that a
//    warp reads 32 neighbouring rows at once.
#pragma once

#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "core/row_lanes.hpp"
#include "softmax/cluster.cuh"
#include "softmax/ops.hpp"

namespace baracuda::smax {

using rows::RowLaunch;

using rows::kRowCacheBytes;

/// Forward: operand 0 = out, 1 = input. Backward: 0 = grad_input, 1 = grad_output, 2 = output;
/// the gradient is multiplied by `scale`.
template <class Op, class T, bool kBackward, int TPR, int RPB, bool kCache>
__global__ void __launch_bounds__(TPR * RPB) rows_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer,
                                                         math_t<T, false> scale) {
  using M = math_t<T, false>;
  constexpr int kIn = kBackward ? 2 : 1;
  extern __shared__ __align__(16) char cache_bytes[];
  __shared__ M scratch[RPB * (TPR / 32)];
  const rows::RowSlot<TPR, RPB, 3> slot(l, outer);
  const int64_t cols = l.cols;
  T* out = rows::row_operand<T>(l, 0, slot.off);
  const T* in[2] = {rows::row_operand<const T>(l, 1, slot.off),
                    kBackward ? rows::row_operand<const T>(l, 2, slot.off) : nullptr};
  const int64_t so = l.inner.stride[0][0], si[2] = {l.inner.stride[1][0], kBackward ? l.inner.stride[2][0] : 0};
  T* cache[2] = {reinterpret_cast<T*>(cache_bytes) + (threadIdx.x / TPR) * cols * kIn, nullptr};
  cache[1] = cache[0] + cols;
  bool vec = rows::vector_ok<T>(out, so, cols);
  for (int k = 0; k < kIn; ++k) vec = vec && rows::vector_ok<T>(in[k], si[k], cols);
  auto value = [&](int k, int64_t c) -> M {
    if constexpr (kCache) return convert<M>(cache[k][c]);
    else return convert<M>(in[k][c * si[k]]);
  };
  if constexpr (!kBackward) {
    // Half storage rounds far more coarsely than the fast exponential errs
    // (a few f32 ulp), and its rows are bound by arithmetic, not memory.
    constexpr bool kFastExp = sizeof(T) == 2;
    auto expo = [](M v) -> M {
      if constexpr (kFastExp) return __expf(v);
      else return exp(v);
    };
    const M sign = Op::template sign<M>();
    M max = -INFINITY;
    if (kCache && vec && slot.valid) {
      // The whole row in flight at once (cp.async into the cache), then its
      // max from the cache: each thread reads back only the vectors it copied.
      // It took two vectors at a time through registers before (H100, bf16
      // 8192x32768: softmax 2.84 -> 2.97 TB/s, log_softmax 2.87 -> 2.97).
      constexpr int V = rows::kVecOf<T>;
      using P = rows::Vec<T, V>;
      rows::cache_row_async<TPR>(in[0], cols, slot.lane, cache[0]);
      const auto* cached = reinterpret_cast<const P*>(cache[0]);
      for (int64_t i = slot.lane; i < cols / V; i += TPR) {
        const P pack = cached[i];
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const M z = sign * convert<M>(pack.v[e]);
          max = z > max || z != z ? z : max;
        }
      }
    } else if (slot.valid)
      rows::for_row<TPR>(
          in[0], si[0], cols, vec, slot.lane,
          [&](int64_t, T x) {
            const M z = sign * convert<M>(x);
            max = z > max || z != z ? z : max;
          },
          kCache ? cache[0] : nullptr);
    max = rows::row_all_reduce<TPR, RPB>(max, rows::MaxOp{}, scratch);
    // Where the cache holds the math type (f32, f64), the sum pass leaves
    // exp(z - max) in it, so the output pass divides instead of exponentiating
    // again: the same bits, one exponential an element instead of two. Each
    // thread reads back only the elements it wrote (the ownership of for_row).
    constexpr bool kKeepExp = kCache && !Op::kLog && std::is_same_v<T, M>;
    M sum = 0;
    if (slot.valid) {
      if (kCache && vec) {  // the cached row in whole vectors, as this thread stored it
        constexpr int V = rows::kVecOf<T>;
        auto* packs = reinterpret_cast<rows::Vec<T, V>*>(cache[0]);
        for (int64_t i = slot.lane; i < cols / V; i += TPR) {
          auto pack = packs[i];
#pragma unroll
          for (int e = 0; e < V; ++e) {
            const M x = expo(sign * convert<M>(pack.v[e]) - max);
            sum += x;
            if constexpr (kKeepExp) pack.v[e] = x;
          }
          if constexpr (kKeepExp) packs[i] = pack;
        }
      } else {
        for (int64_t c = slot.lane; c < cols; c += TPR) {
          const M x = expo(sign * value(0, c) - max);
          sum += x;
          if constexpr (kKeepExp) cache[0][c] = x;
        }
      }
    }
    sum = rows::row_all_reduce<TPR, RPB>(sum, rows::SumOp{}, scratch);
    const M inverse_sum = M(1) / sum;
    auto out_of = [&](M z) -> M {
      if constexpr (kFastExp && !Op::kLog) return expo(z - max) * inverse_sum;
      else return Op::out(z, max, sum);
    };
    if (slot.valid) {
      const T* src[1] = {kCache ? cache[0] : in[0]};
      const int64_t ss[1] = {kCache ? 1 : si[0]};
      rows::map_row<TPR>(src, ss, out, so, cols, vec, slot.lane,
                         [&](int64_t, const T (&x)[1]) {
                           if constexpr (kKeepExp) return convert<T>(x[0] / sum);
                           else return convert<T>(out_of(sign * convert<M>(x[0])));
                         });
    }
  } else {
    M t = 0;
    if (slot.valid) {
      if (vec && kCache) {
        rows::for_row<TPR>(in[0], 1, cols, true, slot.lane, [&](int64_t, T) {}, cache[0]);
        // The same thread stored element c of grad_output just above.
        rows::for_row<TPR>(
            in[1], 1, cols, true, slot.lane,
            [&](int64_t c, T y) { t += Op::term(convert<M>(cache[0][c]), convert<M>(y)); }, cache[1]);
      } else {
        for (int64_t c = slot.lane; c < cols; c += TPR) {
          const T g = in[0][c * si[0]], y = in[1][c * si[1]];
          if constexpr (kCache) cache[0][c] = g, cache[1][c] = y;
          t += Op::term(convert<M>(g), convert<M>(y));
        }
      }
    }
    t = rows::row_all_reduce<TPR, RPB>(t, rows::SumOp{}, scratch);
    if (slot.valid) {
      const T* src[2] = {kCache ? cache[0] : in[0], kCache ? cache[1] : in[1]};
      const int64_t ss[2] = {kCache ? 1 : si[0], kCache ? 1 : si[1]};
      rows::map_row<TPR>(src, ss, out, so, cols, vec, slot.lane, [&](int64_t, const T (&x)[2]) {
        return convert<T>(Op::grad(convert<M>(x[0]), convert<M>(x[1]), t) * scale);
      });
    }
  }
}

// Note [Softmax rows in registers]
// Forward rows of up to 512 x 4 16-byte vectors (half rows of 16384
// elements, f32 rows of 8192; every operand in whole aligned vectors) are
// held in registers, as the norm forward's are (Note [Norm rows in
// registers] in src/norm/kernels.cuh): each thread holds up to K = 4 of its
// row's vectors, the row's maximum and sum run over registers, and the
// output is written straight from them. The rows kernel above keeps the row
// in shared memory and reads it back twice (H100, bf16 softmax 32768 x 4096:
// 2.83 -> 2.96 TB/s). A row takes the fewest threads, a power of two, that
// hold it: 1 to 32 lanes of a warp (narrow rows: a warp holds 1 to 32 rows,
// reduced by shuffles within their lanes, 128 threads a block) or 128 to 512
// threads (one row a block), at 40 registers (1536 threads an SM); but a row
// of two to four vectors takes two lanes, not one: a lane's 16-byte loads
// 64 bytes apart ran f32 rows of 16 at 1.77 TB/s, two lanes 3.02 (H100). The
// rows kernel gave a warp to each narrow row (bf16 rows of 8: 0.06 TB/s).
// Wider rows keep the rows and cluster kernels: f32 rows of 16384 on 1024
// threads (one block an SM, idle at every barrier) ran at 2.80 TB/s against
// the rows kernel's 3.83 (H200), and half rows of 32768 on one cluster block
// of 512 threads at 2.92 against 3.19. The arithmetic is the rows kernel's:
// half types take the fast exponential, f32 keeps exp(z - max) and divides.
// Backward rows of up to 32 x 2 vectors (two of grad_output and two of the
// output a lane) are held the same way: the rows kernel gave each a warp
// (H100, bf16 rows of 8: 0.10 TB/s, 0.07x torch); wider backward rows
// stream through the rows kernel at 3 TB/s.
/// Forward: operand 0 = out, 1 = input. Backward: 0 = grad_input, 1 =
/// grad_output, 2 = output, the gradient times `scale`.
template <class Op, class T, bool kBackward, int TPR, int K>
__global__ void __launch_bounds__(TPR < 128 ? 128 : TPR, 1536 / (TPR < 128 ? 128 : TPR))
    held_rows_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer, math_t<T, false> scale) {
  using M = math_t<T, false>;
  constexpr int V = rows::kVecOf<T>, RPB = TPR < 128 ? 128 / TPR : 1;
  using P = rows::Vec<T, V>;
  constexpr bool kFastExp = sizeof(T) == 2, kKeepExp = !Op::kLog && std::is_same_v<T, M>;
  __shared__ M scratch[TPR < 128 ? 1 : TPR / 32];
  const rows::RowSlot<TPR, RPB, 3> slot(l, outer);
  // Rows of a warp reduce by shuffles over their own lanes, so a warp's
  // rows past the end still run alongside (nothing loaded or stored).
  if (!slot.valid && TPR >= 32) return;
  const bool live = slot.valid;
  const int64_t cols = l.cols;
  auto col = [&](int k) { return int64_t(k * TPR + slot.lane) * V; };
  auto held = [&](int k) { return live && col(k) < cols; };
  auto row_reduce = [&](M v, auto op) {
    if constexpr (TPR <= 32) {
#pragma unroll
      for (int d = TPR / 2; d >= 1; d /= 2) v = op(v, __shfl_xor_sync(0xffffffffu, v, d));
      return v;
    } else {
      return rows::row_all_reduce<TPR, 1>(v, op, scratch);
    }
  };
  // Half types redo their conversions after each reduction rather than keep them live across it.
  auto forget_conversions = [](P(&x)[K]) {
    if constexpr (!std::is_same_v<T, M>)
#pragma unroll
      for (int k = 0; k < K; ++k) rows::opaque(x[k]);
  };
  auto load = [&](int operand, P(&x)[K]) {
    const T* src = rows::row_operand<const T>(l, operand, slot.off);
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (held(k)) x[k] = *reinterpret_cast<const P*>(src + col(k));
  };
  T* out = rows::row_operand<T>(l, 0, slot.off);
  P x[K];  // forward: the input; backward: grad_output
  load(1, x);
  if constexpr (kBackward) {
    P y[K];
    load(2, y);
    M t = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (held(k))
#pragma unroll
        for (int e = 0; e < V; ++e) t += Op::term(convert<M>(x[k].v[e]), convert<M>(y[k].v[e]));
    t = row_reduce(t, rows::SumOp{});
    forget_conversions(x);
    forget_conversions(y);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!held(k)) continue;
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e)
        o.v[e] = convert<T>(Op::grad(convert<M>(x[k].v[e]), convert<M>(y[k].v[e]), t) * scale);
      rows::store_16(out + col(k), o);
    }
  } else {
    auto expo = [](M v) -> M {
      if constexpr (kFastExp) return __expf(v);
      else return exp(v);
    };
    const M sign = Op::template sign<M>();
    M max = -INFINITY;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (held(k))
#pragma unroll
        for (int e = 0; e < V; ++e) max = rows::MaxOp{}(sign * convert<M>(x[k].v[e]), max);
    max = row_reduce(max, rows::MaxOp{});
    forget_conversions(x);
    M sum = 0;
#pragma unroll
    for (int k = 0; k < K; ++k)
      if (held(k))
#pragma unroll
        for (int e = 0; e < V; ++e) {
          const M p = expo(sign * convert<M>(x[k].v[e]) - max);
          sum += p;
          if constexpr (kKeepExp) x[k].v[e] = p;
        }
    sum = row_reduce(sum, rows::SumOp{});
    forget_conversions(x);
    const M inverse_sum = M(1) / sum;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if (!held(k)) continue;
      P o;
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (kKeepExp) o.v[e] = convert<T>(x[k].v[e] / sum);
        else if constexpr (kFastExp && !Op::kLog)
          o.v[e] = convert<T>(expo(sign * convert<M>(x[k].v[e]) - max) * inverse_sum);
        else o.v[e] = convert<T>(Op::out(sign * convert<M>(x[k].v[e]), max, sum));
      }
      rows::store_16(out + col(k), o);
    }
  }
}

/// Runs rows on held_rows_kernel when they suit it (Note [Softmax rows in
/// registers]): forward rows of up to 512 x 4 vectors, backward rows of up
/// to 32 x 2 (narrow rows; the rows kernel streams wider ones at 3 TB/s);
/// false when they do not.
template <class Op, class T, bool kBackward>
Result<bool> launch_held_softmax(const RowLaunch& l, const rows::OffsetCalc<3, int64_t>& outer,
                                 math_t<T, false> scale, CUstream_st* stream) {
  if constexpr (!std::is_same_v<T, float> && sizeof(T) != 2) {
    return false;
  } else {
    constexpr int K = kBackward ? 2 : 4, V = rows::kVecOf<T>, kMaxThreads = kBackward ? 32 : 512;
    const int64_t vectors = l.cols / V;
    if (l.cols < 1 || vectors > kMaxThreads * K || l.rows < 1 || l.rows > INT32_MAX) return false;
    for (int k = 0; k <= (kBackward ? 2 : 1); ++k)
      if (!rows::rows_in_vectors(l, k, sizeof(T))) return false;
    auto launch = [&]<int TPR>() {
      constexpr int RPB = TPR < 128 ? 128 / TPR : 1;
      held_rows_kernel<Op, T, kBackward, TPR, K>
          <<<unsigned((l.rows + RPB - 1) / RPB), TPR * RPB, 0, stream>>>(l, outer, scale);
    };
    // The fewest threads, a power of two, that hold the row (a warp's lanes:
    // rows::narrow_row_lanes, or 128 to 512).
    if (rows::launch_on_narrow_row_lanes(vectors, K, launch)) {
    } else if constexpr (!kBackward) {
      if (vectors <= 128 * K) launch.template operator()<128>();
      else if (vectors <= 256 * K) launch.template operator()<256>();
      else launch.template operator()<512>();
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return true;
  }
}

/// One thread per row; rows adjacent in memory, elements of a row strided.
template <class Op, class T, bool kBackward>
__global__ void __launch_bounds__(256) columns_kernel(RowLaunch l, rows::OffsetCalc<3, int64_t> outer,
                                                      math_t<T, false> scale) {
  using M = math_t<T, false>;
  const int64_t row = int64_t(blockIdx.x) * 256 + threadIdx.x;
  if (row >= l.rows) return;
  int64_t off[3];
  outer.get(row, off);
  T* out = rows::row_operand<T>(l, 0, off);
  const T* a = rows::row_operand<const T>(l, 1, off);
  const T* b = kBackward ? rows::row_operand<const T>(l, 2, off) : nullptr;
  const int64_t so = l.inner.stride[0][0], sa = l.inner.stride[1][0], sb = kBackward ? l.inner.stride[2][0] : 0;
  if constexpr (!kBackward) {
    const M sign = Op::template sign<M>();
    M max = -INFINITY, sum = 0;
    for (int64_t c = 0; c < l.cols; ++c) {
      const M z = sign * convert<M>(a[c * sa]);
      max = z > max || z != z ? z : max;
    }
    for (int64_t c = 0; c < l.cols; ++c) sum += exp(sign * convert<M>(a[c * sa]) - max);
    for (int64_t c = 0; c < l.cols; ++c) out[c * so] = convert<T>(Op::out(sign * convert<M>(a[c * sa]), max, sum));
  } else {
    M t = 0;
    for (int64_t c = 0; c < l.cols; ++c) t += Op::term(convert<M>(a[c * sa]), convert<M>(b[c * sb]));
    for (int64_t c = 0; c < l.cols; ++c)
      out[c * so] = convert<T>(Op::grad(convert<M>(a[c * sa]), convert<M>(b[c * sb]), t) * scale);
  }
}

template <class Op, class T, bool kBackward>
Status softmax_on_cuda(const RowLaunch& l, const RowParams& p, CUstream_st* stream) {
  const rows::OffsetCalc<3, int64_t> outer(l.outer);
  const math_t<T, false> scale(p.grad_scale);
  const int64_t s = l.inner.stride[1][0];
  if (s != 1 && l.outer.rank >= 1 && l.outer.stride[1][0] == 1 && l.rows >= 1024) {
    columns_kernel<Op, T, kBackward><<<unsigned((l.rows + 255) / 256), 256, 0, stream>>>(l, outer, scale);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
  Result<bool> held = launch_held_softmax<Op, T, kBackward>(l, outer, scale, stream);
  BARACUDA_TRY(held.status());
  if (*held) return Status::ok();
  Result<bool> clustered = launch_clustered_softmax<Op, T, kBackward>(l, outer, scale, stream);
  BARACUDA_TRY(clustered.status());
  if (*clustered) return Status::ok();
  // Halves forward: two rows per SM on long rows, one's arithmetic hides the other's loads.
  return rows::by_row_length(
      l.cols,
      [&]<int TPR, int RPB>() {
        const size_t cache = size_t(RPB) * size_t(l.cols) * (kBackward ? 2 : 1) * sizeof(T);
        return rows::launch_cached(rows_kernel<Op, T, kBackward, TPR, RPB, true>,
                                   rows_kernel<Op, T, kBackward, TPR, RPB, false>, cache,
                                   /*max_carveout=*/2 * cache <= kRowCacheBytes, unsigned((l.rows + RPB - 1) / RPB),
                                   TPR * RPB, stream, l, outer, scale);
      },
      /*narrow_long_rows=*/sizeof(T) == 2 && !kBackward);
}

/// The launcher the tables record (one dtype file each: the build runs in parallel).
template <class Op, class T, bool kBackward>
struct CudaSoftmax {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) {
    return softmax_on_cuda<Op, T, kBackward>(l, p, s);
  }
};

}  // namespace baracuda::smax
