// The score rule of an attention problem, written once for the host
// reference and the CUDA kernels: where a (batch, head)'s rows and keys
// live, which keys a row sees, and score = mask(alibi(softcap(scale * q.k))).
#pragma once

#include "attention/problem.hpp"

namespace baracuda::attn {

/// One (batch, query head) of a problem.
struct HeadView {
  int64_t b = 0, h = 0, hk = 0;  ///< batch, query head, key/value head
  int64_t len_q = 0, len_kv = 0;  ///< rows and keys of this sequence
  int64_t tok_q = 0, tok_kv = 0;  ///< packed: the sequence's first token (0 when dense)
  bool valid = true;              ///< packed offsets in range and lengths within seq_q / seq_kv
  double slope = 0;               ///< ALiBi slope (0: none)
};

BCD_HD HeadView head_view(const Problem& p, int64_t b, int64_t h) {
  HeadView v;
  v.b = b, v.h = h, v.hk = h / p.group();
  v.len_q = p.seq_q, v.len_kv = p.seq_kv;
  if (p.varlen()) {
    const int64_t q0 = p.cu_seqlens_q[b], q1 = p.cu_seqlens_q[b + 1];
    const int64_t k0 = p.cu_seqlens_kv[b], k1 = p.cu_seqlens_kv[b + 1];
    v.valid = packing_valid(p, q0, q1, k0, k1);
    v.tok_q = q0, v.tok_kv = k0;
    v.len_q = v.valid ? q1 - q0 : 0, v.len_kv = v.valid ? k1 - k0 : 0;
  }
  if (p.alibi_slopes) {
    const int64_t e = b * p.alibi_batch_stride + h * p.alibi_head_stride;
    v.slope = p.dtype == DType::f64 ? static_cast<const double*>(p.alibi_slopes)[e]
                                    : double(static_cast<const float*>(p.alibi_slopes)[e]);
  }
  return v;
}

/// Element offsets of row i of q (or out, grad_out, grad_q) and of key j of k (v, ...).
BCD_HD int64_t row_offset(const Operand& o, const HeadView& v, int64_t i) { return o.at(v.b, v.h, v.tok_q + i); }
BCD_HD int64_t key_offset(const Operand& o, const HeadView& v, int64_t j) { return o.at(v.b, v.hk, v.tok_kv + j); }

/// Reads one mask element as Acc (bool masks: 1 keeps, 0 hides).
template <class Acc>
BCD_HD Acc mask_value(const Problem& p, const HeadView& v, int64_t i, int64_t j) {
  const char* at = p.mask.data;
  const int64_t e = v.b * p.mask.batch + v.h * p.mask.head + i * p.mask.seq + j * p.mask.dim;
  switch (p.mask_dtype) {
    case DType::boolean: return reinterpret_cast<const bool*>(at)[e] ? Acc(1) : Acc(0);
    case DType::f16: return convert<Acc>(reinterpret_cast<const __half*>(at)[e]);
    case DType::bf16: return convert<Acc>(reinterpret_cast<const __nv_bfloat16*>(at)[e]);
    case DType::f64: return Acc(reinterpret_cast<const double*>(at)[e]);
    default: return Acc(reinterpret_cast<const float*>(at)[e]);
  }
}

/// The score of row i against key j (inside the row's key range) from the
/// raw product q.k; `capped` receives the value after the softcap, which the
/// backward needs (d capped / d raw = 1 - (capped / softcap)^2).
template <class Acc>
BCD_HD Acc score(const Problem& p, const HeadView& v, Acc dot, int64_t i, int64_t j, Acc& capped) {
  Acc s = dot * Acc(p.scale);
  if (p.softcap > 0) s = Acc(p.softcap) * std::tanh(s / Acc(p.softcap));
  capped = s;
  if (p.alibi_slopes) {
    const int64_t d = query_position(p, i, v.len_q, v.len_kv) - j;
    s -= Acc(v.slope) * Acc(d < 0 ? -d : d);
  }
  if (p.mask.data) {
    const Acc m = mask_value<Acc>(p, v, i, j);
    if (p.mask_dtype == DType::boolean) {
      if (m == Acc(0)) s = -std::numeric_limits<Acc>::infinity();
    } else {
      s += m;
    }
  }
  return s;
}

/// d score / d raw product over the scale: softcap's 1 - tanh^2 (1 without
/// softcap); the tensor-core backwards apply the scale at the end (Note
/// [The scale at the end]).
template <class Acc>
BCD_HD Acc softcap_slope(const Problem& p, Acc capped) {
  if (p.softcap > 0) {
    const Acc t = capped / Acc(p.softcap);
    return Acc(1) - t * t;
  }
  return Acc(1);
}

/// d score / d raw product for the backward (scale and softcap).
template <class Acc>
BCD_HD Acc score_slope(const Problem& p, Acc capped) {
  return Acc(p.scale) * softcap_slope<Acc>(p, capped);
}

/// Dropout's scale on a kept probability: 2^16 / (2^16 - threshold), 1 / (1 - p)
/// to 16 bits (Note [Attention dropout draws]), one rounded f32 quotient on every backend.
template <class Acc>
BCD_HD Acc dropout_scale(const Problem& p) {
  return Acc(65536.f / float(65536u - dropout_threshold(p.dropout_p)));
}

/// Dropout's factor on a probability: dropout_scale when kept, 0 when dropped.
template <class Acc>
BCD_HD Acc dropout_factor(const Problem& p, const HeadView& v, int64_t i, int64_t j) {
  if (p.dropout_p <= 0) return Acc(1);
  return dropout_keep(p, v.b, v.h, i, j) ? dropout_scale<Acc>(p) : Acc(0);
}

}  // namespace baracuda::attn
