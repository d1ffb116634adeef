#include "baracuda/core.hpp"

#ifdef BARACUDA_HAS_CUDA
#include "core/cuda_check.hpp"
#include "core/device_memo.hpp"
#endif

namespace baracuda {

#ifdef BARACUDA_HAS_CUDA
bool cuda_available() {
  static const bool available = [] {
    int count = 0;
    return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
  }();
  return available;
}

int current_sm_version() {
  return once_per_device([](int device) {
    cudaDeviceProp prop{};
    return cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.major * 10 + prop.minor : 0;
  });
}

int current_sm_count() {
  return once_per_device([](int device) {
    int n = 0;
    return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess ? n : 0;
  });
}

size_t current_optin_smem() {  // asked on attention's launch path: once a device
  const int bytes = once_per_device([](int device) {
    int n = 0;
    if (cudaDeviceGetAttribute(&n, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) == cudaSuccess) return n;
    (void)cudaGetLastError();
    return 0;
  });
  return bytes > 0 ? size_t(bytes) : 48 * 1024;
}
#else
bool cuda_available() { return false; }
#endif

}  // namespace baracuda
