// The small kernels around cuDNN's packed-sequence attention (ragged.hpp):
// lengths and offsets before it, our empty-row and empty-sequence rules
// after it. Every index they write is checked against the packing first, so
// offsets that are not a valid packing write nothing out of range.
#include <algorithm>
#include <cmath>

#include "attention/ragged.hpp"
#include "core/cuda_check.hpp"
#include "core/sizes.hpp"

namespace baracuda::attn {

namespace {

constexpr int kBlock = 256;

/// Element strides along the token axis of each ragged operand, and whether
/// it is packed by the key offsets.
struct TokenStrides {
  int64_t stride[kRaggedOperands];
  bool by_kv[kRaggedOperands];
};

TokenStrides token_strides(const Problem& p) {
  TokenStrides t{};
  const Operand* ops[kRaggedStats] = {&p.q, &p.k, &p.v, &p.out, &p.grad_out, &p.grad_q, &p.grad_k, &p.grad_v};
  for (int i = 0; i < kRaggedStats; ++i) t.stride[i] = ops[i]->seq;
  t.stride[kRaggedStats] = p.heads_q;
  t.by_kv[kRaggedK] = t.by_kv[kRaggedV] = t.by_kv[kRaggedGradK] = t.by_kv[kRaggedGradV] = true;
  return t;
}

/// Thread b <= graph batch: sequence b's lengths (0 when its offsets are
/// invalid, packing_valid, and past the batch) and every operand's offset;
/// entries from `batch` on are the end.
__global__ void ragged_offsets_kernel(const Problem p, RaggedArrays a, TokenStrides t) {
  const int64_t b = int64_t(blockIdx.x) * kBlock + threadIdx.x;
  if (b > a.graph_batch) return;
  int64_t tok_q = 0, tok_kv = 0;
  if (b < p.batch) {
    const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    const int64_t k0 = p.cu_seqlens_kv[b], k1 = p.cu_seqlens_kv[b + 1];
    const bool valid = packing_valid(p, q0, q1, k0, k1);
    a.len_q[b] = valid ? int32_t(q1 - q0) : 0;
    a.len_kv[b] = valid ? int32_t(k1 - k0) : 0;
    if (valid) tok_q = q0, tok_kv = k0;
  } else {
    tok_q = min(max(int64_t(p.cu_seqlens_q[p.batch]), int64_t(0)), p.tokens_q);
    tok_kv = min(max(int64_t(p.cu_seqlens_kv[p.batch]), int64_t(0)), p.tokens_kv);
    if (b < a.graph_batch) a.len_q[b] = a.len_kv[b] = 0;
  }
  for (int i = 0; i < kRaggedOperands; ++i)
    a.offsets[i * (a.graph_batch + 1) + b] = (t.by_kv[i] ? tok_kv : tok_q) * t.stride[i];
}

/// stats[t, h] = lse[h, t], a query that saw no key (-inf) as +inf: cuDNN's
/// backward forms exp(score - lse), and -inf - -inf would be NaN.
__global__ void ragged_stats_in_kernel(const Problem p, float* stats) {
  const int64_t n = p.tokens_q * p.heads_q;
  for (int64_t e = int64_t(blockIdx.x) * kBlock + threadIdx.x; e < n; e += int64_t(gridDim.x) * kBlock) {
    const int64_t t = e / p.heads_q, h = e % p.heads_q;
    const float lse = reinterpret_cast<const float*>(p.lse.data)[h * p.lse.head + t * p.lse.seq];
    stats[e] = lse == -INFINITY ? INFINITY : lse;
  }
}

/// The sequence holding token `tok` by the offsets `cu` (the last b with
/// cu[b] <= tok), and its position in it; -1 when no valid sequence holds it.
__device__ int64_t sequence_of(const int32_t* cu, const int32_t* len, int64_t batch, int64_t tok, int64_t& pos) {
  int64_t lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= tok) lo = mid;
    else hi = mid - 1;
  }
  pos = tok - cu[lo];
  return pos >= 0 && pos < len[lo] ? lo : -1;
}

/// Thread (token, head): our lse from cuDNN's stats, or out = 0 and lse =
/// -inf where the query sees no key (key_range; cuDNN leaves such rows
/// undefined).
__global__ void ragged_forward_finish_kernel(const Problem p, const RaggedArrays a) {
  const int64_t tok = int64_t(blockIdx.x) * kBlock + threadIdx.x, h = blockIdx.y;
  if (tok >= p.tokens_q) return;
  int64_t i = 0;
  const int64_t b = sequence_of(p.cu_seqlens_q, a.len_q, p.batch, tok, i);
  if (b < 0) return;
  int64_t lo = 0, hi = 0;
  key_range(p, i, a.len_q[b], a.len_kv[b], lo, hi);
  float* lse = p.lse.data ? reinterpret_cast<float*>(p.lse.data) + h * p.lse.head + tok * p.lse.seq : nullptr;
  if (lo < hi) {
    if (lse) *lse = a.stats[tok * p.heads_q + h];
    return;
  }
  if (lse) *lse = -INFINITY;
  uint16_t* out = reinterpret_cast<uint16_t*>(p.out.data) + h * p.out.head + tok * p.out.seq;
  for (int64_t d = 0; d < p.value_dim; ++d) out[d * p.out.dim] = 0;  // +0 in f16 and bf16
}

/// Thread (key token, kv head): zero gradients for the keys of a sequence
/// with no queries (cuDNN skips such sequences).
__global__ void ragged_backward_finish_kernel(const Problem p, const RaggedArrays a) {
  const int64_t tok = int64_t(blockIdx.x) * kBlock + threadIdx.x, h = blockIdx.y;
  if (tok >= p.tokens_kv) return;
  int64_t j = 0;
  const int64_t b = sequence_of(p.cu_seqlens_kv, a.len_kv, p.batch, tok, j);
  if (b < 0 || a.len_q[b] != 0) return;
  uint16_t* dk = reinterpret_cast<uint16_t*>(p.grad_k.data) + h * p.grad_k.head + tok * p.grad_k.seq;
  uint16_t* dv = reinterpret_cast<uint16_t*>(p.grad_v.data) + h * p.grad_v.head + tok * p.grad_v.seq;
  for (int64_t d = 0; d < p.head_dim; ++d) dk[d * p.grad_k.dim] = 0;
  for (int64_t d = 0; d < p.value_dim; ++d) dv[d * p.grad_v.dim] = 0;
}

/// Bytes of the lengths (each array) and of the offsets, for the graph's batch.
size_t lens_bytes(const Problem& p) { return workspace_aligned(size_t(ragged_shape(p).batch) * sizeof(int32_t)); }
size_t offsets_bytes(const Problem& p) {
  return workspace_aligned(size_t(kRaggedOperands) * size_t(ragged_shape(p).batch + 1) * sizeof(int64_t));
}

}  // namespace

size_t ragged_bytes(const Problem& p) {
  return 2 * lens_bytes(p) + offsets_bytes(p) + workspace_aligned(size_t(p.tokens_q * p.heads_q) * sizeof(float));
}

RaggedArrays ragged_carve(const Problem& p, void* base) {
  char* at = static_cast<char*>(base);
  RaggedArrays a;
  a.len_q = reinterpret_cast<int32_t*>(at);
  a.len_kv = reinterpret_cast<int32_t*>(at + lens_bytes(p));
  a.offsets = reinterpret_cast<int64_t*>(at + 2 * lens_bytes(p));
  a.stats = reinterpret_cast<float*>(at + 2 * lens_bytes(p) + offsets_bytes(p));
  a.graph_batch = ragged_shape(p).batch;
  return a;
}

Status ragged_prepare(const Problem& p, const RaggedArrays& a, CUstream_st* stream) {
  ragged_offsets_kernel<<<unsigned(ceil_div(a.graph_batch + 1, kBlock)), kBlock, 0, stream>>>(p, a, token_strides(p));
  BARACUDA_CUDA_TRY(cudaGetLastError());
  if (p.backward && p.tokens_q * p.heads_q > 0) {
    const int64_t blocks = std::min<int64_t>(ceil_div(p.tokens_q * p.heads_q, kBlock), 4096);
    ragged_stats_in_kernel<<<unsigned(blocks), kBlock, 0, stream>>>(p, a.stats);
    BARACUDA_CUDA_TRY(cudaGetLastError());
  }
  return Status::ok();
}

Status ragged_finish(const Problem& p, const RaggedArrays& a, CUstream_st* stream) {
  if (p.dtype != DType::f16 && p.dtype != DType::bf16)
    return internal_error("ragged_finish: cuDNN serves f16/bf16, got ", dtype_name(p.dtype));
  const int64_t tokens = p.backward ? p.tokens_kv : p.tokens_q, heads = p.backward ? p.heads_kv : p.heads_q;
  if (tokens == 0 || p.batch == 0) return Status::ok();
  const dim3 grid(unsigned(ceil_div(tokens, kBlock)), unsigned(heads));
  if (p.backward) ragged_backward_finish_kernel<<<grid, kBlock, 0, stream>>>(p, a);
  else ragged_forward_finish_kernel<<<grid, kBlock, 0, stream>>>(p, a);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

}  // namespace baracuda::attn
