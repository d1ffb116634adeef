// CUDA scans for dtypes: __half, __nv_bfloat16 (split so the build runs in parallel).
#include "scan/kernels.cuh"
#include "scan/register.hpp"

namespace baracuda::scan {
namespace {
template <class Io>
struct CudaScan {
  static Status run(const ScanLaunch& l, CUstream_st* s) { return scan_on_cuda<Io>(l, s); }
};
[[maybe_unused]] const bool registered = register_scans<CudaScan, TypeList<__half, __nv_bfloat16>>(cuda_scans());
}  // namespace
}  // namespace baracuda::scan
