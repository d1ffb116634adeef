// The bespoke attention forward on Hopper (sm_90a): warpgroup MMA, warp
// specialisation and TMA (FlashAttention-3's structure).
//
// Note [Hopper forward]
// A block of 384 threads takes 128 query rows of one (batch, head) in three
// warpgroups. Warpgroup 0 is the producer: it gives registers back
// (setmaxnreg) and loads Q once and the K and V tiles of 128 keys into a
// ring of stages (3 at D 64, 2 at D 128) in the 128-byte swizzled layout
// (wgmma_sm90.cuh), by TMA (one thread; a tensor map per operand built in
// `run`, boxes of 64 dims by 128 rows, rows past the sequence zero-filled)
// or, where TMA cannot take the operand (packed sequences, strides TMA
// refuses), by cp.async from its 128 threads. Each stage has four mbarriers:
// K full, V full (the producer's arrivals and bytes), K empty, V empty (one
// arrival from each consumer warp once its products have read the tile);
// Note [mbarriers and TMA]. Warpgroups 1 and 2 consume, 64 rows each:
//   S_0 = Q K_0^T; softmax_0
//   for j >= 1: issue S_j = Q K_j^T; rescale O by softmax_{j-1}'s factors
//               while it runs; issue O += P_{j-1} V_{j-1};
//               wait for S_j (wgmma.wait_group 1), release K_j;
//               score rule and softmax of S_j while P_{j-1} V_{j-1} runs;
//               wait for it, release V_{j-1}, P_j = S_j as A fragments
//   rescale O; O += P_last V_last
// (the online softmax and the epilogue are the mma.sync kernel's:
// tensor_core.cuh). The block visits only the key tiles its rows may see
// (tile_key_span: none past the causal diagonal or outside the window), and
// the loop runs in three phases, each specialised on its score rule
// (TileRule): the tiles every row of the warpgroup sees whole take the scale
// alone (deferred into the exponent's fused multiply-add: tile_scores); the
// few on the window's left edge before them and on the causal diagonal or
// the window's right edge after them take the key-range test alone (-inf
// outside each row's range); a softcap is inline in both (tanh
// on the special-function unit); a problem with a mask or ALiBi takes the
// whole rule on every tile. The two consumers take turns
// issuing their products (named barriers 1 and 2, "ping-pong"): while one
// warpgroup's products run on the tensor cores the other computes its
// softmax. Consumer 1 arrives on consumer 0's barrier first, so consumer 0
// issues first; each consumer syncs on its own barrier and arrives on the
// other's once a tile, and consumer 0 takes the one extra arrival at the
// end. Sums run in a fixed order: deterministic.
//
// Note [Hopper persistent blocks]
// The grid is one block an SM (at most one fits: 384 threads of 168
// registers), and block i takes entries i, i + grid, ... of the order below
// (causal D128 excepted: a block an entry measured 511-566 TFLOP/s against
// 489-518 persistent in two H100 runs, while causal D64 measured 354-363
// against 359-378),
// so the producer loads the next entry's Q (once every S = Q K^T of the last
// one is done: the Q-empty barrier) and first K/V tiles while the consumers
// finish the last one's P V and write its rows, instead of a fresh block
// starting cold. Producer and consumers walk the same entries and count the
// same tiles, so the ring's stages and parities carry over from one entry to
// the next; the issue turns (named barriers 1 and 2) run on across entries
// too, since both consumers issue once a tile of the same entries. Each
// consumer stages its 64 output rows in shared memory of its own and writes
// them as 16-byte rows (write_rows' 4-byte stores left three quarters of
// each sector unused: ncu).
//
// Note [Hopper block order]
// One block a (batch, head, 128-row query block), on a 1-d grid. Without the
// causal rule every block has the same work and the query blocks go fastest,
// so the blocks resident together share a few heads' K and V in L2. Causal
// blocks have more key tiles the later their rows, so the order is
// heaviest first (longest-processing-time first: the short blocks fill the
// tail), but in sections of (batch, head) pairs whose K and V fit in 32 MiB
// of L2 (a multiple of the query heads sharing a key head): in a section,
// the query blocks from the last to the first with the pairs fastest.
#include "attention/tensor_core.cuh"
#include "attention/wgmma_sm90.cuh"

#include <cuda.h>  // CUtensorMap and cuTensorMapEncodeTiled's type (the driver is reached through the runtime)

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

namespace baracuda::attn {

namespace {

/// The tensor maps of q, k and v (unused on the cp.async path).
struct TmaMaps {
  CUtensorMap q, k, v;
};

/// Registers a thread of the producer and of the consumers after setmaxnreg:
/// 128 * 24 + 256 * 240 = 128 * 40 + 256 * 232 = 384 * 168, the launch's
/// (TMA takes one thread; cp.async needs addresses in all 128).
constexpr int producer_regs(bool tma) { return tma ? 24 : 40; }
constexpr int consumer_regs(bool tma) { return tma ? 240 : 232; }
constexpr int kSchedThreads = 256;                       // the two consumer warpgroups

/// Score rules as types, for the loops specialised on them.
template <TileRule kRule>
using Rule = std::integral_constant<TileRule, kRule>;

/// One (batch, head, 128-row query block) of the grid's order: its head,
/// first row, the key tiles its rows may see (tile_key_span) and whether it
/// has rows at all (a packed sequence may end before it).
struct BlockWork {
  HeadView v;
  int64_t row0 = 0, span_lo = 0, span_hi = 0;
  int tiles = 0;
  bool rows = false;
};

__device__ __forceinline__ BlockWork block_work(const Problem& p, const BlockOrder& order, int64_t idx) {
  BlockWork w;
  int64_t batch, head, q_block;
  block_at(p, order, idx, batch, head, q_block);
  w.v = head_view(p, batch, head);
  w.row0 = q_block * kWgRows;
  w.rows = w.v.valid && w.row0 < w.v.len_q;
  if (!w.rows) return w;
  tile_key_span(p, w.v, w.row0, min(w.row0 + kWgRows, w.v.len_q) - 1, w.span_lo, w.span_hi);
  w.tiles = w.span_lo < w.span_hi ? int((w.span_hi - w.span_lo + kWgKeys - 1) / kWgKeys) : 0;
  return w;
}

/// Whether a warpgroup's output rows leave through its shared-memory
/// staging tile in 16-byte rows (unit dim stride, 16-byte aligned rows, all
/// kD dims kept); write_rows' scalar stores serve the rest.
__device__ __forceinline__ bool staged_out(const Problem& p, int kD) {
  return p.out.dim == 1 && p.out.seq % 8 == 0 && p.out.head % 8 == 0 && p.out.batch % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.out.data) % 16 == 0 && p.value_dim == kD;
}

/// Writes a warpgroup's 64 rows of out (o / l) through `sO` ([64][kD + 8]:
/// a row's fragments land in distinct banks) as 16-byte rows, and lse as
/// write_rows does. Named barrier `bar` (the warpgroup's 128 threads)
/// guards the staging tile on both sides.
template <class T, int kD>
__device__ __forceinline__ void store_rows_staged(const Problem& p, const HeadView& v, const FragRows& f,
                                                  const float (&o)[kD / 8][4], const float (&m)[2],
                                                  const float (&l)[2], int64_t first, T* sO, int bar) {
  constexpr int kPitch = kD + 8, kChunks = kD / 8;
  const int tid = threadIdx.x % 128, warp = tid / 32, lane = tid % 32, quad = lane % 4;
  named_sync(bar, 128);  // the last block's reads of sO are done
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float inv = l[r] > 0 ? 1.f / l[r] : 0.f;
    uint32_t* row = reinterpret_cast<uint32_t*>(sO + (warp * 16 + lane / 4 + 8 * r) * kPitch + 2 * quad);
#pragma unroll
    for (int dt = 0; dt < kD / 8; ++dt) row[dt * 4] = pack2<T>(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (quad == 0 && f.row[r] < v.len_q)
      reinterpret_cast<float*>(p.lse.data)[p.lse.at(v.b, v.h, v.tok_q + f.row[r])] = row_lse(m[r], l[r]);
  }
  named_sync(bar, 128);
  T* out = reinterpret_cast<T*>(p.out.data) + p.out.at(v.b, v.h, v.tok_q + first);
  const int64_t rows = min(int64_t(64), v.len_q - first);
#pragma unroll 4
  for (int e = tid; e < 64 * kChunks; e += 128) {
    const int r = e / kChunks, c = e % kChunks;
    if (r >= rows) break;
    *reinterpret_cast<uint4*>(out + r * p.out.seq + c * 8) = *reinterpret_cast<const uint4*>(sO + r * kPitch + c * 8);
  }
}

template <class T, int kD, bool kTma>
__global__ void __launch_bounds__(kWgThreads, 1)
    attention_forward_sm90(const __grid_constant__ TmaMaps maps, const Problem p, const BlockOrder order,
                           int64_t blocks) {
#ifdef BARACUDA_WGMMA
  constexpr int kStages = wgmma_stages(kD), kTile = kWgKeys * kD;  // halves of a K or V tile
  constexpr uint32_t kTileBytes = kTile * sizeof(T), kQBytes = kWgRows * kD * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled tiles start on 1024 bytes (the plan counts the slack).
  T* sQ = reinterpret_cast<T*>(smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023));  // [kD/64][128][64]
  T* sKV = sQ + kWgRows * kD;  // stage s: K at sKV + 2 s kTile, V after it
  T* sO = sKV + 2 * kStages * kTile;  // the consumers' output staging: [2][64][kD + 8]
  const uint32_t bar_q = shared_address(sO + 2 * 64 * (kD + 8)), bar_q_empty = bar_q + 8;
  // Stage s's barriers: K full, V full, K empty, V empty.
  auto bar = [&](int kind, int s) { return bar_q + 8 * (2 + 4 * s + kind); };
  enum { kFullK, kFullV, kEmptyK, kEmptyV };
  if (threadIdx.x == 0) {
    mbar_init(bar_q, kTma ? 1 : 128);
    mbar_init(bar_q_empty, 8);  // lane 0 of each consumer warp, once its last S = Q K^T is done
    for (int s = 0; s < kStages; ++s) {
      mbar_init(bar(kFullK, s), kTma ? 1 : 128);
      mbar_init(bar(kFullV, s), kTma ? 1 : 128);
      mbar_init(bar(kEmptyK, s), 8);  // lane 0 of each consumer warp
      mbar_init(bar(kEmptyV, s), 8);
    }
    mbar_fence_init();
  }
  __syncthreads();

  // Both sides walk the same blocks (Note [Hopper persistent blocks]) and
  // count the tiles (`ring`: the stage and parity of each) and the blocks
  // with tiles (`loads`: the Q barriers' parity) the same way.
  if (threadIdx.x < 128) {  // ------------------------------------------------ producer
    setmaxnreg_dec<producer_regs(kTma)>();
    if (kTma && threadIdx.x != 0) return;
    if constexpr (kTma) {
      tma_prefetch(&maps.q);
      tma_prefetch(&maps.k);
      tma_prefetch(&maps.v);
    }
    int ring = 0, loads = 0;
    for (int64_t idx = blockIdx.x; idx < blocks; idx += gridDim.x) {
      const BlockWork w = block_work(p, order, idx);
      if (w.tiles == 0) continue;
      const HeadView& v = w.v;
      mbar_wait(bar_q_empty, (loads & 1) ^ 1);
      if constexpr (kTma) {
        mbar_expect_tx(bar_q, kQBytes);
#pragma unroll
        for (int cb = 0; cb < kD / 64; ++cb)
          tma_load_4d(sQ + cb * kWgRows * 64, &maps.q, 64 * cb, int(w.row0), int(v.h), int(v.b), bar_q);
        for (int t = 0; t < w.tiles; ++t) {
          const int g = ring + t, s = g % kStages;
          const uint32_t parity = ((g / kStages) & 1) ^ 1;
          const int k0 = int(w.span_lo + int64_t(t) * kWgKeys);
          T* sK = sKV + 2 * s * kTile;
          mbar_wait(bar(kEmptyK, s), parity);
          mbar_expect_tx(bar(kFullK, s), kTileBytes);
#pragma unroll
          for (int cb = 0; cb < kD / 64; ++cb)
            tma_load_4d(sK + cb * kWgKeys * 64, &maps.k, 64 * cb, k0, int(v.hk), int(v.b), bar(kFullK, s));
          mbar_wait(bar(kEmptyV, s), parity);
          mbar_expect_tx(bar(kFullV, s), kTileBytes);
#pragma unroll
          for (int cb = 0; cb < kD / 64; ++cb)
            tma_load_4d(sK + kTile + cb * kWgKeys * 64, &maps.v, 64 * cb, k0, int(v.hk), int(v.b), bar(kFullV, s));
        }
      } else {
        // Each thread waits for its own copies and fences them into the async
        // proxy before its arrival (128 a phase).
        const T* q = reinterpret_cast<const T*>(p.q.data) + p.q.at(v.b, v.h, v.tok_q);
        const T* k = reinterpret_cast<const T*>(p.k.data) + p.k.at(v.b, v.hk, v.tok_kv);
        const T* val = reinterpret_cast<const T*>(p.v.data) + p.v.at(v.b, v.hk, v.tok_kv);
        issue_swizzled<kD, kWgRows, 128>(sQ, q, p.q.seq, w.row0, v.len_q);
        cp_async_commit();
        cp_async_wait<0>();
        fence_proxy_async();
        mbar_arrive(bar_q);
        for (int t = 0; t < w.tiles; ++t) {
          const int g = ring + t, s = g % kStages;
          const uint32_t parity = ((g / kStages) & 1) ^ 1;
          const int64_t k0 = w.span_lo + int64_t(t) * kWgKeys;
          T* sK = sKV + 2 * s * kTile;
          mbar_wait(bar(kEmptyK, s), parity);
          issue_swizzled<kD, kWgKeys, 128>(sK, k, p.k.seq, k0, v.len_kv);
          cp_async_commit();
          mbar_wait(bar(kEmptyV, s), parity);
          issue_swizzled<kD, kWgKeys, 128>(sK + kTile, val, p.v.seq, k0, v.len_kv);
          cp_async_commit();
          cp_async_wait<1>();
          fence_proxy_async();
          mbar_arrive(bar(kFullK, s));
          cp_async_wait<0>();
          fence_proxy_async();
          mbar_arrive(bar(kFullV, s));
        }
      }
      ring += w.tiles;
      ++loads;
    }
    return;
  }

  // ---------------------------------------------------------------- consumers
  setmaxnreg_inc<consumer_regs(kTma)>();
  const int wg = threadIdx.x / 128 - 1, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32, quad = lane % 4;
  const int own = 1 + wg, other = 2 - wg;  // named barriers of the issue turns
  const T* sQw = sQ + 64 * wg * 64;  // row 64 wg of every column block
  T* sOw = sO + 64 * wg * (kD + 8);
  const ScoreScales scales(p);
  const bool staged = staged_out(p, kD);
  if (wg == 1) named_arrive(1, kSchedThreads);  // consumer 0 issues first
  int ring = 0, loads = 0;
  for (int64_t idx = blockIdx.x; idx < blocks; idx += gridDim.x) {
    const BlockWork w = block_work(p, order, idx);
    if (!w.rows) continue;
    const HeadView& v = w.v;
    const int64_t span_lo = w.span_lo;
    const int tiles = w.tiles;
    // This warpgroup's rows and this thread's two of them.
    const int64_t wg_first = w.row0 + 64 * wg, wg_last = max(min(wg_first + 63, v.len_q - 1), wg_first);
    const FragRows f(p, v, wg_first + warp * 16 + lane / 4);
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0, 0};
    float o[kD / 8][4] = {};
    // Three phases (Note [Hopper forward]): the tiles [plain_lo, plain_hi)
    // every row of this warpgroup sees whole take the scale alone, the edges
    // before and after them the key-range test (both with the softcap inline
    // where the problem has one), and all of them the whole rule where the
    // problem has a mask or ALiBi.
    const bool extras = p.mask.data || p.alibi_slopes;
    int plain_lo = 0, plain_hi = 0;
    if (!extras && wg_first < v.len_q) {
      int64_t lo_first, hi_first, lo_last, hi_last;
      key_range(p, wg_first, v.len_q, v.len_kv, lo_first, hi_first);
      key_range(p, wg_last, v.len_q, v.len_kv, lo_last, hi_last);
      const int64_t first = lo_last > span_lo ? (lo_last - span_lo + kWgKeys - 1) / kWgKeys : 0;
      const int64_t hi = min(hi_first, v.len_kv);
      const int64_t end = hi > span_lo ? (hi - span_lo) / kWgKeys : 0;
      plain_lo = int(min(first, int64_t(tiles)));
      plain_hi = int(max(int64_t(plain_lo), min(end, int64_t(tiles))));
    }
    if (tiles > 0) {
      float s[kWgKeys / 8][4], corr[2], tile_max[2];
      uint32_t pa[8][4];  // P of the previous tile as A fragments
      auto softmax = [&](auto rule, int t) {
        constexpr TileRule kRule = decltype(rule)::value;
        constexpr bool kDefer = scale_deferrable(kRule);
        const int64_t k0 = span_lo + int64_t(t) * kWgKeys;
        tile_scores<kRule, kDefer>(s, tile_max, p, v, f, k0, quad, scales);
        softmax_rows<false>(s, m, l, corr, tile_max, p, v, f, k0, quad, kDefer ? scales.scale_log2 : 1.f);
      };
      auto step = [&](auto rule, int t) {
        const int g = ring + t, st = g % kStages, sp = (g - 1) % kStages;
        mbar_wait(bar(kFullK, st), (g / kStages) & 1);
        mbar_wait(bar(kFullV, sp), ((g - 1) / kStages) & 1);
        named_sync(own, kSchedThreads);
        wgmma_pin(s);
        wgmma_pin(pa);
        wgmma_pin(o);
        wgmma_fence();
        wgmma_scores_issue<T, kD>(s, sQw, kWgRows, sKV + 2 * st * kTile);
        wgmma_commit();
        rescale_rows(o, corr);  // the last softmax's factors, while S_t runs
        wgmma_pin(o);
        wgmma_fence();
        wgmma_values_issue<T, kD>(o, pa, sKV + (2 * sp + 1) * kTile);
        wgmma_commit();
        named_arrive(other, kSchedThreads);
        wgmma_wait<1>();  // S_t is done; P_{t-1} V_{t-1} may still run
        wgmma_pin(s);
        if (lane == 0) mbar_arrive(bar(kEmptyK, st));
        softmax(rule, t);
        wgmma_wait<0>();
        wgmma_pin(o);
        wgmma_pin(pa);
        if (lane == 0) mbar_arrive(bar(kEmptyV, sp));
        pack_probs<T>(pa, s);
      };
      const int s0 = ring % kStages;
      mbar_wait(bar_q, loads & 1);
      mbar_wait(bar(kFullK, s0), (ring / kStages) & 1);
      named_sync(own, kSchedThreads);
      wgmma_fence();
      wgmma_scores_issue<T, kD>(s, sQw, kWgRows, sKV + 2 * s0 * kTile);
      wgmma_commit();
      named_arrive(other, kSchedThreads);
      wgmma_wait<0>();
      wgmma_pin(s);
      if (lane == 0) mbar_arrive(bar(kEmptyK, s0));
      // Every tile by phase: the edges by `edge`, [plain_lo, plain_hi) by `whole`.
      auto phases = [&](auto edge, auto whole) {
        if (plain_lo == 0 && plain_hi > 0) softmax(whole, 0);
        else softmax(edge, 0);
        pack_probs<T>(pa, s);
        int t = 1;
        if constexpr (!std::is_same_v<decltype(edge), decltype(whole)>) {
          for (; t < plain_lo; ++t) step(edge, t);
          for (; t < plain_hi; ++t) step(whole, t);
        }
        for (; t < tiles; ++t) step(edge, t);
      };
      if (extras) phases(Rule<TileRule::full>{}, Rule<TileRule::full>{});
      else if (p.softcap > 0) phases(Rule<TileRule::bounds_capped>{}, Rule<TileRule::capped>{});
      else phases(Rule<TileRule::bounds>{}, Rule<TileRule::plain>{});
      if (lane == 0) mbar_arrive(bar_q_empty);  // every S = Q K^T of the block is done: the next Q may load
      const int g = ring + tiles - 1, sl = g % kStages;
      mbar_wait(bar(kFullV, sl), (g / kStages) & 1);
      rescale_rows(o, corr);
      wgmma_pin(pa);
      wgmma_pin(o);
      wgmma_fence();
      wgmma_values_issue<T, kD>(o, pa, sKV + (2 * sl + 1) * kTile);
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_pin(o);
      if (lane == 0) mbar_arrive(bar(kEmptyV, sl));
      ring += tiles;
      ++loads;
    }
    if (staged) store_rows_staged<T, kD>(p, v, f, o, m, l, wg_first, sOw, 3 + wg);
    else write_rows<T>(p, v, f, o, m, l, quad);
  }
  if (wg == 0) named_sync(1, kSchedThreads);  // consumer 1's first arrival
#endif
}

// ---------------------------------------------------------------- tensor maps

using EncodeTiled = decltype(&cuTensorMapEncodeTiled);

/// The driver's cuTensorMapEncodeTiled through the runtime (no link to
/// libcuda), looked up once; null where the driver has none.
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled(nullptr);
    }
    return reinterpret_cast<EncodeTiled>(f);
  }();
  return fn;
}

/// A tensor map of operand `o` ([batch, heads, seq, d] of T, unit dim
/// stride) with boxes of 64 dims by `rows` rows and the 128-byte swizzle:
/// the layout of issue_swizzled, one column block a box. False where TMA
/// cannot take it (strides not positive multiples of 16 bytes under 2^40, a
/// base not 16-byte aligned, no driver entry point).
template <class T>
bool make_tensor_map(CUtensorMap& map, const Operand& o, int64_t batch, int64_t heads, int64_t seq, int64_t d,
                     int rows) {
  const EncodeTiled encode = encode_tiled();
  if (!encode || o.dim != 1 || reinterpret_cast<uintptr_t>(o.data) % 16 || seq >= (int64_t(1) << 31)) return false;
  const cuuint64_t dims[4] = {cuuint64_t(d), cuuint64_t(seq), cuuint64_t(heads), cuuint64_t(batch)};
  const int64_t strides[3] = {o.seq, o.head, o.batch};
  cuuint64_t bytes[3];
  cuuint64_t extent = cuuint64_t(d) * sizeof(T);  // a stride for a dim of size 1 (never used)
  for (int i = 0; i < 3; ++i) {
    const int64_t b = strides[i] * int64_t(sizeof(T));
    if (dims[i + 1] == 1) {
      bytes[i] = extent;
    } else {
      if (b <= 0 || b % 16 || b >= (int64_t(1) << 40)) return false;
      bytes[i] = cuuint64_t(b);
    }
    extent = bytes[i] * dims[i + 1];
  }
  const cuuint32_t box[4] = {64, cuuint32_t(rows), 1, 1}, unit[4] = {1, 1, 1, 1};
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  return encode(&map, type, 4, o.data, dims, bytes, box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class T, int kD, bool kTma>
Status launch_kernel(const TmaMaps& maps, const Problem& p, CUstream_st* stream) {
  constexpr size_t smem = wgmma_forward_smem(kD);
  BARACUDA_TRY(allow_smem(attention_forward_sm90<T, kD, kTma>, smem));
  const BlockOrder order = wgmma_block_order(p);
  const int64_t blocks = order.q_blocks * p.batch * p.heads_q;  // below 2^31 (wgmma_layout)
  // Persistent: one block an SM walks the order (Note [Hopper persistent blocks]).
  // Persistent (Note [Hopper persistent blocks]) but for causal D128, whose
  // blocks of unequal work balance better on the hardware's block scheduler.
  const bool persistent = !(order.heavy_first && kD == 128);
  const unsigned grid = unsigned(persistent ? std::clamp<int64_t>(current_sm_count(), 1, blocks) : blocks);
  attention_forward_sm90<T, kD, kTma><<<grid, kWgThreads, smem, stream>>>(maps, p, order, blocks);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

/// TMA where every operand takes it (dense sequences: a packed one's rows
/// past its length belong to the next, not zeros), cp.async elsewhere.
template <class T, int kD>
Status launch_sm90(const Problem& p, CUstream_st* stream) {
  TmaMaps maps{};
  const bool tma = !p.varlen() && make_tensor_map<T>(maps.q, p.q, p.batch, p.heads_q, p.seq_q, kD, kWgRows) &&
                   make_tensor_map<T>(maps.k, p.k, p.batch, p.heads_kv, p.seq_kv, kD, kWgKeys) &&
                   make_tensor_map<T>(maps.v, p.v, p.batch, p.heads_kv, p.seq_kv, kD, kWgKeys);
  return tma ? launch_kernel<T, kD, true>(maps, p, stream) : launch_kernel<T, kD, false>(maps, p, stream);
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

/// One block of 128 threads loads the same 128-row tile of a [b, h, s, kD]
/// tensor twice, by TMA (tensor map `map`, thread 0) and by cp.async
/// (issue_swizzled), and writes both shared-memory images out byte for byte.
template <class T, int kD>
__global__ void __launch_bounds__(128)
    tma_probe(const __grid_constant__ CUtensorMap map, const T* tile_rows, int64_t seq, int64_t len, int row0, int h,
              int b, unsigned char* tma_out, unsigned char* cp_out) {
#ifdef BARACUDA_WGMMA
  constexpr int kBytes = 128 * kD * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  unsigned char* sTma = smem_raw + ((1024 - (shared_address(smem_raw) & 1023)) & 1023);
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
  issue_swizzled<kD, 128, 128>(reinterpret_cast<T*>(sCp), tile_rows, seq, row0, len);
  cp_async_commit();
  cp_async_wait<0>();
  mbar_wait(bar, 0);
  __syncthreads();
  for (int e = threadIdx.x; e < kBytes; e += 128) tma_out[e] = sTma[e], cp_out[e] = sCp[e];
#endif
}

/// Loads the tile of rows 128..255 of head 2, batch 1 of a [2, 3, 200, kD]
/// tensor (rows 200.. past the end: zeros) both ways and compares each with
/// the swizzled image computed here.
template <class T, int kD>
Result<TmaCheck> run_tma_probe() {
  constexpr int64_t kB = 2, kH = 3, kS = 200, kRow0 = 128, kHead = 2, kBatch = 1;
  constexpr size_t kBytes = 128 * kD * sizeof(T);
  std::vector<T> x(size_t(kB * kH * kS * kD));
  for (size_t i = 0; i < x.size(); ++i) x[i] = convert<T>(float(int(i * 7 % 251) - 125));
  std::vector<unsigned char> want(kBytes, 0), tma(kBytes), cp(kBytes);
  for (int r = 0; r < 128; ++r)
    for (int c = 0; c < kD / 8; ++c) {
      const int64_t row = kRow0 + r;
      if (row >= kS) continue;
      std::memcpy(want.data() + swizzled_chunk(128, r, c), &x[size_t(((kBatch * kH + kHead) * kS + row) * kD + c * 8)],
                  16);
    }
  T* dx = nullptr;
  unsigned char *dt = nullptr, *dc = nullptr;
  auto run = [&]() -> Status {
    BARACUDA_CUDA_TRY(cudaMalloc(&dx, x.size() * sizeof(T)));
    BARACUDA_CUDA_TRY(cudaMalloc(&dt, kBytes));
    BARACUDA_CUDA_TRY(cudaMalloc(&dc, kBytes));
    BARACUDA_CUDA_TRY(cudaMemcpy(dx, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice));
    BARACUDA_CUDA_TRY(cudaMemset(dt, 0xff, kBytes));
    BARACUDA_CUDA_TRY(cudaMemset(dc, 0xff, kBytes));
    Operand o;
    o.data = reinterpret_cast<char*>(dx);
    o.batch = kH * kS * kD, o.head = kS * kD, o.seq = kD, o.dim = 1;
    CUtensorMap map{};
    if (!make_tensor_map<T>(map, o, kB, kH, kS, kD, 128))
      return unsupported("tma_self_test: cuTensorMapEncodeTiled refused a contiguous [2, 3, 200, ", kD, "] tensor");
    const size_t smem = 2 * kBytes + 1024 + 8;
    BARACUDA_TRY(allow_smem(tma_probe<T, kD>, smem));
    const T* rows = dx + (kBatch * kH + kHead) * kS * kD;
    tma_probe<T, kD><<<1, 128, smem>>>(map, rows, kD, kS, int(kRow0), int(kHead), int(kBatch), dt, dc);
    BARACUDA_CUDA_TRY(cudaGetLastError());
    BARACUDA_CUDA_TRY(cudaMemcpy(tma.data(), dt, kBytes, cudaMemcpyDeviceToHost));
    BARACUDA_CUDA_TRY(cudaMemcpy(cp.data(), dc, kBytes, cudaMemcpyDeviceToHost));
    return Status::ok();
  };
  const Status st = run();
  for (void* ptr : {static_cast<void*>(dx), static_cast<void*>(dt), static_cast<void*>(dc)})
    if (ptr) (void)cudaFree(ptr);
  if (!st.is_ok()) return st;
  TmaCheck check;
  for (size_t e = 0; e < kBytes; ++e) check.tma_bytes += tma[e] != want[e], check.cp_async_bytes += cp[e] != want[e];
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

Result<TmaCheck> tma_self_test(DType dtype, int head_dim) {
  if ((dtype != DType::f16 && dtype != DType::bf16) || (head_dim != 64 && head_dim != 128))
    return invalid("tma_self_test: f16/bf16 with head dim 64 or 128, got ", dtype_name(dtype), " and ", head_dim);
  if (dtype == DType::f16) return head_dim == 64 ? run_tma_probe<__half, 64>() : run_tma_probe<__half, 128>();
  return head_dim == 64 ? run_tma_probe<__nv_bfloat16, 64>() : run_tma_probe<__nv_bfloat16, 128>();
}

}  // namespace baracuda::attn
