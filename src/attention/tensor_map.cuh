// Tensor maps of attention operands for TMA (the Hopper forward's Q, K and
// V; the Hopper backward's Q and dO, K and V), built on the host at each run.
#pragma once

#include "attention/problem.hpp"

#include <cuda.h>  // CUtensorMap (the driver is reached through the runtime)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace baracuda::attn {

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

/// The driver's cuTensorMapEncodeTiled through the runtime (no link to
/// libcuda), looked up once; null where the driver has none.
inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

/// A tensor map of operand `o` ([batch, heads, seq, d] of T, unit dim
/// stride) with boxes of 64 dims by `rows` rows and the 128-byte swizzle:
/// the layout of issue_swizzled, one column block a box; rows past `seq`
/// and dims past `d` land as zeros. False where TMA cannot take it (strides
/// not positive multiples of 16 bytes under 2^40, a base not 16-byte
/// aligned, no driver entry point).
template <class T>
bool make_tensor_map(CUtensorMap& map, const Operand& o, int64_t batch, int64_t heads, int64_t seq, int64_t d,
                     int rows) {
  const EncodeTiled encode = encode_tiled();
  if (!encode || o.dim != 1 || reinterpret_cast<uintptr_t>(o.data) % 16 || seq >= (int64_t(1) << 31)) return false;
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(seq), cuuint64_t(heads), cuuint64_t(batch)};
  const int64_t strides[3] = {o.seq, o.head, o.batch};
  cuuint64_t bytes[3];
  cuuint64_t extent = cuuint64_t(d) * sizeof(T);  // a stride for a dim of size 1 (never used)
  for (int i = 0; i < 3; ++i) {
    const int64_t b = strides[i] * int64_t(sizeof(T));
    if (dims[i + 1] == 1) {
      bytes[i] = extent;
    } else {
      if (b <= 0 || b % 16 || b >= (int64_t(1) << 40)) return false;
      bytes[i] = cuuint64_t(b);
    }
    extent = bytes[i] * dims[i + 1];
  }
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1}, unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(&map, type, 4, o.data, dims, bytes, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace baracuda::attn
