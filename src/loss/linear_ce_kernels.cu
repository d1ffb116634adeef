// CUDA helpers of linear_cross_entropy (see linear_ce.hpp) for the four floats
// and fp8: one block each, sums in a fixed order (thread-strided partial sums,
// then a fixed tree).
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "core/launch_table.hpp"
#include "loss/linear_ce.hpp"
#include "loss/register.hpp"

namespace baracuda::loss::lce {

LaunchTable<HelperFn>& cuda_helpers();

namespace {

constexpr int kThreads = 1024;

template <class T>
using stat_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <class T, class Index>
__global__ void __launch_bounds__(kThreads) prepare_kernel(Helper h) {
  using W = stat_t<T>;
  __shared__ W scratch[32];
  W kept = 0;  // counts below 2^24 are exact in f32; larger counts round like torch's f32 total_weight
  const Index* t = static_cast<const Index*>(h.target);
  const T* cw = static_cast<const T*>(h.class_weight);
  for (int64_t r = threadIdx.x; r < h.rows; r += kThreads) {
    const int64_t c = int64_t(t[r * h.target_stride]);
    if (c == h.ignore_index) continue;
    // A class outside [0, classes) adds nothing here: the row kernel makes its loss NaN.
    if (!cw) kept += W(1);
    else if (c >= 0 && c < h.classes) kept += convert<W>(cw[c * h.class_weight_stride]);
  }
  kept = rows::row_all_reduce<kThreads, 1>(kept, rows::SumOp{}, scratch);
  for (int64_t i = threadIdx.x; i < h.ones_count; i += kThreads) static_cast<T*>(h.ones)[i] = convert<T>(1.0f);
  const T* bias = static_cast<const T*>(h.bias);
  for (int64_t i = threadIdx.x; h.wide_bias && i < h.classes; i += kThreads)
    static_cast<__nv_bfloat16*>(h.wide_bias)[i] = convert<__nv_bfloat16>(convert<float>(bias[i * h.bias_stride]));
  for (int64_t i = threadIdx.x; h.wide_class_weight && i < h.classes; i += kThreads)
    static_cast<float*>(h.wide_class_weight)[i] = convert<float>(cw[i * h.class_weight_stride]);
  if (h.unit_scales && threadIdx.x < 2) static_cast<float*>(h.unit_scales)[threadIdx.x] = 1.0f;
  if (threadIdx.x == 0) {
    W* s = static_cast<W*>(h.stats);
    // Every row ignored: the mean is 0 / 0 (NaN, as torch) and the gradients 0.
    const W go = h.grad_output ? convert<W>(*static_cast<const T*>(h.grad_output)) : W(1);
    s[0] = go * (h.reduction == 1 ? (kept != W(0) ? W(1) / kept : W(0)) : W(1));
    s[1] = kept;
  }
}

template <class T>
__global__ void __launch_bounds__(kThreads) finish_kernel(Helper h) {
  using W = stat_t<T>;
  __shared__ W scratch[32];
  W sum = 0;
  const W* loss = static_cast<const W*>(h.row_loss);
  for (int64_t r = threadIdx.x; r < h.rows; r += kThreads) sum += loss[r];
  sum = rows::row_all_reduce<kThreads, 1>(sum, rows::SumOp{}, scratch);
  if (threadIdx.x == 0) {
    const W kept = static_cast<const W*>(h.stats)[1];
    *static_cast<T*>(h.out) = convert<T>(h.reduction == 1 ? sum / kept : sum);
  }
}

template <class T>
__global__ void store_kernel(Helper h) {
  const int64_t n = h.n0 * h.n1;
  const float* src = static_cast<const float*>(h.src);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    static_cast<T*>(h.dst)[(i / h.n1) * h.s0 + (i % h.n1) * h.s1] = convert<T>(src ? src[i] : 0.0f);
}

template <class T, class Index>
struct CudaHelper {
  static Status run(const Helper& h, CUstream_st* stream) {
    switch (h.stage) {
      case Helper::Stage::prepare: prepare_kernel<T, Index><<<1, kThreads, 0, stream>>>(h); break;
      case Helper::Stage::finish: finish_kernel<T><<<1, kThreads, 0, stream>>>(h); break;
      case Helper::Stage::store:
        if (h.n0 * h.n1 > 0) store_kernel<T><<<unsigned(std::min<int64_t>((h.n0 * h.n1 + 255) / 256, 4096)), 256, 0, stream>>>(h);
        break;
    }
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = [] {
  for_each_type<LossTypes>([&]<class T>(TypeTag<T>) {
    for_each_type<TypeList<int32_t, int64_t>>([&]<class Index>(TypeTag<Index>) {
      cuda_helpers().add(launch_key("linear_cross_entropy", dtype_of<T>, dtype_of<Index>), &CudaHelper<T, Index>::run);
    });
  });
  return true;
}();

}  // namespace
}  // namespace baracuda::loss::lce
