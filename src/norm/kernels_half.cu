// CUDA normalization kernels for dtypes: __half, __nv_bfloat16 (split so the build runs in parallel).
#include "norm/kernels.cuh"
#include "norm/register.hpp"

namespace baracuda::norm {
namespace {
template <class S, class T, bool kBackward>
struct CudaNorm {
  static Status run(const RowLaunch& l, const NormParams& p, int splits, CUstream_st* s) {
    if constexpr (kBackward) return norm_backward_on_cuda<S, T>(l, p, splits, s);
    else return norm_forward_on_cuda<S, T>(l, p, splits, s);
  }
};
[[maybe_unused]] const bool registered = register_norms<CudaNorm, TypeList<__half, __nv_bfloat16>>(cuda_norms());
}  // namespace
}  // namespace baracuda::norm
