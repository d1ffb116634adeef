// CUDA reductions for input dtypes: double, int8_t, uint8_t, int16_t, int32_t, int64_t, uint32_t, bool (split so the build runs in parallel).
#include "reduce/kernels.cuh"
#include "reduce/register.hpp"

namespace baracuda::red {
namespace {
template <class R, class T, class Out>
struct CudaReduce {
  static Status run(const ReduceLaunch& l, const RParams& r, CUstream_st* s) { return reduce_on_cuda<R, T, Out>(l, r, s); }
};
[[maybe_unused]] const bool registered = register_reducers<CudaReduce, TypeList<double, int8_t, uint8_t, int16_t, int32_t, int64_t, uint32_t, bool>>(cuda_reducers());
}  // namespace
}  // namespace baracuda::red
