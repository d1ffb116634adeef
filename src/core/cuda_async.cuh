// Asynchronous global -> shared copies (cp.async, sm_80+; a plain 16-byte
// copy below), shared by the kernels that stage operands through shared
// memory (attention, the fused norm backward).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace baracuda {

__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// The "memory" clobbers keep the compiler from moving shared-memory reads of
// a stage across the copy into it or the wait for it.
/// 16 bytes to shared `dst`: the first `src_bytes` (0 to 16) from global
/// `src`, the rest zeros (0 reads nothing: pass any valid address then).
__device__ __forceinline__ void cp_async_16_zfill(void* dst, const void* src, int src_bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(src_bytes)
               : "memory");
#else
  for (int i = 0; i < 16; ++i)
    static_cast<char*>(dst)[i] = i < src_bytes ? static_cast<const char*>(src)[i] : char(0);
#endif
}
/// 16 bytes from global `src` to shared `dst`; `valid` false reads nothing
/// and zero-fills (pass any valid address as `src` then).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  cp_async_16_zfill(dst, src, valid ? 16 : 0);
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

}  // namespace baracuda
