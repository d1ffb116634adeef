// CUDA reductions for input dtypes: __half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2 (split so the build runs in parallel).
#include "reduce/kernels.cuh"
#include "reduce/register.hpp"

namespace baracuda::red {
namespace {
template <class R, class T, class Out>
struct CudaReduce {
  static Status run(const ReduceLaunch& l, const RParams& r, CUstream_st* s) { return reduce_on_cuda<R, T, Out>(l, r, s); }
};
[[maybe_unused]] const bool registered = register_reducers<CudaReduce, TypeList<__half, __nv_bfloat16, __nv_fp8_e4m3, __nv_fp8_e5m2>>(cuda_reducers());
}  // namespace
}  // namespace baracuda::red
