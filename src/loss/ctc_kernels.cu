// CUDA ctc_loss (fp8 log-probabilities: the forward only): one CTA per sample, threads over the extended label
// positions, a block barrier per time step (Note [CTC on the GPU]).
#include "core/cuda_check.hpp"
#include "core/cuda_rows.cuh"
#include "core/launch_table.hpp"
#include "core/fp8_traits.hpp"
#include "loss/ctc.hpp"
#include "loss/register.hpp"

namespace baracuda::loss::ctc {

LaunchTable<Fn>& cuda_ctc();

namespace {

// Note [CTC on the GPU]
// Forward: alpha in three rolling rows (shared memory when kRollingRows (2S + 1)
// values fit, else the workspace), the sample's nll by thread 0; a reduction
// sums the per-sample terms in one block in a fixed order. Backward: the same
// alpha recursion, also writing alpha of every t to the workspace (written,
// never read back during the recursion), then t from I-1 down: (1) beta_t into a rolling
// row and alpha_t + beta_t into the fourth row, class tid's lp(t) into s_lp; (2) every class gets
// the value of a class no position holds; the last warp takes the lse over the blank
// positions (a max, then a sum of exponentials: one log), the thread
// of each label's first target position walks the chain of its repeats
// (next[k]; in shared memory for the first kThreads positions); both park the lse in the row beta_t no longer needs; (3) those
// threads overwrite their class, with lp(t) from s_lp. The per-step critical path is two barriers and
// shared-memory reads: every global load of a step is issued a step ahead.
// Bad lengths or labels give NaN (the host
// reference names them). No float atomics: bitwise deterministic.
constexpr int kThreads = 256;
constexpr int kBlankWarp = kThreads / 32 - 1;  ///< the blank's lse (warp 0 also walks the first labels)

template <class T>
__global__ void __launch_bounds__(kThreads) ctc_kernel(Problem p, bool backward) {
  using M = math_t<T, false>;
  extern __shared__ __align__(16) char smem_bytes[];
  __shared__ int64_t s_offset;
  __shared__ int s_bad_sum;
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  const M ninf = neg_inf<M>();
  if (tid == 0) {
    int64_t offset = 0, total = 0;
    int bad = 0;
    for (int64_t n = 0; p.concatenated && n < p.N; ++n) {
      const int64_t tl = load_index(p.target_lengths, p.tl64, n * p.tl_stride);
      bad |= tl < 0;
      offset += n < b ? tl : 0;
      total += tl;
    }
    s_offset = offset;
    s_bad_sum = bad || (p.concatenated && total != p.S);
  }
  __syncthreads();
  Sample sm = sample_of(p, b, s_offset);
  if (s_bad_sum) sm.S = 0, sm.L = 1;
  int bad = s_bad_sum || sm.bad != Bad::none;
  for (int64_t k = tid; k < sm.S; k += kThreads) {
    const int64_t lab = label_at(p, sm, k);
    bad |= lab < 0 || lab >= p.C || lab == p.blank;
  }
  bad = __syncthreads_or(bad);
  const int64_t L = sm.L, I = sm.I;
  M* rows = p.rows_in_smem ? reinterpret_cast<M*>(smem_bytes) : static_cast<M*>(p.ws_rows) + kRollingRows * sm.rows;
  M* alpha = backward ? static_cast<M*>(p.ws_alpha) + p.T * sm.rows : nullptr;
  auto row = [&](int64_t t) { return rows + (t % 3) * L; };
  // Backward: alpha of every t kept for the beta pass.
  auto put = [&](int64_t t, int64_t s, M v) {
    row(t)[s] = v;
    if (backward) alpha[t * L + s] = v;
  };
  auto lp = [&](int64_t t, int64_t c) { return lp_at<T, M>(p, b, t, c); };

  // Thread tid's first position s0 keeps its label and skip flags in registers and loads
  // the log-probability of the next step before this one's math (in flight across the barrier).
  const int64_t s0 = tid;
  const bool own = s0 < L;
  const int64_t e0 = own ? extended(p, sm, s0) : 0;
  const bool skip_below0 = own && skips_from(p, sm, s0), skip_above0 = own && s0 + 2 < L && skips_from(p, sm, s0 + 2);
  auto alpha_at = [&](const M* prev, int64_t s, bool skip, M lpv) {
    return log_add(prev[s], s >= 1 ? prev[s - 1] : ninf, skip ? prev[s - 2] : ninf) + lpv;
  };
  auto beta_at = [&](const M* next_row, int64_t s, bool skip, M lpv) {
    return log_add(next_row[s], s + 1 < L ? next_row[s + 1] : ninf, skip ? next_row[s + 2] : ninf) + lpv;
  };

  // alpha
  M nll = M(NAN);
  if (!bad && I > 0) {
    for (int64_t s = tid; s < L; s += kThreads) put(0, s, s < 2 ? lp(0, extended(p, sm, s)) : ninf);
    M lp_next = own && I > 1 ? lp(1, e0) : M(0);
    __syncthreads();
    for (int64_t t = 1; t < I; ++t) {
      const M lp_now = lp_next;
      if (own && t + 1 < I) lp_next = lp(t + 1, e0);
      const M* prev = row(t - 1);
      if (own) put(t, s0, alpha_at(prev, s0, skip_below0, lp_now));
      for (int64_t s = s0 + kThreads; s < L; s += kThreads)
        put(t, s, alpha_at(prev, s, skips_from(p, sm, s), lp(t, extended(p, sm, s))));
      __syncthreads();
    }
    const M* last = row(I - 1);
    nll = -log_add(last[L - 1], L >= 2 ? last[L - 2] : ninf);
  } else if (!bad) {
    nll = sm.S == 0 ? M(0) : M(INFINITY);
  }

  if (!backward || !has_gradient_v<T>) {  // fp8: the loss only
    if (tid != 0) return;
    const M loss = finish_nll(p, nll);
    if (p.reduction == 0) static_cast<T*>(p.dst)[b * p.dst_n] = convert<T>(loss);
    else static_cast<M*>(p.ws_loss)[b] = loss * reduction_scale<M>(p, sm.S);
    return;
  }

  T* grad = static_cast<T*>(p.dst) + b * p.dst_n;
  auto store = [&](int64_t t, int64_t c, M v) { grad[t * p.dst_t + c * p.dst_c] = convert<T>(v); };
  const bool zero = !bad && (I == 0 || (p.zero_infinity && nll == M(INFINITY)));
  for (int64_t t = bad || zero ? 0 : I; t < p.T; ++t)
    for (int64_t c = tid; c < p.C; c += kThreads) store(t, c, bad ? M(NAN) : M(0));
  if (bad || zero) return;
  const M scale = convert<M>(static_cast<const T*>(p.grad_output)[b * p.go_stride]) * reduction_scale<M>(p, sm.S);

  // Repeats of a label: next[k] (or -1), first[k] = no earlier position holds it.
  int32_t* next = p.ws_next + 2 * (p.concatenated ? s_offset : b * p.S);
  int32_t* first = next + sm.S;
  for (int64_t k = tid; k < sm.S; k += kThreads) {
    const int64_t lab = label_at(p, sm, k);
    int32_t nk = -1, is_first = 1;
    for (int64_t j = k + 1; j < sm.S && nk < 0; ++j)
      if (label_at(p, sm, j) == lab) nk = int32_t(j);
    for (int64_t j = 0; j < k && is_first; ++j)
      if (label_at(p, sm, j) == lab) is_first = 0;
    next[k] = nk;
    first[k] = is_first;
  }
  // Thread tid's target position k = tid, loop-invariant: its label, whether it is the label's first, the chain.
  __shared__ int32_t s_next[kThreads];
  // lp(t, c) of the classes c < kThreads for the stores of (3); two buffers (t % 2): step t - 1 writes
  // its own while slower threads may still read step t's.
  __shared__ M s_lp[2][kThreads];
  const bool own_label = tid < sm.S;
  const int64_t lab0 = own_label ? label_at(p, sm, tid) : 0;
  __syncthreads();  // next and first written before their reads
  const bool first0 = own_label && first[tid];
  s_next[tid] = own_label ? next[tid] : -1;
  auto next_of = [&](int64_t j) { return j < kThreads ? int64_t(s_next[j]) : int64_t(next[j]); };

  // Prefetched a step ahead: thread tid's position's log-probability and alpha, and class tid's log-probability.
  const bool own_class = tid < p.C;
  M lp_next = own ? lp(I - 1, e0) : M(0), alpha_next = own ? alpha[(I - 1) * L + s0] : M(0);
  M lpc_next = own_class ? lp(I - 1, tid) : M(0), lpc_now = 0;
  M* ab = rows + 3 * L;  // alpha_t + beta_t
  for (int64_t t = I - 1; t >= 0; --t) {
    M* cur = rows + (t % 3) * L;
    M* parked = rows + ((t + 1) % 3) * L;  // beta_{t+1}: read in (1), then holds the lse of (2)
    const M* alpha_t = alpha + t * L;
    const M lp_now = lp_next, alpha_now = alpha_next;
    lpc_now = lpc_next;
    if (own && t >= 1) lp_next = lp(t - 1, e0), alpha_next = alpha[(t - 1) * L + s0];
    if (own_class && t >= 1) lpc_next = lp(t - 1, tid);
    auto beta_of = [&](int64_t s, bool skip, M lpv) {
      return t == I - 1 ? (s >= L - 2 ? lpv : ninf) : beta_at(parked, s, skip, lpv);
    };
    if (own) {
      const M beta = beta_of(s0, skip_above0, lp_now);
      cur[s0] = beta;
      ab[s0] = alpha_now + beta;
    }
    if (own_class) s_lp[t % 2][tid] = lpc_now;
    for (int64_t s = s0 + kThreads; s < L; s += kThreads) {
      const M beta = beta_of(s, s + 2 < L && skips_from(p, sm, s + 2), lp(t, extended(p, sm, s)));
      cur[s] = beta;
      ab[s] = alpha_t[s] + beta;
    }
    __syncthreads();
    if (own_class) store(t, tid, grad_at(lpc_now, ninf, nll, scale));
    for (int64_t c = tid + kThreads; c < p.C; c += kThreads) store(t, c, grad_at(lp(t, c), ninf, nll, scale));
    const int lane = tid % 32;
    if (tid / 32 == kBlankWarp) {
      // The blank: the lse over the even positions as m + log(sum e^(x - m)); butterflies
      // (commutative at each level, so every lane agrees) for the max, then the sum.
      M m = ninf;
      for (int64_t j = lane; 2 * j < L; j += 32) m = fmax(m, ab[2 * j]);
      for (int o = 16; o > 0; o /= 2) m = fmax(m, __shfl_xor_sync(0xffffffffu, m, o));
      M sum = 0;
      if (m != ninf)
        for (int64_t j = lane; 2 * j < L; j += 32) sum += exp(ab[2 * j] - m);
      for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
      // NaN anywhere: fmax skips it, the sum does not.
      if (lane == 0) parked[0] = m == ninf ? m : m + log(sum);
    }
    auto chain = [&](int64_t k) {  // log_add(-inf, x) is x: start from the first position's value
      M acc = ab[2 * k + 1];
      for (int64_t j = next_of(k); j >= 0; j = next_of(j)) acc = log_add(acc, ab[2 * j + 1]);
      parked[2 * k + 1] = acc;
    };
    if (first0) chain(tid);
    for (int64_t k = tid + kThreads; k < sm.S; k += kThreads)
      if (first[k]) chain(k);
    __syncthreads();
    auto lp_of = [&](int64_t c) { return c < kThreads ? s_lp[t % 2][c] : lp(t, c); };
    if (tid == kBlankWarp * 32) store(t, p.blank, grad_at(lp_of(p.blank), parked[0], nll, scale));
    if (first0) store(t, lab0, grad_at(lp_of(lab0), parked[2 * tid + 1], nll, scale));
    for (int64_t k = tid + kThreads; k < sm.S; k += kThreads) {
      if (!first[k]) continue;
      const int64_t c = label_at(p, sm, k);
      store(t, c, grad_at(lp(t, c), parked[2 * k + 1], nll, scale));
    }
  }
}

/// The mean or sum of the per-sample terms, in one block.
template <class T>
__global__ void __launch_bounds__(1024) finalize_kernel(Problem p) {
  using M = math_t<T, false>;
  __shared__ M scratch[32];
  const M* terms = static_cast<const M*>(p.ws_loss);
  M sum = 0;
  for (int64_t n = threadIdx.x; n < p.N; n += 1024) sum += terms[n];
  sum = rows::row_all_reduce<1024, 1>(sum, rows::SumOp{}, scratch);
  if (threadIdx.x == 0) *static_cast<T*>(p.dst) = convert<T>(p.reduction == 1 && p.N == 0 ? M(NAN) : sum);
}

template <class T>
struct CudaCtc {
  static Status run(const Problem& p, bool backward, CUstream_st* stream) {
    using M = math_t<T, false>;
    const size_t smem = p.rows_in_smem ? size_t(kRollingRows * max_positions(p)) * sizeof(M) : 0;
    if (p.N > 0) ctc_kernel<T><<<unsigned(p.N), kThreads, smem, stream>>>(p, backward);
    if (!backward && p.reduction != 0) finalize_kernel<T><<<1, 1024, 0, stream>>>(p);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<LossTypes, CudaCtc>(cuda_ctc(), "ctc_loss");

}  // namespace
}  // namespace baracuda::loss::ctc
