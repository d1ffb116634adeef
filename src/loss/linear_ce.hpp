// Fused linear + cross-entropy (linear_cross_entropy, linear_cross_entropy_fused):
// loss = cross_entropy(input @ weight^T + bias, target) without the whole [N, V]
// logits. The CUDA plan walks chunks of rows: the `linear` plan writes a chunk's
// logits into the workspace, the cross_entropy row kernel turns them in place
// into dlogits, and GEMM plans add the chunk's share of the gradients. These
// helpers are the small kernels around that loop (see Note [Linear CE chunks]).
#pragma once

#include <cstdint>

#include "core/errors.hpp"

struct CUstream_st;

namespace baracuda::loss::lce {

/// One helper launch. `stats` (W = f32, f64 for f64): [0] the gradient scale
/// (1 / kept for mean, else 1; times grad_output when given), [1] kept: the rows not ignored, or with
/// class weights the sum of their targets' weights.
struct Helper {
  enum class Stage : uint8_t { prepare, finish, store } stage = Stage::prepare;
  int reduction = 1;  ///< 0 none, 1 mean, 2 sum
  int64_t ignore_index = -100;
  void* stats = nullptr;
  // prepare: count the targets kept (or sum their class weights); write `ones` ones (T) for the bias gradient GEMM.
  const void* target = nullptr;
  int64_t target_stride = 0, rows = 0;
  const void* class_weight = nullptr;  ///< T [classes], or nullptr (none)
  int64_t class_weight_stride = 0, classes = 0;
  void* ones = nullptr;
  int64_t ones_count = 0;
  // prepare, fp8 storage (Note [fp8 linear CE]): the bias as bf16 and the class weights as f32
  // (contiguous, [classes]; either null when absent), and two f32 ones, scaled_mm's unit scales.
  const void* bias = nullptr;
  int64_t bias_stride = 0;
  void* wide_bias = nullptr;
  void* wide_class_weight = nullptr;
  void* unit_scales = nullptr;
  const void* grad_output = nullptr;  ///< a T scalar (the backward of mean or sum), or nullptr
  // finish: out (T scalar) = the sum of row_loss[rows] (W, contiguous), over the rows kept for mean.
  const void* row_loss = nullptr;
  void* out = nullptr;
  // store: dst[i * s0 + j * s1] (T) = src[i * n1 + j] (f32, contiguous: the
  // gradients summed in f32), or 0 where src is null (the gradients of zero rows).
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t n0 = 0, n1 = 0, s0 = 0, s1 = 0;
};

using HelperFn = Status (*)(const Helper&, CUstream_st*);

}  // namespace baracuda::loss::lce
