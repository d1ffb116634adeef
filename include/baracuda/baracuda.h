/* baracuda C ABI: opaque plans, status codes and a thread-local last-error
 * message. Compiles as C11 and C++. */
#ifndef BARACUDA_H
#define BARACUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum baracuda_status {
  BARACUDA_OK = 0,
  BARACUDA_ERROR_UNSUPPORTED = 1,
  BARACUDA_ERROR_INVALID_PROBLEM = 2,
  BARACUDA_ERROR_MISALIGNED_OPERAND = 3,
  BARACUDA_ERROR_WORKSPACE_TOO_SMALL = 4,
  BARACUDA_ERROR_BUFFER_TOO_SMALL = 5,
  BARACUDA_ERROR_BACKEND = 6,
  BARACUDA_ERROR_INTERNAL = 7
} baracuda_status;

/* Same order as baracuda::DType. */
typedef enum baracuda_dtype {
  BARACUDA_F32 = 0, BARACUDA_F16, BARACUDA_BF16, BARACUDA_F64, BARACUDA_FP8_E4M3, BARACUDA_FP8_E5M2,
  BARACUDA_I8, BARACUDA_U8, BARACUDA_I16, BARACUDA_I32, BARACUDA_I64, BARACUDA_U32, BARACUDA_BOOL,
  BARACUDA_C64, BARACUDA_C128
} baracuda_dtype;

/* A strided view. `strides` (in elements) may be NULL for row-major contiguous. */
typedef struct baracuda_tensor {
  void* data;
  baracuda_dtype dtype;
  int32_t rank;
  const int64_t* shape;
  const int64_t* strides;
} baracuda_tensor;

typedef struct baracuda_attr {
  const char* name;
  double value;
} baracuda_attr;

/* Where plans run: a cudaStream_t (NULL = legacy default stream), or the host. */
typedef struct baracuda_stream {
  void* cuda_stream;
  int is_host;
} baracuda_stream;

typedef struct baracuda_plan_s* baracuda_plan;

/* What the selected plan must be; baracuda_preference_default() allows
 * anything (the fields' defaults are given beside them). */
typedef struct baracuda_preference {
  const char* backend;         /* NULL: any candidate; else only this backend: "host", "cuda", "cublaslt",
                                  "cudnn", "cufft", "cusolver", "curand", "cusparse", "nccl", "cccl", "cutlass" */
  int32_t deterministic_only;  /* 0; nonzero: the plan gives the same bits every run (e.g. the attention
                                  backward then sums dQ in a fixed order) */
  int32_t allow_tf32;          /* 0; nonzero: f32 matrix products may multiply in TF32 */
  size_t max_workspace_bytes;  /* SIZE_MAX: no limit */
  int32_t skip_candidates;     /* 0; n: skip the first n candidates that accept (the next best) */
} baracuda_preference;
baracuda_preference baracuda_preference_default(void);

/* Selects a plan for `op` over tensors shaped like `inputs`/`outputs` (their
 * data pointers are not read). n_outputs = 0 lets the op infer its outputs. */
baracuda_status baracuda_plan_create(baracuda_plan* plan, baracuda_stream stream, const char* op,
                                     const baracuda_tensor* inputs, int32_t n_inputs,
                                     const baracuda_tensor* outputs, int32_t n_outputs,
                                     const baracuda_attr* attrs, int32_t n_attrs);
/* baracuda_plan_create under a preference (NULL: baracuda_preference_default()). */
baracuda_status baracuda_plan_create_with(baracuda_plan* plan, baracuda_stream stream, const char* op,
                                          const baracuda_tensor* inputs, int32_t n_inputs,
                                          const baracuda_tensor* outputs, int32_t n_outputs,
                                          const baracuda_attr* attrs, int32_t n_attrs,
                                          const baracuda_preference* preference);
/* Whether the plan's runs give the same bits every time on the same hardware (1) or may not (0). */
baracuda_status baracuda_plan_deterministic(baracuda_plan plan, int32_t* deterministic);
void baracuda_plan_destroy(baracuda_plan plan);
baracuda_status baracuda_plan_workspace_size(baracuda_plan plan, size_t* bytes);
/* Writes the kernel identity ("elementwise/add/f32/cuda/sm90/...") into buf. */
baracuda_status baracuda_plan_sku(baracuda_plan plan, char* buf, size_t buf_len);
/* Number of outputs and the dtype/rank/shape of output i (shape gets rank values, up to 8). */
baracuda_status baracuda_plan_output(baracuda_plan plan, int32_t i, baracuda_dtype* dtype, int32_t* rank,
                                     int64_t* shape);
baracuda_status baracuda_plan_run(baracuda_plan plan, baracuda_stream stream, void* workspace,
                                  size_t workspace_bytes, const baracuda_tensor* inputs, int32_t n_inputs,
                                  const baracuda_tensor* outputs, int32_t n_outputs);

/* The message of the last failed call on this thread ("" if none). */
const char* baracuda_last_error(void);
int32_t baracuda_op_count(void);
const char* baracuda_op_name(int32_t index);
const char* baracuda_dtype_name(baracuda_dtype dtype);
int baracuda_cuda_available(void);

#ifdef __cplusplus
}
#endif

#endif /* BARACUDA_H */
