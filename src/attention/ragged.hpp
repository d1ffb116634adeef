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

/// Device arrays in the plan's workspace (ragged_carve).
struct RaggedArrays {
  int32_t* len_q = nullptr;   ///< [batch]; 0 for a sequence whose offsets are not a valid packing
  int32_t* len_kv = nullptr;  ///< [batch]
  int64_t* offsets = nullptr; ///< [kRaggedOperands][batch + 1] element offsets of each sequence's first token
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
