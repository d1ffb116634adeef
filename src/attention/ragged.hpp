// cuDNN's packed-sequence ("ragged") attention beside ours: what it reads
// besides the operands, built on the device from cu_seqlens, and the fix-ups
// that give its results our rules. See Note [Packed sequences on cuDNN].
#pragma once

#include "attention/problem.hpp"

namespace baracuda::attn {

/// The packed operands cuDNN locates by per-sequence element offsets.
enum RaggedOperand : int {
  kRaggedQ, kRaggedK, kRaggedV, kRaggedOut, kRaggedGradOut, kRaggedGradQ, kRaggedGradK, kRaggedGradV, kRaggedStats,
  kRaggedOperands
};

/// The shape cuDNN's graph is built for: batch, max_seqlen and token counts
/// rounded up to powers of two, so that one graph serves every packing in
/// the bucket (the sequences past the batch get length 0).
struct RaggedShape {
  int64_t batch = 0, seq_q = 0, seq_kv = 0, tokens_q = 0, tokens_kv = 0;
};
inline int64_t ragged_bucket(int64_t n) {
  int64_t b = 1;
  while (b < n) b *= 2;
  return b;
}
inline RaggedShape ragged_shape(const Problem& p) {
  return {ragged_bucket(p.batch), ragged_bucket(p.seq_q), ragged_bucket(p.seq_kv), ragged_bucket(p.tokens_q),
          ragged_bucket(p.tokens_kv)};
}

/// Device arrays in the plan's workspace (ragged_carve), sized for the
/// graph's batch (ragged_shape).
struct RaggedArrays {
  int32_t* len_q = nullptr;   ///< [graph batch]; 0 for an invalid packing and past the batch
  int32_t* len_kv = nullptr;  ///< [graph batch]
  int64_t* offsets = nullptr; ///< [kRaggedOperands][graph batch + 1] element offsets of each sequence's first token
  int64_t graph_batch = 0;
  float* stats = nullptr;     ///< lse in cuDNN's token-major layout [tokens_q, heads_q]
};

/// Workspace bytes of the arrays (a multiple of 256).
size_t ragged_bytes(const Problem& p);
/// The arrays carved from `base` (256-byte aligned, ragged_bytes(p) long).
RaggedArrays ragged_carve(const Problem& p, void* base);

/// Before cuDNN runs: lengths and offsets from cu_seqlens (each sequence
/// checked by packing_valid), and for the backward the lse copied into
/// `stats` with -inf (a query that sees no key) turned into +inf.
Status ragged_prepare(const Problem& p, const RaggedArrays& a, CUstream_st* stream);
/// After cuDNN ran: forward, lse from `stats` and out = 0, lse = -inf for
/// queries that see no key; backward, grad_k = grad_v = 0 for the keys of
/// sequences without queries.
Status ragged_finish(const Problem& p, const RaggedArrays& a, CUstream_st* stream);

}  // namespace baracuda::attn
