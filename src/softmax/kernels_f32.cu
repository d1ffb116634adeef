// CUDA softmax family for dtypes: float (split so the build runs in parallel).
#include "softmax/kernels.cuh"
#include "softmax/register.hpp"

namespace baracuda::smax {
namespace {
[[maybe_unused]] const bool registered = register_softmax<CudaSoftmax, TypeList<float>>(cuda_softmax());
}  // namespace
}  // namespace baracuda::smax
