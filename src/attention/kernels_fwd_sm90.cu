// The bespoke attention forward on Hopper (sm_90a): warpgroup MMA.
//
// Note [Hopper forward]
// A block of 256 threads takes 128 query rows of one (batch, head): two
// warpgroups of 64 rows each. Q (128 x D) is staged once; K and V tiles of
// 128 keys stream through a ring of stages (3 at D 64, 2 at D 128), copied by
// every thread with cp.async into the 128-byte swizzled layout
// (wgmma_sm90.cuh). Per key tile each warpgroup issues S = Q K^T
// (wgmma m64n128k16, both operands in shared memory, D / 16 steps), applies
// the score rule and the online softmax in registers exactly as the mma.sync
// kernel does (tensor_core.cuh: tile_scores, online_softmax, write_rows;
// scores in log2 units, the rule element by element only on tiles that need
// it), converts P to f16/bf16 A fragments in registers and issues O += P V
// (wgmma m64nDk16, V read N-major), 8 steps of 16 keys. Sums run in a fixed
// order: deterministic. A stage is refilled one iteration after its last
// use, behind a block barrier; the copies are fenced into wgmma's async
// proxy before the barrier that publishes them.
// Not yet done (issue 4): TMA loads with mbarriers and a producer warp,
// overlapping the softmax of one tile with the products of the next.
#include "attention/tensor_core.cuh"
#include "attention/wgmma_sm90.cuh"

#include <vector>

namespace baracuda::attn {

namespace {

template <class T, int kD>
__global__ void __launch_bounds__(kWgThreads, 1) attention_forward_sm90(const Problem p) {
#ifdef BARACUDA_WGMMA
  constexpr int kStages = wgmma_stages(kD), kTile = kWgKeys * kD;  // halves of a K or V tile
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled tiles start on 1024 bytes (the plan counts the slack).
  T* sQ = reinterpret_cast<T*>(smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023));  // [kD/64][128][64]
  T* sKV = sQ + kWgRows * kD;  // stage s: K at sKV + 2 s kTile, V after it
  const HeadView v = head_view(p, blockIdx.z, blockIdx.y);
  const int64_t row0 = int64_t(blockIdx.x) * kWgRows;
  if (!v.valid || row0 >= v.len_q) return;
  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, quad = lane % 4;
  const T* q = reinterpret_cast<const T*>(p.q.data) + p.q.at(v.b, v.h, v.tok_q);
  const T* k = reinterpret_cast<const T*>(p.k.data) + p.k.at(v.b, v.hk, v.tok_kv);
  const T* val = reinterpret_cast<const T*>(p.v.data) + p.v.at(v.b, v.hk, v.tok_kv);
  int64_t span_lo, span_hi;
  tile_key_span(p, v, row0, min(row0 + kWgRows, v.len_q) - 1, span_lo, span_hi);
  const int tiles = span_lo < span_hi ? int((span_hi - span_lo + kWgKeys - 1) / kWgKeys) : 0;
  auto issue_kv = [&](int t) {
    T* dst = sKV + 2 * (t % kStages) * kTile;
    const int64_t k0 = span_lo + int64_t(t) * kWgKeys;
    issue_swizzled<kD, kWgKeys, kWgThreads>(dst, k, p.k.seq, k0, v.len_kv);
    issue_swizzled<kD, kWgKeys, kWgThreads>(dst + kTile, val, p.v.seq, k0, v.len_kv);
  };
  // Group 0: Q and tile 0; group s: tile s.
  issue_swizzled<kD, kWgRows, kWgThreads>(sQ, q, p.q.seq, row0, v.len_q);
#pragma unroll
  for (int t = 0; t < kStages - 1; ++t) {
    if (t < tiles) issue_kv(t);
    cp_async_commit();
  }

  // This warpgroup's rows and this thread's two of them.
  const int64_t wg_first = row0 + 64 * wg, wg_last = max(min(wg_first + 63, v.len_q - 1), wg_first);
  const FragRows f(p, v, wg_first + warp * 16 + lane / 4);
  const T* sQw = sQ + 64 * wg * 64;  // row 64 wg of every column block
  const float scale_log2 = float(p.scale * 1.4426950408889634);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
  float o[kD / 8][4] = {};
  for (int t = 0; t < tiles; ++t) {
    if (t + kStages - 1 < tiles) issue_kv(t + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // tile t (and Q) landed, for this thread's copies
    fence_proxy_async();
    __syncthreads();  // ... and for every thread's
    const T* tK = sKV + 2 * (t % kStages) * kTile;
    const int64_t k0 = span_lo + int64_t(t) * kWgKeys;
    float s[kWgKeys / 8][4];
    wgmma_scores<T, kD>(s, sQw, kWgRows, tK);
    float tile_max[2];
    tile_scores(s, tile_max, p, v, f, k0, quad, tile_plain(p, v, wg_first, wg_last, k0, kWgKeys), scale_log2);
    online_softmax(s, o, m, l, tile_max, p, v, f, k0, quad);
    wgmma_values<T, kD>(o, s, tK + kTile);
    __syncthreads();  // stage t % kStages is refilled next iteration
  }
  cp_async_wait<0>();
  write_rows<T>(p, v, f, o, m, l, quad);
#endif
}

template <class T, int kD>
Status launch_sm90(const Problem& p, CUstream_st* stream) {
  constexpr size_t smem = wgmma_forward_smem(kD);
  BARACUDA_TRY(allow_smem(attention_forward_sm90<T, kD>, smem));
  const dim3 grid(unsigned((p.seq_q + kWgRows - 1) / kWgRows), unsigned(p.heads_q), unsigned(p.batch));
  attention_forward_sm90<T, kD><<<grid, kWgThreads, smem, stream>>>(p);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

// ---------------------------------------------------------------- self-test

/// One warpgroup: S = A B^T (A [64][kD], B [128][kD]) through wgmma_scores,
/// then O = P C (P = S rounded to T, C [128][kD]) through wgmma_values, each
/// written out [row][col] in f32.
template <class T, int kD>
__global__ void __launch_bounds__(128) wgmma_probe(const T* a, const T* b, const T* c, float* s_out, float* o_out) {
#ifdef BARACUDA_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023));
  T* sB = sA + 64 * kD;
  T* sC = sB + 128 * kD;
  issue_swizzled<kD, 64, 128>(sA, a, kD, 0, 64);
  issue_swizzled<kD, 128, 128>(sB, b, kD, 0, 128);
  issue_swizzled<kD, 128, 128>(sC, c, kD, 0, 128);
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, quad = lane % 4;
  float s[16][4];
  wgmma_scores<T, kD>(s, sA, 64, sB);
  for (int n = 0; n < 16; ++n)
    for (int e = 0; e < 4; ++e) s_out[(warp * 16 + g + 8 * (e / 2)) * 128 + 8 * n + 2 * quad + e % 2] = s[n][e];
  float o[kD / 8][4] = {};
  wgmma_values<T, kD>(o, s, sC);
  for (int n = 0; n < kD / 8; ++n)
    for (int e = 0; e < 4; ++e) o_out[(warp * 16 + g + 8 * (e / 2)) * kD + 8 * n + 2 * quad + e % 2] = o[n][e];
#endif
}

/// Small integers so that every product and sum is exact in f32.
template <class T, int kD>
Result<WgmmaCheck> run_probe() {
  std::vector<T> a(64 * kD), b(128 * kD), c(128 * kD);
  std::vector<float> fa(a.size()), fb(b.size()), fc(c.size());
  for (size_t i = 0; i < a.size(); ++i) fa[i] = float(int(i * 7 % 5) - 2), a[i] = convert<T>(fa[i]);
  for (size_t i = 0; i < b.size(); ++i) fb[i] = float(int(i * 11 % 5) - 2), b[i] = convert<T>(fb[i]);
  for (size_t i = 0; i < c.size(); ++i) fc[i] = float(int(i * 13 % 3) - 1), c[i] = convert<T>(fc[i]);
  T *da = nullptr, *db = nullptr, *dc = nullptr;
  float *ds = nullptr, *dout = nullptr;
  std::vector<float> s(64 * 128), o(64 * kD);
  const size_t smem = (a.size() + b.size() + c.size()) * sizeof(T) + 1024;
  auto run = [&]() -> Status {
    BARACUDA_CUDA_TRY(cudaMalloc(&da, a.size() * sizeof(T)));
    BARACUDA_CUDA_TRY(cudaMalloc(&db, b.size() * sizeof(T)));
    BARACUDA_CUDA_TRY(cudaMalloc(&dc, c.size() * sizeof(T)));
    BARACUDA_CUDA_TRY(cudaMalloc(&ds, s.size() * sizeof(float)));
    BARACUDA_CUDA_TRY(cudaMalloc(&dout, o.size() * sizeof(float)));
    BARACUDA_CUDA_TRY(cudaMemcpy(da, a.data(), a.size() * sizeof(T), cudaMemcpyHostToDevice));
    BARACUDA_CUDA_TRY(cudaMemcpy(db, b.data(), b.size() * sizeof(T), cudaMemcpyHostToDevice));
    BARACUDA_CUDA_TRY(cudaMemcpy(dc, c.data(), c.size() * sizeof(T), cudaMemcpyHostToDevice));
    BARACUDA_CUDA_TRY(cudaMemset(ds, 0xff, s.size() * sizeof(float)));  // NaN until written
    BARACUDA_CUDA_TRY(cudaMemset(dout, 0xff, o.size() * sizeof(float)));
    BARACUDA_TRY(allow_smem(wgmma_probe<T, kD>, smem));
    wgmma_probe<T, kD><<<1, 128, smem>>>(da, db, dc, ds, dout);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    BARACUDA_CUDA_TRY(cudaMemcpy(s.data(), ds, s.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BARACUDA_CUDA_TRY(cudaMemcpy(o.data(), dout, o.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return Status::ok();
  };
  const Status st = run();
  for (void* ptr : {static_cast<void*>(da), static_cast<void*>(db), static_cast<void*>(dc), static_cast<void*>(ds),
                    static_cast<void*>(dout)})
    if (ptr) (void)cudaFree(ptr);
  if (!st.is_ok()) return st;
  WgmmaCheck check;
  std::vector<float> prob(64 * 128);
  for (int i = 0; i < 64; ++i)
    for (int j = 0; j < 128; ++j) {
      double want = 0;
      for (int d = 0; d < kD; ++d) want += double(fa[i * kD + d]) * fb[j * kD + d];
      const double got = s[i * 128 + j];
      check.scores = std::isnan(got) ? INFINITY : std::max(check.scores, std::abs(got - want));
      prob[i * 128 + j] = convert<float>(convert<T>(float(want)));
    }
  for (int i = 0; i < 64; ++i)
    for (int d = 0; d < kD; ++d) {
      double want = 0;
      for (int j = 0; j < 128; ++j) want += double(prob[i * 128 + j]) * fc[j * kD + d];
      const double got = o[i * kD + d];
      check.output = std::isnan(got) ? INFINITY : std::max(check.output, std::abs(got - want));
    }
  return check;
}

}  // namespace

template <class T>
Status attention_forward_wgmma(const Problem& p, CUstream_st* stream) {
  return p.head_dim == 64 ? launch_sm90<T, 64>(p, stream) : launch_sm90<T, 128>(p, stream);
}
template Status attention_forward_wgmma<__half>(const Problem&, CUstream_st*);
template Status attention_forward_wgmma<__nv_bfloat16>(const Problem&, CUstream_st*);

Result<WgmmaCheck> wgmma_self_test(DType dtype, int head_dim) {
  if ((dtype != DType::f16 && dtype != DType::bf16) || (head_dim != 64 && head_dim != 128))
    return invalid("wgmma_self_test: f16/bf16 with head dim 64 or 128, got ", dtype_name(dtype), " and ", head_dim);
  if (dtype == DType::f16) return head_dim == 64 ? run_probe<__half, 64>() : run_probe<__half, 128>();
  return head_dim == 64 ? run_probe<__nv_bfloat16, 64>() : run_probe<__nv_bfloat16, 128>();
}

}  // namespace baracuda::attn
