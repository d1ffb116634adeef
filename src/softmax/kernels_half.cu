// CUDA softmax family for dtypes: __half, __nv_bfloat16 (split so the build runs in parallel).
#include "softmax/kernels.cuh"
#include "softmax/register.hpp"

namespace baracuda::smax {
namespace {
template <class Op, class T, bool kBackward>
struct CudaSoftmax {
  static Status run(const RowLaunch& l, const RowParams& p, CUstream_st* s) {
    return softmax_on_cuda<Op, T, kBackward>(l, p, s);
  }
};
[[maybe_unused]] const bool registered = register_softmax<CudaSoftmax, TypeList<__half, __nv_bfloat16>>(cuda_softmax());
}  // namespace
}  // namespace baracuda::smax
