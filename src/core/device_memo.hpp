// Facts about the current device asked of the CUDA runtime once (per device
// and process), and the occupancy of a kernel.
#pragma once

#include <cuda_runtime_api.h>

#include <mutex>

#include "baracuda/core.hpp"

namespace baracuda {

/// query(device) for the current device, asked once a device and process;
/// each call site (the type of its lambda) keeps its own answers. 0 without
/// a device.
template <class Query>
int once_per_device(Query query) {
  constexpr int kDevices = 64;
  static int answers[kDevices] = {};
  static std::once_flag asked[kDevices];
  int device = 0;
  if (!cuda_available() || cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kDevices) return 0;
  std::call_once(asked[device], [&] { answers[device] = query(device); });
  return answers[device];
}

/// Blocks of `kernel` an SM of the current device holds at once, by the
/// occupancy API; 0 where it cannot say (its error cleared).
template <class Kernel>
int blocks_per_sm(Kernel kernel, int threads, size_t smem) {
  int blocks = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, reinterpret_cast<const void*>(kernel), threads, smem) !=
      cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return blocks;
}

}  // namespace baracuda
