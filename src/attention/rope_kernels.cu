// CUDA kernels of rope / rope_backward and kv_append.
//
// rope: a thread owns one chunk of a head's rotary pairs (or of the
// pass-through tail) for one token, computes the chunk's cos/sin once and
// applies them to a group of heads (heads h, h + groups, ...: a warp's
// accesses stay contiguous). inv_freq sits in shared memory, computed per
// block in f64 (Note [RoPE precision] in rope.hpp). The contiguous path moves
// 16 bytes per access (NeoX: one access in each half; interleaved: one for
// several pairs); any other layout takes the strided path, one pair at a time.
//
// kv_append: a thread copies one chunk of one (sequence, token, head) row to
// its cache slot (16-byte loads when contiguous); tokens whose position or
// block id is out of range are skipped, so nothing outside the cache is
// written. Both grids stride with 64-bit indices.
#include <algorithm>

#include "attention/rope.hpp"
#include "core/cuda_check.hpp"
#include "core/sizes.hpp"

namespace baracuda::rope {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kThreadsPerSm = 2048;  // the resident threads a launch aims to fill
constexpr int64_t kBlocksPerSm = 16;     // grid cap; the grid strides beyond it

template <class T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

/// N elements at p into the math type: one vector load when kVec (p aligned,
/// stride 1), else N loads `stride` apart.
template <bool kVec, class M, class T, int N>
__device__ __forceinline__ void load(const T* p, int64_t stride, M (&out)[N]) {
  if constexpr (kVec) {
    const Pack<T, N> v = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = convert<M>(v.v[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = convert<M>(p[k * stride]);
  }
}

template <bool kVec, class M, class T, int N>
__device__ __forceinline__ void store(T* p, int64_t stride, const M (&in)[N]) {
  if constexpr (kVec) {
    Pack<T, N> v;
#pragma unroll
    for (int k = 0; k < N; ++k) v.v[k] = convert<T>(in[k]);
    *reinterpret_cast<Pack<T, N>*>(p) = v;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) p[k * stride] = convert<T>(in[k]);
  }
}

/// N elements from src to dst converted to Out (vector load and store when kVec).
template <bool kVec, int N, class In, class Out>
__device__ __forceinline__ void copy(const In* src, int64_t src_stride, Out* dst, int64_t dst_stride) {
  if constexpr (kVec) {
    const Pack<In, N> v = *reinterpret_cast<const Pack<In, N>*>(src);
    Pack<Out, N> o;
#pragma unroll
    for (int k = 0; k < N; ++k) o.v[k] = convert<Out>(v.v[k]);
    *reinterpret_cast<Pack<Out, N>*>(dst) = o;
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) dst[k * dst_stride] = convert<Out>(src[k * src_stride]);
  }
}

/// Per-thread work of a rope kernel: kPairs pairs per rotary chunk (NeoX: kPairs
/// elements in each half; interleaved: 2 kPairs adjacent elements); kTail
/// elements per pass-through chunk.
template <class T, bool kInterleaved, bool kVec>
struct RopeShape {
  static constexpr int kVecElems = kVec ? int(16 / sizeof(T)) : 1;
  static constexpr int kPairs = kInterleaved ? std::max(kVecElems / 2, 1) : kVecElems;
  static constexpr int kTail = kVecElems;
};

template <class T, bool kInterleaved, bool kVec>
__global__ void __launch_bounds__(kBlock) rope_kernel(RopeProblem p, int64_t head_groups, int64_t items) {
  using M = math_t<T, false>;
  using S = RopeShape<T, kInterleaved, kVec>;
  constexpr int P = S::kPairs;
  extern __shared__ __align__(16) char smem[];
  double* sInvFreq = reinterpret_cast<double*>(smem);  // [pairs]
  const int64_t pairs = p.pairs();
  for (int64_t i = threadIdx.x; i < pairs; i += kBlock) sInvFreq[i] = p.freq.inv_freq(i);
  __syncthreads();

  const int64_t seq = p.shape[1], heads = p.shape[2];
  const int64_t rot_chunks = pairs / P;
  const int64_t chunks = rot_chunks + (p.copy_tail ? (p.shape[3] - 2 * pairs) / S::kTail : 0);
  const int64_t *ss = p.src_stride, *ds = p.dst_stride;
  for (int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x; t < items; t += int64_t(gridDim.x) * kBlock) {
    const int64_t c = t % chunks, rest = t / chunks;
    const int64_t group = rest % head_groups, token = rest / head_groups;
    const int64_t b = token / seq, s = token % seq;
    const T* x = reinterpret_cast<const T*>(p.src) + b * ss[0] + s * ss[1];
    T* y = reinterpret_cast<T*>(p.dst) + b * ds[0] + s * ds[1];
    if (c < rot_chunks) {
      const int64_t i0 = c * P, pos = p.position(b, s);
      M cs[P], sn[P];
#pragma unroll
      for (int k = 0; k < P; ++k) {
        cos_sin(reduced_angle(pos, sInvFreq[i0 + k]), cs[k], sn[k]);
        if (p.inverse) sn[k] = -sn[k];
      }
      for (int64_t h = group; h < heads; h += head_groups) {
        const T* xh = x + h * ss[2];
        T* yh = y + h * ds[2];
        if constexpr (kInterleaved) {
          M v[2 * P];  // pairs (2i, 2i + 1)
          load<kVec>(xh + 2 * i0 * ss[3], ss[3], v);
#pragma unroll
          for (int k = 0; k < P; ++k) rotate(v[2 * k], v[2 * k + 1], cs[k], sn[k], v[2 * k], v[2 * k + 1]);
          store<kVec>(yh + 2 * i0 * ds[3], ds[3], v);
        } else {
          M lo[P], hi[P];  // pairs (i, i + rotary_dim / 2)
          load<kVec>(xh + i0 * ss[3], ss[3], lo);
          load<kVec>(xh + (i0 + pairs) * ss[3], ss[3], hi);
#pragma unroll
          for (int k = 0; k < P; ++k) rotate(lo[k], hi[k], cs[k], sn[k], lo[k], hi[k]);
          store<kVec>(yh + i0 * ds[3], ds[3], lo);
          store<kVec>(yh + (i0 + pairs) * ds[3], ds[3], hi);
        }
      }
    } else {  // pass-through dims, out of place only
      const int64_t d = 2 * pairs + (c - rot_chunks) * S::kTail;
      for (int64_t h = group; h < heads; h += head_groups)
        copy<kVec, S::kTail>(x + h * ss[2] + d * ss[3], ss[3], y + h * ds[2] + d * ds[3], ds[3]);
    }
  }
}

/// The 16-byte path needs unit dim strides, aligned rows and chunks that
/// tile the rotary and pass-through dims exactly.
template <class T>
bool rope_vector_ok(const RopeProblem& p) {
  constexpr int64_t V = 16 / sizeof(T);
  const int64_t pairs = p.pairs(), dim = p.shape[3];
  if (p.src_stride[3] != 1 || p.dst_stride[3] != 1 || !aligned(p.src, 16) || !aligned(p.dst, 16)) return false;
  for (int a = 0; a < 3; ++a)
    if (p.src_stride[a] % V != 0 || p.dst_stride[a] % V != 0) return false;
  if ((p.interleaved ? 2 * pairs : pairs) % V != 0) return false;
  return !p.copy_tail || (dim - 2 * pairs) % V == 0;
}

template <class T, bool kInterleaved, bool kVec>
Status launch_rope(const RopeProblem& p, CUstream_st* stream) {
  using S = RopeShape<T, kInterleaved, kVec>;
  const int64_t tokens = p.shape[0] * p.shape[1], heads = p.shape[2], pairs = p.pairs();
  const int64_t chunks = pairs / S::kPairs + (p.copy_tail ? (p.shape[3] - 2 * pairs) / S::kTail : 0);
  if (tokens == 0 || heads == 0 || chunks == 0) return Status::ok();
  const int64_t sms = std::max(current_sm_count(), 1);
  // Enough head groups to fill the device; each thread reuses its cos/sin over the rest.
  const int64_t head_groups = std::clamp<int64_t>(ceil_div(sms * kThreadsPerSm, tokens * chunks), 1, heads);
  const int64_t items = tokens * head_groups * chunks;
  const int64_t blocks = std::min(ceil_div(items, kBlock), sms * kBlocksPerSm);
  const size_t smem = size_t(std::max<int64_t>(pairs, 1)) * sizeof(double);  // <= kMaxCudaPairs * 8 = 32 KiB
  rope_kernel<T, kInterleaved, kVec><<<unsigned(blocks), kBlock, smem, stream>>>(p, head_groups, items);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <class T>
struct CudaRope {
  static Status run(const RopeProblem& p, CUstream_st* stream) {
    if (p.pairs() > kMaxCudaPairs) return unsupported("rope: rotary_dim ", p.freq.rotary_dim, " exceeds ", 2 * kMaxCudaPairs);
    const bool vec = rope_vector_ok<T>(p);
    if (p.interleaved) return vec ? launch_rope<T, true, true>(p, stream) : launch_rope<T, true, false>(p, stream);
    return vec ? launch_rope<T, false, true>(p, stream) : launch_rope<T, false, false>(p, stream);
  }
};

// ---------------------------------------------------------------- kv_append

template <class In, class Cache, bool kVec>
__global__ void __launch_bounds__(kBlock) kv_copy_kernel(KvCopy p, int64_t chunks, int64_t items) {
  constexpr int V = kVec ? int(16 / sizeof(In)) : 1;
  const int64_t tokens = p.shape[1], heads = p.shape[2];
  const int64_t *ss = p.src_stride, *ds = p.dst_stride;
  for (int64_t t = int64_t(blockIdx.x) * kBlock + threadIdx.x; t < items; t += int64_t(gridDim.x) * kBlock) {
    const int64_t c = t % chunks, row = t / chunks;
    const int64_t h = row % heads, bt = row / heads;
    const int64_t b = bt / tokens, tok = bt % tokens;
    const Slot r = slot_of(p, b, tok);
    if (r.error != SlotError::none) continue;  // out of range: written nowhere
    const In* x = reinterpret_cast<const In*>(p.src) + b * ss[0] + tok * ss[1] + h * ss[2] + c * V * ss[3];
    Cache* y = reinterpret_cast<Cache*>(p.dst) + r.block * ds[0] + r.slot * ds[1] + h * ds[2] + c * V * ds[3];
    copy<kVec, V>(x, ss[3], y, ds[3]);
  }
}

template <class In, class Cache>
bool kv_vector_ok(const KvCopy& p) {
  constexpr int64_t V = 16 / sizeof(In);
  if (p.src_stride[3] != 1 || p.dst_stride[3] != 1 || p.shape[3] % V != 0) return false;
  if (!aligned(p.src, 16) || !aligned(p.dst, V * sizeof(Cache))) return false;
  for (int a = 0; a < 3; ++a)
    if (p.src_stride[a] % V != 0 || p.dst_stride[a] % V != 0) return false;
  return true;
}

template <class In, class Cache, bool kVec>
Status launch_kv_copy(const KvCopy& p, CUstream_st* stream) {
  constexpr int64_t V = kVec ? 16 / sizeof(In) : 1;
  const int64_t chunks = p.shape[3] / V, items = p.shape[0] * p.shape[1] * p.shape[2] * chunks;
  if (items == 0) return Status::ok();
  const int64_t sms = std::max(current_sm_count(), 1);
  const int64_t blocks = std::min(ceil_div(items, kBlock), sms * kBlocksPerSm);
  kv_copy_kernel<In, Cache, kVec><<<unsigned(blocks), kBlock, 0, stream>>>(p, chunks, items);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

template <class In, class Cache>
struct CudaKvCopy {
  static Status run(const KvCopy& p, CUstream_st* stream) {
    return kv_vector_ok<In, Cache>(p) ? launch_kv_copy<In, Cache, true>(p, stream)
                                      : launch_kv_copy<In, Cache, false>(p, stream);
  }
};

[[maybe_unused]] const bool registered = register_rope_kernels<CudaRope, CudaKvCopy>(cuda_rope(), cuda_kv_copy());

}  // namespace
}  // namespace baracuda::rope
