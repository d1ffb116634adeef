// CUTLASS's element type for each of our CUDA storage types, shared by the
// CUTLASS backends (grouped_cutlass.cuh, scaled_cutlass.cuh).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cutlass/numeric_types.h>

namespace baracuda::gemm {

/// cutlass_element<T>::type: float stays float; the half and fp8 types map
/// to CUTLASS's own, which its collective builders expect.
template <class T>
struct cutlass_element {
  using type = T;
};
template <>
struct cutlass_element<__nv_fp8_e4m3> {
  using type = cutlass::float_e4m3_t;
};
template <>
struct cutlass_element<__nv_fp8_e5m2> {
  using type = cutlass::float_e5m2_t;
};
template <>
struct cutlass_element<__nv_bfloat16> {
  using type = cutlass::bfloat16_t;
};
template <>
struct cutlass_element<__half> {
  using type = cutlass::half_t;
};

}  // namespace baracuda::gemm
