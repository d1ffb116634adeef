// The bespoke attention forward on Hopper (sm_90a): tensor maps, the launch
// (the kernel: hopper_forward.cuh, Note [Hopper forward]) and the self-tests
// of its products and tile loads.
#include "attention/hopper_forward.cuh"
#include "attention/tensor_map.cuh"

#include <cstring>
#include <vector>

namespace baracuda::attn {

namespace {

using hopper::TmaMaps;

/// TMA where every operand takes it (dense sequences: a packed one's rows
/// past its length belong to the next, not zeros), cp.async elsewhere.
template <class T, int kD>
Status launch_sm90(const Problem& p, CUstream_st* stream) {
  TmaMaps maps{};
  // Maps of the operands' own head dims: a box's columns past them (a head
  // dim padded to kD) land as zeros.
  const bool tma = !p.varlen() && make_tensor_map<T>(maps.q, p.q, p.batch, p.heads_q, p.seq_q, p.head_dim, kWgRows) &&
                   make_tensor_map<T>(maps.k, p.k, p.batch, p.heads_kv, p.seq_kv, p.head_dim, kWgKeys) &&
                   make_tensor_map<T>(maps.v, p.v, p.batch, p.heads_kv, p.seq_kv, p.value_dim, kWgKeys);
  // Dropout's draws cost the softmax registers: kernels without them serve the rest.
  if (p.dropout_p > 0)
    return tma ? hopper::launch_dropout<T, kD, true>(maps, p, stream) : hopper::launch_dropout<T, kD, false>(maps, p, stream);
  return tma ? hopper::launch_kernel<T, kD, true, false>(maps, p, stream)
             : hopper::launch_kernel<T, kD, false, false>(maps, p, stream);
}

// ---------------------------------------------------------------- self-test

/// One warpgroup: S = A B^T (A [64][kD], B [128][kD]) through wgmma_scores,
/// then O = P C (P = S rounded to T, C [128][kD]) through wgmma_values, each
/// written out [row][col] in f32.
template <class T, int kD>
__global__ void __launch_bounds__(128) wgmma_probe(const T* a, const T* b, const T* c, float* s_out, float* o_out) {
#ifdef BARACUDA_WGMMA
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sA = reinterpret_cast<T*>(swizzle_aligned(smem_raw));
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
  std::vector<float> s(64 * 128), o(64 * kD);
  BARACUDA_TRY(run_probe_kernel(wgmma_probe<T, kD>, (a.size() + b.size() + c.size()) * sizeof(T) + 1024, a, b, c,
                                s, o));
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

/// One block of 128 threads loads the same 128-row tile of a [b, h, s, dims]
/// tensor (dims <= kD) twice, by TMA (tensor map `map`, thread 0) and by
/// cp.async (issue_swizzled), into kD columns, and writes both shared-memory
/// images out byte for byte.
template <class T, int kD>
__global__ void __launch_bounds__(128)
    tma_probe(const __grid_constant__ CUtensorMap map, const T* tile_rows, int64_t seq, int64_t len, int row0, int h,
              int b, int dims, unsigned char* tma_out, unsigned char* cp_out) {
#ifdef BARACUDA_WGMMA
  constexpr int kBytes = 128 * kD * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sTma = swizzle_aligned(smem_raw);
  unsigned char* sCp = sTma + kBytes;
  const uint32_t bar = shared_address(sCp + kBytes);
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    mbar_fence_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbar_expect_tx(bar, kBytes);
    for (int cb = 0; cb < kD / 64; ++cb) tma_load_4d(sTma + cb * 128 * 128, &map, 64 * cb, row0, h, b, bar);
  }
  issue_swizzled<kD, 128, 128>(reinterpret_cast<T*>(sCp), tile_rows, seq, row0, len, dims);
  cp_async_commit();
  cp_async_wait<0>();
  mbar_wait(bar, 0);
  __syncthreads();
  for (int e = threadIdx.x; e < kBytes; e += 128) tma_out[e] = sTma[e], cp_out[e] = sCp[e];
#endif
}

/// Loads the tile of rows 128..255 of head 2, batch 1 of a [2, 3, 200, dims]
/// tensor into kD columns (rows 200.. past the end and columns dims.. past
/// the head dim: zeros) both ways and compares each with the swizzled image
/// computed here.
template <class T, int kD>
Result<TmaCheck> run_tma_probe(int dims) {
  constexpr int64_t kB = 2, kH = 3, kS = 200, kRow0 = 128, kHead = 2, kBatch = 1;
  constexpr size_t kBytes = 128 * kD * sizeof(T);
  std::vector<T> x(size_t(kB * kH * kS * dims));
  for (size_t i = 0; i < x.size(); ++i) x[i] = convert<T>(float(int(i * 7 % 251) - 125));
  std::vector<unsigned char> want(kBytes, 0), tma(kBytes), cp(kBytes);
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < dims / 8; ++c) {
      const int64_t row = kRow0 + r;
      if (row >= kS) continue;
      std::memcpy(want.data() + swizzled_chunk(128, r, c),
                  &x[size_t(((kBatch * kH + kHead) * kS + row) * dims + c * 8)], 16);
    }
  ProbeBuffers buffers;
  T* dx = nullptr;
  unsigned char *dt = nullptr, *dc = nullptr;
  BARACUDA_TRY(buffers.upload(dx, x));
  BARACUDA_TRY(buffers.poisoned(dt, kBytes));
  BARACUDA_TRY(buffers.poisoned(dc, kBytes));
  Operand o;
  o.data = reinterpret_cast<char*>(dx);
  o.batch = kH * kS * dims, o.head = kS * dims, o.seq = dims, o.dim = 1;
  CUtensorMap map{};
  if (!make_tensor_map<T>(map, o, kB, kH, kS, dims, 128))
    return unsupported("tma_self_test: cuTensorMapEncodeTiled refused a contiguous [2, 3, 200, ", dims, "] tensor");
  const size_t smem = 2 * kBytes + 1024 + 8;
  BARACUDA_TRY(allow_smem(tma_probe<T, kD>, smem));
  const T* rows = dx + (kBatch * kH + kHead) * kS * dims;
  tma_probe<T, kD><<<1, 128, smem>>>(map, rows, dims, kS, int(kRow0), int(kHead), int(kBatch), dims, dt, dc);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  BARACUDA_TRY(ProbeBuffers::download(tma, dt));
  BARACUDA_TRY(ProbeBuffers::download(cp, dc));
  TmaCheck check;
  for (size_t e = 0; e < kBytes; ++e) check.tma_bytes += tma[e] != want[e], check.cp_async_bytes += cp[e] != want[e];
  return check;
}

}  // namespace

template <class T>
Status attention_forward_wgmma(const Problem& p, CUstream_st* stream) {
  return tc_head_dim(p.head_dim) == 64 ? launch_sm90<T, 64>(p, stream) : launch_sm90<T, 128>(p, stream);
}
template Status attention_forward_wgmma<__half>(const Problem&, CUstream_st*);
template Status attention_forward_wgmma<__nv_bfloat16>(const Problem&, CUstream_st*);

Result<WgmmaCheck> wgmma_self_test(DType dtype, int head_dim) {
  if ((dtype != DType::f16 && dtype != DType::bf16) || (head_dim != 64 && head_dim != 128))
    return invalid("wgmma_self_test: f16/bf16 with head dim 64 or 128, got ", dtype_name(dtype), " and ", head_dim);
  if (dtype == DType::f16) return head_dim == 64 ? run_probe<__half, 64>() : run_probe<__half, 128>();
  return head_dim == 64 ? run_probe<__nv_bfloat16, 64>() : run_probe<__nv_bfloat16, 128>();
}

Result<TmaCheck> tma_self_test(DType dtype, int head_dim) {
  if ((dtype != DType::f16 && dtype != DType::bf16) || head_dim % 8 || head_dim < 8 || head_dim > 128)
    return invalid("tma_self_test: f16/bf16 with a head dim a multiple of 8 up to 128, got ", dtype_name(dtype),
                   " and ", head_dim);
  const bool narrow = tc_head_dim(head_dim) == 64;
  if (dtype == DType::f16) return narrow ? run_tma_probe<__half, 64>(head_dim) : run_tma_probe<__half, 128>(head_dim);
  return narrow ? run_tma_probe<__nv_bfloat16, 64>(head_dim) : run_tma_probe<__nv_bfloat16, 128>(head_dim);
}

}  // namespace baracuda::attn
