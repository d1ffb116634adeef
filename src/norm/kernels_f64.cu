// CUDA normalization kernels for dtypes: double (split so the build runs in parallel).
#include "norm/kernels.cuh"
#include "norm/register.hpp"

namespace baracuda::norm {
namespace {
[[maybe_unused]] const bool registered = register_norms<CudaNorm, TypeList<double>>(cuda_norms());
}  // namespace
}  // namespace baracuda::norm
