// CUDA reductions for input dtypes: float (split so the build runs in parallel).
#include "reduce/kernels.cuh"
#include "reduce/register.hpp"

namespace baracuda::red {
namespace {
template <class R, class T, class Out>
struct CudaReduce {
  static Status run(const ReduceLaunch& l, const RParams& r, CUstream_st* s) { return reduce_on_cuda<R, T, Out>(l, r, s); }
};
[[maybe_unused]] const bool registered = register_reducers<CudaReduce, TypeList<float>>(cuda_reducers());
}  // namespace
}  // namespace baracuda::red
