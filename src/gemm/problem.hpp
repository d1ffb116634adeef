// GEMM family: the one problem every op of the family binds to (matmul, mm,
// bmm, addmm, baddbmm, linear and their gradients), and the launchers that
// run it on the host reference and the bespoke CUDA backend.
#pragma once

#include "baracuda/core.hpp"
#include "core/dtype_traits.hpp"
#include "core/launch_table.hpp"

struct CUstream_st;

namespace baracuda::gemm {

/// Pointwise function applied last (linear's `activation`); gelu is the
/// exact form, gelu_tanh the tanh approximation (cuBLASLt's fused GELU).
enum class Activation : int { none = 0, relu = 1, gelu = 2, gelu_tanh = 3, silu = 4 };
inline constexpr int kActivations = 5;
const char* activation_name(Activation act);

/// One matrix operand of a problem: element strides of its rows and columns
/// and of every batch and reduction dim of the problem (0 where it broadcasts).
struct Operand {
  char* data = nullptr;
  int64_t row_stride = 0, col_stride = 0;
  int64_t batch_stride[kMaxRank] = {};
  int64_t red_stride[kMaxRank] = {};
};

/// scaled_mm's scale of A or B, in the run's memory (f32; f64 for f64
/// operands): the factor of A's row m (B's column n) in K block kb is
/// data[(m / block) * stride + kb * k_stride], kb = k / kScaleBlock.
/// Per tensor: both strides 0; row-wise: k_stride 0; block-wise: both set
/// (Note [scaled_mm scales]).
struct ScaleOperand {
  const void* data = nullptr;  ///< null: 1
  int64_t stride = 0, k_stride = 0;
  int64_t block = 1;  ///< rows of A (columns of B) that share a factor: 1 or kScaleBlock
};
inline constexpr int64_t kScaleBlock = 128;

/// D[b, m, n] = act(alpha * sum_{r, k} sa(m, k) * A[b, r, m, k] * B[b, r, k, n] * sb(k, n) + beta * C[b, m, n] + bias[n])
///
/// `b` runs over the batch dims (D has them), `r` over the reduction dims (a
/// broadcast batch dim summed by a gradient: D lacks it). Dims are stored
/// outermost first. C is read only when beta != 0, as torch's addmm.
/// sa and sb are scaled_mm's scales (ScaleOperand); its bias may be bf16 or
/// f16 over any output dtype (torch._scaled_mm's rule), and its fp8 output
/// is scale_result * (the above), saturated to the largest finite value.
struct Problem {
  DType in_dtype = DType::f32, out_dtype = DType::f32;  ///< in_dtype: A's (B's is the same except in scaled_mm)
  int64_t m = 0, n = 0, k = 0;
  int batch_rank = 0, red_rank = 0;
  int64_t batch_shape[kMaxRank] = {}, red_shape[kMaxRank] = {};
  Operand a, b, c, d;
  Operand bias;  ///< over n only (row and batch strides 0); data null: none
  DType bias_dtype = DType::f32;
  ScaleOperand scale_a, scale_b;
  const void* scale_result = nullptr;  ///< null: 1 (of the scales' type)
  /// linear_backward's grad_bias, summed over K by cuBLASLt's bias-gradient
  /// epilogue when the engine fuses it (contiguous, length M); null: none.
  char* bias_grad = nullptr;
  bool has_c = false;
  double alpha = 1, beta = 0;
  Activation act = Activation::none;

  BCD_HD int64_t batch_count() const { return count(batch_rank, batch_shape); }
  BCD_HD int64_t red_count() const { return count(red_rank, red_shape); }
  BCD_HD bool reads_c() const { return has_c && beta != 0; }
  /// Block-wise scales vary along K: the kernels apply them to the operands
  /// as they load them; the others are applied to the sums.
  BCD_HD bool scales_in_k() const { return k > kScaleBlock && (scale_a.k_stride != 0 || scale_b.k_stride != 0); }

 private:
  BCD_HD static int64_t count(int rank, const int64_t* shape) {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
};

/// Element offset of linear index `i` over dims (outermost first) with strides.
BCD_HD int64_t offset_of(int64_t i, int rank, const int64_t* shape, const int64_t* stride) {
  int64_t off = 0;
  for (int d = rank - 1; d >= 0; --d) {
    off += (i % shape[d]) * stride[d];
    i /= shape[d];
  }
  return off;
}

/// A vector operand of matmul as a matrix: [K] becomes [1, K] on the left
/// and [K, 1] on the right; matrices pass through.
TensorView as_matrix(const TensorView& v, bool left);
/// The view with its last two dims swapped (no data moves).
TensorView transposed(const TensorView& v);
/// The view with a size-1 dim inserted at `dim` (0 <= dim <= rank).
TensorView unsqueezed(const TensorView& v, int dim);

/// Binds D = A @ B over the broadcast batch dims of A and B (rank >= 2 each):
/// a batch dim of the product that D holds is a batch dim, one that D lacks
/// or holds as 1 is summed (a reduction dim). Adjacent dims that walk every
/// operand as one are merged. Shapes must agree (the op's inference checks).
Result<Problem> bind_product(const TensorView& d, const TensorView& a, const TensorView& b);

/// The same with an addend C, broadcast to D's shape.
Result<Problem> bind_product(const TensorView& d, const TensorView& a, const TensorView& b, const TensorView& c);
/// Adds a bias over N (rank 1, length N).
void bind_bias(Problem& p, const TensorView& bias);

/// Runs a problem: the host reference (f64 for floats, i64 for integers) or
/// the bespoke CUDA kernel. Keys "gemm:in:out", and scaled_key for scaled_mm.
using GemmFn = Status (*)(const Problem&, CUstream_st*);
using GemmTable = LaunchTable<GemmFn>;
GemmTable& host_gemms();
GemmTable& cuda_gemms();
/// "scaled_mm:a:b:out": the launcher of a product of two fp8 dtypes (or the f64 oracle).
inline std::string scaled_key(DType a, DType b, DType out) { return launch_key(launch_key("scaled_mm", a), b, out); }

}  // namespace baracuda::gemm
