// Device pieces every attention kernel shares (flash forward/backward and
// decoding): -inf of the math type, warp reductions, and asynchronous
// global -> shared copies (cp.async, sm_80+; a plain 16-byte copy below).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <limits>

namespace baracuda::attn {

template <class Acc>
__device__ __forceinline__ Acc neg_inf() {
  return -std::numeric_limits<Acc>::infinity();
}

template <class Acc>
__device__ __forceinline__ Acc warp_max(Acc v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

template <class Acc>
__device__ __forceinline__ Acc warp_sum(Acc v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The "memory" clobbers keep the compiler from moving shared-memory reads of
// a stage across the copy into it or the wait for it.
/// 16 bytes from global `src` to shared `dst`; `valid` false reads nothing
/// and zero-fills (pass any valid address as `src` then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
#else
  *static_cast<uint4*>(dst) = valid ? __ldg(static_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
/// Waits until at most kPending committed groups of this thread are in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

}  // namespace baracuda::attn
