// The host reference attention, forward and backward: every score of a row
// materialised in f64, exact softmax, the same score rule and dropout draws
// as the CUDA kernels. The oracle of the tests, and the backend without a GPU.
#include <cmath>
#include <limits>
#include <vector>

#include "attention/engine.hpp"
#include "attention/score.hpp"

namespace baracuda::attn {

AttentionTable& host_attention() {
  static AttentionTable table;
  return table;
}

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

/// Packed offsets must describe sequences inside the tensors: the CUDA
/// kernels skip a sequence whose offsets do not; the reference names it.
Status check_sequences(const Problem& p) {
  if (!p.varlen()) return Status::ok();
  for (int64_t b = 0; b < p.batch; ++b) {
    const HeadView v = head_view(p, b, 0);
    if (!v.valid)
      return invalid("attention: sequence ", b, " has offsets q [", p.cu_seqlens_q[b], ", ", p.cu_seqlens_q[b + 1],
                     ") and kv [", p.cu_seqlens_kv[b], ", ", p.cu_seqlens_kv[b + 1],
                     "]; offsets must be non-decreasing, within the ", p.tokens_q, " query and ", p.tokens_kv,
                     " key tokens, and no longer than max_seqlen_q = ", p.seq_q, " / max_seqlen_kv = ", p.seq_kv);
  }
  return Status::ok();
}

template <class T>
double at(const Operand& o, int64_t offset, int64_t d) {
  return convert<double>(reinterpret_cast<const T*>(o.data)[offset + d * o.dim]);
}

/// The scores of row i (f64), -inf outside its key range; returns the log-sum-exp.
template <class T>
double row_scores(const Problem& p, const HeadView& v, int64_t i, std::vector<double>& s, std::vector<double>& capped) {
  s.assign(size_t(v.len_kv), kNegInf);
  capped.assign(size_t(v.len_kv), 0);
  int64_t lo, hi;
  key_range(p, i, v.len_q, v.len_kv, lo, hi);
  const int64_t qo = row_offset(p.q, v, i);
  double max = kNegInf;
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t ko = key_offset(p.k, v, j);
    double dot = 0;
    for (int64_t d = 0; d < p.head_dim; ++d) dot += at<T>(p.q, qo, d) * at<T>(p.k, ko, d);
    s[j] = score<double>(p, v, dot, i, j, capped[j]);
    max = std::max(max, s[j]);
  }
  if (max == kNegInf) return kNegInf;
  double sum = 0;
  for (int64_t j = lo; j < hi; ++j) sum += std::exp(s[j] - max);
  return max + std::log(sum);
}

template <class L>
void store_lse(const Problem& p, const HeadView& v, int64_t i, double lse) {
  *p.lse.ptr<L>(v.b, v.h, v.tok_q + i) = L(lse);
}
template <class L>
double load_lse(const Problem& p, const HeadView& v, int64_t i) {
  return double(*p.lse.ptr<const L>(v.b, v.h, v.tok_q + i));
}

/// lse's storage: the device math type (f32, f64 for f64 problems).
template <class T>
using lse_t = math_t<T, false>;

template <class T>
struct HostForward {
  static Status run(const Problem& p, const Workspace&, CUstream_st*) {
    BARACUDA_TRY(check_sequences(p));
    std::vector<double> s, capped, acc(size_t(p.value_dim));
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t h = 0; h < p.heads_q; ++h) {
        const HeadView v = head_view(p, b, h);
        for (int64_t i = 0; i < v.len_q; ++i) {
          const double lse = row_scores<T>(p, v, i, s, capped);
          std::fill(acc.begin(), acc.end(), 0.0);
          if (lse != kNegInf)
            for (int64_t j = 0; j < v.len_kv; ++j) {
              if (s[j] == kNegInf) continue;
              const double w = std::exp(s[j] - lse) * dropout_factor<double>(p, v, i, j);
              if (w == 0) continue;
              const int64_t vo = key_offset(p.v, v, j);
              for (int64_t d = 0; d < p.value_dim; ++d) acc[d] += w * at<T>(p.v, vo, d);
            }
          T* out = reinterpret_cast<T*>(p.out.data) + row_offset(p.out, v, i);
          for (int64_t d = 0; d < p.value_dim; ++d) out[d * p.out.dim] = convert<T>(acc[d]);
          store_lse<lse_t<T>>(p, v, i, lse);
        }
      }
    return Status::ok();
  }

};

template <class T>
struct HostBackward {
  /// dV_j = sum_i P_ij z_ij dO_i;  dP_ij = z_ij dO_i . V_j;  dS_ij = P_ij (dP_ij - dO_i . O_i);
  /// dQ_i = sum_j dS_ij s'_ij K_j;  dK_j = sum_i dS_ij s'_ij Q_i, summed over the query
  /// heads that share a key head. P comes from the saved lse.
  static Status run(const Problem& p, const Workspace&, CUstream_st*) {
    BARACUDA_TRY(check_sequences(p));
    std::vector<double> s, capped, dq(size_t(p.head_dim)), dk, dv;
    for (int64_t b = 0; b < p.batch; ++b)
      for (int64_t hk = 0; hk < p.heads_kv; ++hk) {
        const HeadView first = head_view(p, b, hk * p.group());
        dk.assign(size_t(first.len_kv * p.head_dim), 0.0);
        dv.assign(size_t(first.len_kv * p.value_dim), 0.0);
        for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
          const HeadView v = head_view(p, b, h);
          for (int64_t i = 0; i < v.len_q; ++i) {
            row_scores<T>(p, v, i, s, capped);
            const double lse = load_lse<lse_t<T>>(p, v, i);
            const int64_t qo = row_offset(p.q, v, i), go = row_offset(p.grad_out, v, i), oo = row_offset(p.out, v, i);
            double row_dot = 0;
            for (int64_t d = 0; d < p.value_dim; ++d) row_dot += at<T>(p.grad_out, go, d) * at<T>(p.out, oo, d);
            std::fill(dq.begin(), dq.end(), 0.0);
            for (int64_t j = 0; j < v.len_kv; ++j) {
              if (s[j] == kNegInf || lse == kNegInf) continue;
              const double prob = std::exp(s[j] - lse), z = dropout_factor<double>(p, v, i, j);
              const int64_t ko = key_offset(p.k, v, j), vo = key_offset(p.v, v, j);
              double dprob = 0;
              for (int64_t d = 0; d < p.value_dim; ++d) {
                const double g = at<T>(p.grad_out, go, d);
                dv[j * p.value_dim + d] += prob * z * g;
                dprob += g * at<T>(p.v, vo, d);
              }
              const double ds = prob * (z * dprob - row_dot) * score_slope<double>(p, capped[j]);
              for (int64_t d = 0; d < p.head_dim; ++d) {
                dq[d] += ds * at<T>(p.k, ko, d);
                dk[j * p.head_dim + d] += ds * at<T>(p.q, qo, d);
              }
            }
            T* gq = reinterpret_cast<T*>(p.grad_q.data) + row_offset(p.grad_q, v, i);
            for (int64_t d = 0; d < p.head_dim; ++d) gq[d * p.grad_q.dim] = convert<T>(dq[d]);
          }
        }
        for (int64_t j = 0; j < first.len_kv; ++j) {
          T* gk = reinterpret_cast<T*>(p.grad_k.data) + key_offset(p.grad_k, first, j);
          T* gv = reinterpret_cast<T*>(p.grad_v.data) + key_offset(p.grad_v, first, j);
          for (int64_t d = 0; d < p.head_dim; ++d) gk[d * p.grad_k.dim] = convert<T>(dk[j * p.head_dim + d]);
          for (int64_t d = 0; d < p.value_dim; ++d) gv[d * p.grad_v.dim] = convert<T>(dv[j * p.value_dim + d]);
        }
      }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered =
    register_launchers<FloatTypes, HostForward>(host_attention(), "attention") &&
    register_launchers<FloatTypes, HostBackward>(host_attention(), "attention_backward");

}  // namespace
}  // namespace baracuda::attn
