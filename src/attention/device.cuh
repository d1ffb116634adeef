// Device pieces every attention kernel shares (flash forward/backward and
// decoding): -inf of the math type, warp reductions, a row's lse, the
// mma.sync / ldmatrix wrappers and the dynamic shared memory opt-in
// (cp.async: core/cuda_async.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "core/cuda_async.cuh"
#include "core/cuda_check.hpp"

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

/// A row's lse in natural log from its running max m and sum l (log2 units); -inf for a row that saw no key.
__device__ __forceinline__ float row_lse(float m, float l) {
  return l > 0 ? (m + log2f(l)) * 0.6931471805599453f : -INFINITY;
}

// Programmatic dependent launch (sm_90): a kernel may let the next one in the
// stream (launched with programmatic stream serialization) start early; that
// one waits in wait_for_prerequisite_grid until the first grid has finished
// and its writes are visible, instead of paying its launch after the drain.
__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_prerequisite_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------- tensor cores (mma.sync, sm_80+)

/// Four 8x8 b16 matrices; lanes 8m..8m+7 give the row addresses of matrix m.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)) : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)) : "memory");
}

/// c += a (16x16, row) * b (16x8, col), f32 accumulators.
template <class T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, __half>)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

/// 2^x on the special-function unit (ex2.approx; 2^-inf = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/// tanh(x) = 1 - 2 / (2^(2 x log2 e) + 1) on the special-function unit
/// (ex2.approx, rcp.approx): absolute error about 2^-22, so a softcap's
/// score cap tanh(.) is off by about cap 2^-22 (tanh.approx's 2^-11 relative
/// would move a probability by up to cap 2^-11). Saturates to +-1.
__device__ __forceinline__ float fast_tanh(float x) {
  return 1.f - __fdividef(2.f, fast_exp2(x * 2.8853900817779268f) + 1.f);
}

/// Two floats as one register of two f16/bf16 (the first in the low half).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __half>) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  } else {
    const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&h);
  }
}

/// The device buffers of a self-test kernel (wgmma, TMA probes): inputs
/// copied up, outputs poisoned until written, all freed with the object.
class ProbeBuffers {
 public:
  ProbeBuffers() = default;
  ProbeBuffers(const ProbeBuffers&) = delete;
  ProbeBuffers& operator=(const ProbeBuffers&) = delete;
  ~ProbeBuffers() {
    for (void* ptr : buffers_) (void)cudaFree(ptr);
  }
  /// A device copy of `host`.
  template <class V>
  Status upload(V*& device, const std::vector<V>& host) {
    BARACUDA_TRY(allocate(device, host.size()));
    BARACUDA_CUDA_TRY(cudaMemcpy(device, host.data(), host.size() * sizeof(V), cudaMemcpyHostToDevice));
    return Status::ok();
  }
  /// `count` elements whose bytes are 0xff (NaN in f32) until the kernel writes them.
  template <class V>
  Status poisoned(V*& device, size_t count) {
    BARACUDA_TRY(allocate(device, count));
    BARACUDA_CUDA_TRY(cudaMemset(device, 0xff, count * sizeof(V)));
    return Status::ok();
  }
  /// Copies host.size() elements of `device` back.
  template <class V>
  static Status download(std::vector<V>& host, const V* device) {
    BARACUDA_CUDA_TRY(cudaMemcpy(host.data(), device, host.size() * sizeof(V), cudaMemcpyDeviceToHost));
    return Status::ok();
  }

 private:
  template <class V>
  Status allocate(V*& device, size_t count) {
    void* ptr = nullptr;
    BARACUDA_CUDA_TRY(cudaMalloc(&ptr, count * sizeof(V)));
    buffers_.push_back(ptr);
    device = static_cast<V*>(ptr);
    return Status::ok();
  }
  std::vector<void*> buffers_;
};

/// Lets a kernel use `bytes` of dynamic shared memory (above the 48 KiB default).
template <class Kernel>
Status allow_smem(Kernel kernel, size_t bytes) {
  if (bytes <= 48 * 1024) return Status::ok();
  BARACUDA_CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  return Status::ok();
}

/// Runs a self-test kernel(x, y, z, out1, out2) as one block of 128 threads
/// with `smem` bytes of dynamic shared memory: the three inputs copied up,
/// the two f32 outputs poisoned (NaN) until written and copied back.
template <class T, class Kernel>
Status run_probe_kernel(Kernel kernel, size_t smem, const std::vector<T>& x, const std::vector<T>& y,
                        const std::vector<T>& z, std::vector<float>& out1, std::vector<float>& out2) {
  ProbeBuffers buffers;
  T *dx = nullptr, *dy = nullptr, *dz = nullptr;
  float *d1 = nullptr, *d2 = nullptr;
  BARACUDA_TRY(buffers.upload(dx, x));
  BARACUDA_TRY(buffers.upload(dy, y));
  BARACUDA_TRY(buffers.upload(dz, z));
  BARACUDA_TRY(buffers.poisoned(d1, out1.size()));
  BARACUDA_TRY(buffers.poisoned(d2, out2.size()));
  BARACUDA_TRY(allow_smem(kernel, smem));
  kernel<<<1, 128, smem>>>(dx, dy, dz, d1, d2);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  BARACUDA_TRY(ProbeBuffers::download(out1, d1));
  return ProbeBuffers::download(out2, d2);
}

}  // namespace baracuda::attn
