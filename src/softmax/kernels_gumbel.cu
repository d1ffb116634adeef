// CUDA gumbel_softmax kernels for f32, f16, bf16, f64 and fp8 (a file of their own so the build runs in parallel).
#include "softmax/register.hpp"
#include "softmax/sparse.cuh"

namespace baracuda::smax {
namespace {
[[maybe_unused]] const bool registered = register_softmax<CudaSparse, SoftmaxTypes, OpList<GumbelSoftmax>>(cuda_softmax());
}  // namespace
}  // namespace baracuda::smax
