// Built only with cuDNN; without it the attention family's cuDNN engine
// reports itself unsupported and nothing here is needed.
#if BARACUDA_HAS_CUDNN

#include "vendor/cudnn.hpp"

#include <map>
#include <memory>

#include "core/cuda_check.hpp"

namespace baracuda::vendor {

Status cudnn_status(cudnnStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUDNN_STATUS_SUCCESS) return Status::ok();
  char detail[256] = {};
  cudnnGetLastErrorString(detail, sizeof(detail));
  return Status::backend("cudnn", static_cast<long>(status),
                         cat(expr, " failed at ", file, ":", line, ": ", cudnnGetErrorString(status),
                             detail[0] ? " (" : "", detail, detail[0] ? ")" : ""));
}

Status frontend_failure(bool refused, int code, std::string_view code_name, std::string_view message, const char* expr,
                        const char* file, int line) {
  if (refused) return unsupported("cuDNN: ", message, " (", code_name, ")");
  return Status::backend("cudnn_frontend", code,
                         cat(expr, " failed at ", file, ":", line, ": ", code_name, ": ", message));
}

Result<DnnHandle> dnn_handle() {
  struct Destroy {
    void operator()(cudnnContext* h) const { (void)cudnnDestroy(h); }
  };
  struct Entry {
    std::unique_ptr<cudnnContext, Destroy> handle;
    std::mutex mutex;  // guards the handle's stream and the work enqueued with it
  };
  static std::mutex mutex;
  static std::map<int, Entry> handles;
  int device = 0;
  BARACUDA_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  Entry& e = handles[device];
  if (!e.handle) {
    cudnnHandle_t raw = nullptr;
    BARACUDA_CUDNN_TRY(cudnnCreate(&raw));
    e.handle.reset(raw);
  }
  return DnnHandle{e.handle.get(), &e.mutex};
}

int dnn_version() { return static_cast<int>(cudnnGetVersion()); }

}  // namespace baracuda::vendor

#endif  // BARACUDA_HAS_CUDNN
