// The bespoke CUDA attention forward, kernels that never materialise the
// score matrix:
// - f16/bf16 with head dims 64 or 128 and 16-byte friendly rows on sm_90:
//   the warpgroup-MMA kernel of kernels_fwd_sm90.cu.
// - the same layouts on other archs (sm_80+), and other head dims that are
//   multiples of 8 up to 128 (padded with zero columns: tc_head_dim):
//   flash attention on tensor cores (mma.sync m16n8k16, f32 accumulators):
//   a block per 64 query rows (16 per warp), 64-key tiles of K and V
//   double-buffered in shared memory by cp.async, S = Q K^T and O += P V
//   from registers, online softmax; tiles every row sees whole skip the
//   per-element score rule.
// - everything else (f32, f64, other head dims, any strides): one block per
//   16 query rows, 32-key tiles, a lane per key for the scores and a lane
//   per 32nd dim for the output, on CUDA cores.
// All apply the whole score rule (mask, window, ALiBi, softcap, dropout).
#include "attention/tensor_core.cuh"

namespace baracuda::attn {

namespace {

template <class T>
__global__ void __launch_bounds__(kThreads) attention_forward(const Problem p) {
  using Acc = acc_of<T>;
  extern __shared__ __align__(16) unsigned char smem[];
  const int D = int(p.head_dim), Dv = int(p.value_dim);
  Acc* sQ = reinterpret_cast<Acc*>(smem);  // [kRows][D]
  Acc* sK = sQ + kRows * D;                // [kKeys][D + 1]
  Acc* sV = sK + kKeys * (D + 1);          // [kKeys][Dv]
  Acc* sP = sV + kKeys * Dv;               // [kRows][kKeys]
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kRows;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const T* q = p.q.ptr<const T>(v.b, v.h, v.tok_q);
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  load_rows<T, Acc>(sQ, D, q, p.q.seq, p.q.dim, row0, kRows, v.len_q, D);

  const int64_t last = min(row0 + kRows, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, last, span_lo, span_hi);

  Acc m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kChunks];
  int64_t lo[kRowsPerWarp], hi[kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    m[r] = neg_inf<Acc>(), l[r] = 0;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[r][c] = 0;
    const int64_t i = row0 + warp * kRowsPerWarp + r;
    lo[r] = hi[r] = 0;
    if (i < v.len_q) key_range(p, i, v.len_q, v.len_kv, lo[r], hi[r]);
  }

  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kKeys) {
    __syncthreads();  // the previous tile is consumed (and sQ is loaded)
    load_rows<T, Acc>(sK, D + 1, k, p.k.seq, p.k.dim, k0, kKeys, v.len_kv, D);
    load_rows<T, Acc>(sV, Dv, val, p.v.seq, p.v.dim, k0, kKeys, v.len_kv, Dv);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int rr = warp * kRowsPerWarp + r;
      const int64_t i = row0 + rr, j = k0 + lane;
      if (i >= v.len_q) continue;  // warp-uniform
      Acc s = neg_inf<Acc>();
      if (j >= lo[r] && j < hi[r]) {
        Acc dot = 0, capped;
        for (int d = 0; d < D; ++d) dot += sQ[rr * D + d] * sK[lane * (D + 1) + d];
        s = score<Acc>(p, v, dot, i, j, capped);
      }
      const Acc m_new = max(m[r], warp_max(s));
      if (m_new == neg_inf<Acc>()) continue;  // nothing visible yet (warp-uniform)
      const Acc prob = s == neg_inf<Acc>() ? Acc(0) : exp(s - m_new);
      const Acc corr = m[r] == neg_inf<Acc>() ? Acc(0) : exp(m[r] - m_new);
      l[r] = l[r] * corr + warp_sum(prob);
      m[r] = m_new;
      sP[rr * kKeys + lane] = prob > 0 ? prob * dropout_factor<Acc>(p, v, i, j) : Acc(0);
      __syncwarp();
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int d = lane + 32 * c;
        if (d >= Dv) break;
        Acc a = acc[r][c] * corr;
        for (int jj = 0; jj < kKeys; ++jj) a += sP[rr * kKeys + jj] * sV[jj * Dv + d];
        acc[r][c] = a;
      }
      __syncwarp();
    }
  }

  using Lse = acc_of<T>;
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t i = row0 + warp * kRowsPerWarp + r;
    if (i >= v.len_q) continue;
    const Acc inv = l[r] > 0 ? Acc(1) / l[r] : Acc(0);
    T* out = p.out.ptr<T>(v.b, v.h, v.tok_q + i);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int d = lane + 32 * c;
      if (d < Dv) out[d * p.out.dim] = convert<T>(acc[r][c] * inv);
    }
    if (lane == 0)
      *p.lse.ptr<Lse>(v.b, v.h, v.tok_q + i) = l[r] > 0 ? m[r] + log(l[r]) : neg_inf<Acc>();
  }
}


// ---------------------------------------------------------------- tensor cores

/// Two stages of K and V tiles (Q is staged once in the second stage's K tile).
template <int kD>
constexpr size_t tc_smem() {
  return size_t(4 * tc_tile<kD>()) * 2;
}

template <class T, int kD>
__global__ void __launch_bounds__(kTcThreads) attention_forward_tc(const Problem p) {
  constexpr int kPitch = kD + 8, kKeyTiles = kTcKeys / 8, kDimTiles = kD / 8, kTile = kTcKeys * kPitch;
  extern __shared__ __align__(16) unsigned char smem[];
  T* const sK = reinterpret_cast<T*>(smem);  // stage s at sK + 2 s kTile: K, then V (no array: local memory)
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kTcRows;
  if (!v.valid || row0 >= v.len_q) return;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, quad = lane % 4;
  const int dims = int(p.head_dim);  // kD or less (padded: tc_head_dim)
  const T* q = p.q.ptr<const T>(v.b, v.h, v.tok_q);
  const T* k = p.k.ptr<const T>(v.b, v.hk, v.tok_kv);
  const T* val = p.v.ptr<const T>(v.b, v.hk, v.tok_kv);
  const int64_t row_last = min(row0 + kTcRows, v.len_q) - 1;
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, row_last, span_lo, span_hi);

  // Q through stage 1's K tile into registers; stage 0 starts loading meanwhile.
  issue_tile<kD>(sK + 2 * kTile, q, p.q.seq, row0, v.len_q, dims);
  cp_async_commit();
  if (span_lo < span_hi) {
    issue_tile<kD>(sK, k, p.k.seq, span_lo, v.len_kv, dims);
    issue_tile<kD>(sK + kTile, val, p.v.seq, span_lo, v.len_kv, dims);
  }
  cp_async_commit();
  cp_async_wait<1>();
  __syncthreads();
  uint32_t qf[kD / 16][4];  // this warp's 16 rows as A fragments
#pragma unroll
  for (int kd = 0; kd < kD / 16; ++kd)
    ldmatrix_x4(qf[kd], sK + 2 * kTile + (warp * 16 + lane % 16) * kPitch + kd * 16 + (lane / 16) * 8);
  __syncthreads();  // stage 1 is free for the next tile

  // This thread's rows: g and g + 8 of the warp's 16.
  const FragRows f(p, v, row0 + warp * 16 + lane / 4);
  const ScoreScales scales(p);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  float o[kDimTiles][4] = {};
  int stage = 0;
  for (int64_t k0 = span_lo; k0 < span_hi; k0 += kTcKeys, stage ^= 1) {
    await_kv_stage<kD>(sK + 2 * (stage ^ 1) * kTile, k, p.k.seq, val, p.v.seq, k0 + kTcKeys, span_hi, v.len_kv, dims);
    const T* tK = sK + 2 * stage * kTile;
    const T* tV = tK + kTile;
    float s[kKeyTiles][4] = {};
#pragma unroll
    for (int np = 0; np < kKeyTiles / 2; ++np)
#pragma unroll
      for (int kd = 0; kd < kD / 16; ++kd) {
        uint32_t b[4];
        ldmatrix_x4(b, tK + (np * 16 + (lane & 7) + ((lane >> 4) << 3)) * kPitch + kd * 16 + ((lane >> 3) & 1) * 8);
        mma_16x8x16<T>(s[2 * np], qf[kd], b[0], b[1]);
        mma_16x8x16<T>(s[2 * np + 1], qf[kd], b[2], b[3]);
      }
    // The score rule (only scale where the whole tile is visible), then the
    // online softmax over this tile.
    float tile_max[2];
    tile_scores(s, tile_max, p, v, f, k0, quad,
                tile_whole(p, v, row0, row_last, k0, kTcKeys) ? inline_rule(p, true) : TileRule::full, scales);
    online_softmax(s, o, m, l, tile_max, p, v, f, k0, quad);
    // O += P V: the probabilities of two key tiles form one A fragment.
#pragma unroll
    for (int kk = 0; kk < kTcKeys / 16; ++kk) {
      const uint32_t a[4] = {pack2<T>(s[2 * kk][0], s[2 * kk][1]), pack2<T>(s[2 * kk][2], s[2 * kk][3]),
                             pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]), pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kD / 16; ++dp) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tV + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kPitch + dp * 16 + (lane >> 4) * 8);
        mma_16x8x16<T>(o[2 * dp], a, b[0], b[1]);
        mma_16x8x16<T>(o[2 * dp + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is refilled two tiles on
  }
  cp_async_wait<0>();
  write_rows<T>(p, v, f, o, m, l, quad);
}

template <class T, int kD>
Status launch_tc(const Problem& p, CUstream_st* stream) {
  constexpr size_t smem = tc_smem<kD>();
  BARACUDA_TRY(allow_smem(attention_forward_tc<T, kD>, smem));
  const dim3 grid(unsigned((p.seq_q + kTcRows - 1) / kTcRows), unsigned(p.heads_q), unsigned(p.batch));
  attention_forward_tc<T, kD><<<grid, kTcThreads, smem, stream>>>(p);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// ---------------------------------------------------------------- launch

template <class T>
struct CudaForward {
  static Status run(const Problem& p, const Workspace&, CUstream_st* stream) {
    if (p.batch == 0 || p.heads_q == 0 || p.seq_q == 0) return Status::ok();
    if constexpr (std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>) {
      const int sm = current_sm_version();
      if (wgmma_layout(p, sm, current_sm_count(), current_optin_smem())) return attention_forward_wgmma<T>(p, stream);
      if (tensor_core_layout(p, sm))
        return tc_head_dim(p.head_dim) == 64 ? launch_tc<T, 64>(p, stream) : launch_tc<T, 128>(p, stream);
    }
    const size_t smem = forward_smem(p.head_dim, p.value_dim, sizeof(acc_of<T>));
    BARACUDA_TRY(allow_smem(attention_forward<T>, smem));
    const dim3 grid(unsigned((p.seq_q + kRows - 1) / kRows), unsigned(p.heads_q), unsigned(p.batch));
    attention_forward<T><<<grid, kThreads, smem, stream>>>(p);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_launchers<FloatTypes, CudaForward>(cuda_attention(), "attention");

}  // namespace
}  // namespace baracuda::attn
