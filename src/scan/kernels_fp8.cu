// CUDA scans for dtypes: __nv_fp8_e4m3, __nv_fp8_e5m2 (forwards only; split so the build runs in parallel).
#include "scan/kernels.cuh"
#include "scan/register.hpp"

namespace baracuda::scan {
namespace {
template <class Io>
struct CudaScan {
  static Status run(const ScanLaunch& l, CUstream_st* s) { return scan_on_cuda<Io>(l, s); }
};
[[maybe_unused]] const bool registered = register_scans<CudaScan, Fp8Types>(cuda_scans());
}  // namespace
}  // namespace baracuda::scan
