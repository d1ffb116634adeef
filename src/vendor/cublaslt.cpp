#include "vendor/cublaslt.hpp"

#include <map>
#include <mutex>

#include "core/cuda_check.hpp"

namespace baracuda::vendor {

Status cublas_status(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return Status::ok();
  return Status::backend("cublasLt", static_cast<long>(status),
                         cat(expr, " failed at ", file, ":", line, ": ", cublasLtGetStatusName(status), " (",
                             cublasLtGetStatusString(status), ")"));
}

Result<cublasLtHandle_t> lt_handle() {
  using Handle = std::unique_ptr<cublasLtContext, LtDeleter<cublasLtHandle_t, cublasLtDestroy>>;
  static std::mutex mutex;
  static std::map<int, Handle> handles;
  int device = 0;
  BARACUDA_CUDA_TRY(cudaGetDevice(&device));
  std::lock_guard lock(mutex);
  Handle& h = handles[device];
  if (!h) {
    cublasLtHandle_t raw = nullptr;
    BARACUDA_CUBLAS_TRY(cublasLtCreate(&raw));
    h.reset(raw);
  }
  return h.get();
}

}  // namespace baracuda::vendor
