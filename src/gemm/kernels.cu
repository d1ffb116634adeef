// The bespoke CUDA GEMM for A and B of one dtype ("gemm:in:out").
#include "gemm/register.hpp"
#include "gemm/tiled.cuh"

namespace baracuda::gemm {
namespace {

[[maybe_unused]] const bool registered = register_gemms<tiled::CudaGemm>(cuda_gemms());

}  // namespace
}  // namespace baracuda::gemm
