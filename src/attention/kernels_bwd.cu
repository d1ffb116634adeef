// The bespoke CUDA attention backward, deterministic (no atomics), from the
// saved lse: a per-row dO . O pass, then one kernel per key tile that sums
// dK and dV over every query row and every query head of its group in a
// fixed order, and one kernel per query tile for dQ. Scores are recomputed
// tile by tile, never stored. f16/bf16 problems the tensor-core kernels
// take (tensor_core_layout: head dims that are multiples of 8 up to 128) run those
// (kernels_bwd_tc.cu) after the same dO . O pass; the rest run these, on
// CUDA cores. On Hopper at head dim 128, unless the plan must be
// reproducible, one pass sums dQ by f32 reductions instead (Note [One-pass
// Hopper backward] in kernels_bwd_sm90.cu) and a last pass here writes it.
#include "attention/tensor_core.cuh"

namespace baracuda::attn {

namespace {

template <class T>
using Lse = acc_of<T>;

/// ws[b, h, i] = dO_i . O_i, one warp per row (with kStats, for the
/// tensor-core kernels: RowStats, the row's lse in log2 units beside it);
/// the row's f32 dQ sums zeroed where the one-pass backward keeps them
/// (p.grad_q_sum).
template <class T, bool kStats>
__global__ void __launch_bounds__(kThreads) attention_row_dots(const Problem p, void* ws) {
  using Acc = acc_of<T>;
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (!v.valid || i >= v.len_q) return;
  const int lane = threadIdx.x % 32;
  const T* g = p.grad_out.ptr<const T>(v.b, v.h, v.tok_q + i);
  const T* o = p.out.ptr<const T>(v.b, v.h, v.tok_q + i);
  Acc s = 0;
  for (int64_t d = lane; d < p.value_dim; d += 32) s += convert<Acc>(g[d * p.grad_out.dim]) * convert<Acc>(o[d * p.out.dim]);
  s = warp_sum(s);
  if (lane == 0) {
    if constexpr (kStats) {
      const float lse = *p.lse.ptr<const float>(v.b, v.h, v.tok_q + i);
      static_cast<RowStats*>(ws)[row_index(p, v, i)] = make_float2(lse == -INFINITY ? INFINITY : lse * kLog2e, s);
    } else {
      static_cast<Acc*>(ws)[row_index(p, v, i)] = s;
    }
  }
  if (p.grad_q_sum)
    for (int64_t d = lane; d < p.head_dim; d += 32) p.grad_q_sum[grad_q_sum_index(p, v, i, d)] = 0.f;
}

/// dQ from the one-pass backward's f32 sums (Note [One-pass Hopper backward]), one warp per row.
template <class T>
__global__ void __launch_bounds__(kThreads) attention_grad_q_from_sums(const Problem p) {
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t i = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (!v.valid || i >= v.len_q) return;
  T* out = p.grad_q.ptr<T>(v.b, v.h, v.tok_q + i);
  const float scale = float(p.scale);  // the one pass's dS leave it out (Note [The scale at the end])
  for (int64_t d = threadIdx.x % 32; d < p.head_dim; d += 32)
    out[d * p.grad_q.dim] = convert<T>(p.grad_q_sum[grad_q_sum_index(p, v, i, d)] * scale);
}

/// dQ for kRows query rows of one head: lanes over the keys of a tile.
template <class T>
__global__ void __launch_bounds__(kThreads) attention_grad_q(const Problem p, const acc_of<T>* ws) {
  using Acc = acc_of<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = int(p.head_dim), Dv = int(p.value_dim);
  Acc* sQ = reinterpret_cast<Acc*>(smem);  // [kRows][D]
  Acc* sG = sQ + kRows * D;                // [kRows][Dv]   grad_out
  Acc* sK = sG + kRows * Dv;               // [kKeys][D + 1]
  Acc* sV = sK + kKeys * (D + 1);          // [kKeys][Dv + 1]
  Acc* sS = sV + kKeys * (Dv + 1);         // [kRows][kKeys] dS
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = p.q.ptr<const T>(v.b, v.h, v.tok_q);
  const T* g = p.grad_out.ptr<const T>(v.b, v.h, v.tok_q);
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  load_rows<T, Acc>(sQ, D, q, p.q.seq, p.q.dim, row0, kRows, v.len_q, D);
  load_rows<T, Acc>(sG, Dv, g, p.grad_out.seq, p.grad_out.dim, row0, kRows, v.len_q, Dv);

  const int64_t last = min(row0 + kRows, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, last, span_lo, span_hi);

  Acc dq[kRowsPerWarp][kChunks], lse[kRowsPerWarp], rdot[kRowsPerWarp];
  int64_t lo[kRowsPerWarp], hi[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) dq[r][c] = 0;
    const int64_t i = row0 + warp * kRowsPerWarp + r;
    lo[r] = hi[r] = 0, lse[r] = neg_inf<Acc>(), rdot[r] = 0;
    if (i < v.len_q) {
      key_range(p, i, v.len_q, v.len_kv, lo[r], hi[r]);
      lse[r] = Acc(*p.lse.ptr<const Lse<T>>(v.b, v.h, v.tok_q + i));
      rdot[r] = ws[row_index(p, v, i)];
    }
  }

  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kKeys) {
    __syncthreads();
    load_rows<T, Acc>(sK, D + 1, k, p.k.seq, p.k.dim, k0, kKeys, v.len_kv, D);
    load_rows<T, Acc>(sV, Dv + 1, val, p.v.seq, p.v.dim, k0, kKeys, v.len_kv, Dv);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int rr = warp * kRowsPerWarp + r;
      const int64_t i = row0 + rr, j = k0 + lane;
      if (i >= v.len_q || lse[r] == neg_inf<Acc>()) continue;  // warp-uniform
      Acc ds = 0;
      if (j >= lo[r] && j < hi[r]) {
        Acc dot = 0, capped;
        for (int d = 0; d < D; ++d) dot += sQ[rr * D + d] * sK[lane * (D + 1) + d];
        const Acc s = score<Acc>(p, v, dot, i, j, capped);
        const Acc prob = s == neg_inf<Acc>() ? Acc(0) : exp(s - lse[r]);
        if (prob > 0) {
          Acc dprob = 0;
          for (int d = 0; d < Dv; ++d) dprob += sG[rr * Dv + d] * sV[lane * (Dv + 1) + d];
          ds = prob * (dropout_factor<Acc>(p, v, i, j) * dprob - rdot[r]) * score_slope<Acc>(p, capped);
        }
      }
      sS[rr * kKeys + lane] = ds;
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d >= D) break;
        Acc a = dq[r][c];
        for (int jj = 0; jj < kKeys; ++jj) a += sS[rr * kKeys + jj] * sK[jj * (D + 1) + d];
        dq[r][c] = a;
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = row0 + warp * kRowsPerWarp + r;
    if (i >= v.len_q) continue;
    T* out = p.grad_q.ptr<T>(v.b, v.h, v.tok_q + i);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < D) out[d * p.grad_q.dim] = convert<T>(dq[r][c]);
    }
  }
}

/// dK and dV for the keys of one block (kWarps * keys_per_warp) of one key
/// head: every query head of its group, every query tile of 32 rows (a lane
/// per row) that can see them, in order.
template <class T>
__global__ void __launch_bounds__(kThreads) attention_grad_kv(const Problem p, const acc_of<T>* ws) {
  using Acc = acc_of<T>;
  constexpr int kPerWarp = keys_per_warp(sizeof(Acc)), kBlockKeys = kWarps * kPerWarp;
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = int(p.head_dim), Dv = int(p.value_dim);
  Acc* sK = reinterpret_cast<Acc*>(smem);  // [kBlockKeys][D]
  Acc* sV = sK + kBlockKeys * D;           // [kBlockKeys][Dv]
  Acc* sQ = sV + kBlockKeys * Dv;          // [kRowsBwd][D + 1]
  Acc* sG = sQ + kRowsBwd * (D + 1);       // [kRowsBwd][Dv + 1]
  Acc* sL = sG + kRowsBwd * (Dv + 1);      // [kRowsBwd] lse
  Acc* sR = sL + kRowsBwd;                 // [kRowsBwd] dO . O
  const int64_t b = blockIdx.z, hk = blockIdx.y;
  const HeadView first = head_view(p, b, hk * p.group());
  const int64_t k0 = int64_t(blockIdx.x) * kBlockKeys;
  if (!first.valid || k0 >= first.len_kv) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* k = p.k.ptr<const T>(b, hk, first.tok_kv);
  const T* val = p.v.ptr<const T>(b, hk, first.tok_kv);
  load_rows<T, Acc>(sK, D, k, p.k.seq, p.k.dim, k0, kBlockKeys, first.len_kv, D);
  load_rows<T, Acc>(sV, Dv, val, p.v.seq, p.v.dim, k0, kBlockKeys, first.len_kv, Dv);
  const int64_t k_last = min(k0 + kBlockKeys, first.len_kv) - 1;

  Acc dk[kPerWarp][kChunks] = {}, dv[kPerWarp][kChunks] = {};
  for (int64_t h = hk * p.group(); h < (hk + 1) * p.group(); ++h) {
    const HeadView v = head_view(p, b, h);
    const T* q = p.q.ptr<const T>(b, h, v.tok_q);
    const T* g = p.grad_out.ptr<const T>(b, h, v.tok_q);
    for (int64_t i0 = 0; i0 < v.len_q; i0 += kRowsBwd) {
      int64_t lo_first, hi_first, lo_last, hi_last;
      key_range(p, i0, v.len_q, v.len_kv, lo_first, hi_first);
      key_range(p, min(i0 + kRowsBwd, v.len_q) - 1, v.len_q, v.len_kv, lo_last, hi_last);
      if (hi_last <= k0 || lo_first > k_last) continue;  // no row of the tile sees these keys (block-uniform)
      __syncthreads();
      load_rows<T, Acc>(sQ, D + 1, q, p.q.seq, p.q.dim, i0, kRowsBwd, v.len_q, D);
      load_rows<T, Acc>(sG, Dv + 1, g, p.grad_out.seq, p.grad_out.dim, i0, kRowsBwd, v.len_q, Dv);
      if (threadIdx.x < kRowsBwd) {
        const int64_t i = i0 + threadIdx.x;
        sL[threadIdx.x] = i < v.len_q ? Acc(*p.lse.ptr<const Lse<T>>(b, h, v.tok_q + i)) : neg_inf<Acc>();
        sR[threadIdx.x] = i < v.len_q ? ws[row_index(p, v, i)] : Acc(0);
      }
      __syncthreads();
      const int64_t i = i0 + lane;
      int64_t lo = 0, hi = 0;
      if (i < v.len_q) key_range(p, i, v.len_q, v.len_kv, lo, hi);
#pragma unroll
      for (int kk = 0; kk < kPerWarp; ++kk) {
        const int jj = warp * kPerWarp + kk;
        const int64_t j = k0 + jj;
        if (j >= v.len_kv) break;  // warp-uniform
        Acc pz = 0, ds = 0;
        if (j >= lo && j < hi && sL[lane] != neg_inf<Acc>()) {
          Acc dot = 0, capped;
          for (int d = 0; d < D; ++d) dot += sQ[lane * (D + 1) + d] * sK[jj * D + d];
          const Acc s = score<Acc>(p, v, dot, i, j, capped);
          const Acc prob = s == neg_inf<Acc>() ? Acc(0) : exp(s - sL[lane]);
          if (prob > 0) {
            const Acc z = dropout_factor<Acc>(p, v, i, j);
            Acc dprob = 0;
            for (int d = 0; d < Dv; ++d) dprob += sG[lane * (Dv + 1) + d] * sV[jj * Dv + d];
            pz = prob * z;
            ds = prob * (z * dprob - sR[lane]) * score_slope<Acc>(p, capped);
          }
        }
        for (int r = 0; r < kRowsBwd; ++r) {
          const Acc a = __shfl_sync(0xffffffffu, pz, r), e = __shfl_sync(0xffffffffu, ds, r);
          if (a == Acc(0) && e == Acc(0)) continue;  // uniform: broadcast values
#pragma unroll
          for (int c = 0; c < kChunks; ++c) {
            const int d = lane + 32 * c;
            if (d < Dv) dv[kk][c] += a * sG[r * (Dv + 1) + d];
            if (d < D) dk[kk][c] += e * sQ[r * (D + 1) + d];
          }
        }
      }
    }
  }
#pragma unroll
  for (int kk = 0; kk < kPerWarp; ++kk) {
    const int64_t j = k0 + warp * kPerWarp + kk;
    if (j >= first.len_kv) break;
    T* gk = p.grad_k.ptr<T>(b, hk, first.tok_kv + j);
    T* gv = p.grad_v.ptr<T>(b, hk, first.tok_kv + j);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < D) gk[d * p.grad_k.dim] = convert<T>(dk[kk][c]);
      if (d < Dv) gv[d * p.grad_v.dim] = convert<T>(dv[kk][c]);
    }
  }
}

template <class T>
struct CudaBackward {
  static Status run(const Problem& problem, const Workspace& w, CUstream_st* stream) {
    using Acc = acc_of<T>;
    if (problem.batch == 0 || problem.heads_q == 0) return Status::ok();
    constexpr bool kHalf = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
    Problem p = problem;
    p.grad_q_sum = nullptr;
    // One pass where the plan chose it; a workspace too small or off the bulk copy's 16 bytes runs two.
    if constexpr (kHalf)
      if (wgmma_one_pass(p, current_sm_version(), current_optin_smem()) && w.bytes >= one_pass_workspace(p) &&
          reinterpret_cast<uintptr_t>(w.data) % 16 == 0)
        p.grad_q_sum = reinterpret_cast<float*>(static_cast<char*>(w.data) + grad_q_sum_offset(p));
    const dim3 rows(unsigned((p.seq_q + kWarps - 1) / kWarps), unsigned(p.heads_q), unsigned(p.batch));
    if constexpr (kHalf) {
      const bool wgmma = p.grad_q_sum || wgmma_backward_layout(p, current_sm_version(), current_optin_smem());
      if (wgmma || (tensor_core_layout(p, current_sm_version()) &&
                    tc_backward_smem(tc_head_dim(p.head_dim)) <= current_optin_smem())) {
        const auto* stats = static_cast<const RowStats*>(w.data);
        if (p.seq_q > 0) {
          attention_row_dots<T, true><<<rows, kThreads, 0, stream>>>(p, w.data);
          BARACUDA_CUDA_TRY(cudaGetLastError());
        }
        if (!wgmma) return attention_backward_tc<T>(p, stats, stream);
        BARACUDA_TRY(attention_backward_wgmma<T>(p, stats, stream));
        if (p.grad_q_sum && p.seq_q > 0) {
          attention_grad_q_from_sums<T><<<rows, kThreads, 0, stream>>>(p);
          BARACUDA_CUDA_TRY(cudaGetLastError());
        }
        return Status::ok();
      }
    }
    const Acc* ws = static_cast<const Acc*>(w.data);
    if (p.seq_q > 0) {
      attention_row_dots<T, false><<<rows, kThreads, 0, stream>>>(p, w.data);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    if (p.seq_q > 0) {
      const size_t smem = grad_q_smem(p.head_dim, p.value_dim, sizeof(Acc));
      BARACUDA_TRY(allow_smem(attention_grad_q<T>, smem));
      const dim3 grid(unsigned((p.seq_q + kRows - 1) / kRows), unsigned(p.heads_q), unsigned(p.batch));
      attention_grad_q<T><<<grid, kThreads, smem, stream>>>(p, ws);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    if (p.seq_kv > 0) {
      const int block_keys = kWarps * keys_per_warp(sizeof(Acc));
      const size_t smem = grad_kv_smem(p.head_dim, p.value_dim, sizeof(Acc));
      BARACUDA_TRY(allow_smem(attention_grad_kv<T>, smem));
      const dim3 grid(unsigned((p.seq_kv + block_keys - 1) / block_keys), unsigned(p.heads_kv), unsigned(p.batch));
      attention_grad_kv<T><<<grid, kThreads, smem, stream>>>(p, ws);
      BARACUDA_CUDA_TRY(cudaGetLastError());
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered =
    register_launchers<FloatTypes, CudaBackward>(cuda_attention(), "attention_backward");

}  // namespace
}  // namespace baracuda::attn
