// The bespoke CUDA GEMM of scaled_mm: fp8 A and B (e4m3/e5m2, any pair),
// bf16/f16/f32 output, f32 accumulation (split from kernels.cu so the build
// runs in parallel).
#include "gemm/register.hpp"
#include "gemm/tiled.cuh"

namespace baracuda::gemm {
namespace {

[[maybe_unused]] const bool registered = register_scaled_gemms<tiled::CudaGemm>(cuda_gemms());

}  // namespace
}  // namespace baracuda::gemm
