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
// end. Sums run in a fixed order: deterministic. Dropout runs in instances
// of its own (kDropout): a consumer draws a tile's keep bits
// (dropout_keep_bits) while its S = Q K^T runs on the tensor cores, and the
// probabilities take them after their row sums.
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
#pragma once

#include "attention/tensor_core.cuh"
#include "attention/wgmma_sm90.cuh"

#include <cuda.h>  // CUtensorMap (the driver is reached through the runtime)

#include <algorithm>
#include <type_traits>

// The kernel and its launch, instantiated by kernels_fwd_sm90.cu (without
// dropout) and kernels_fwd_sm90_dropout.cu (with it): two translation units
// that build in parallel.
namespace baracuda::attn::hopper {

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
/// staging tile in 16-byte rows (unit dim stride, 16-byte aligned rows);
/// write_rows' scalar stores serve the rest.
__device__ __forceinline__ bool staged_out(const Problem& p) {
  return p.out.dim == 1 && p.out.seq % 8 == 0 && p.out.head % 8 == 0 && p.out.batch % 8 == 0 &&
         reinterpret_cast<uintptr_t>(p.out.data) % 16 == 0;
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
    if (c * 8 >= p.value_dim) continue;  // a head dim padded to kD (a multiple of 8: tensor_core_layout)
    *reinterpret_cast<uint4*>(out + r * p.out.seq + c * 8) = *reinterpret_cast<const uint4*>(sO + r * kPitch + c * 8);
  }
}

template <class T, int kD, bool kTma, bool kDropout>
__global__ void __launch_bounds__(kWgThreads, 1)
    attention_forward_sm90(const __grid_constant__ TmaMaps maps, const Problem p, const BlockOrder order,
                           int64_t blocks) {
#ifdef BARACUDA_WGMMA
  constexpr int kStages = wgmma_stages(kD), kTile = kWgKeys * kD;  // halves of a K or V tile
  constexpr uint32_t kTileBytes = kTile * sizeof(T), kQBytes = kWgRows * kD * sizeof(T);
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Swizzled tiles start on 1024 bytes (the plan counts the slack).
  T* sQ = reinterpret_cast<T*>(swizzle_aligned(smem_raw));  // [kD/64][128][64]
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
        tma_load_rows<kD, kWgRows>(sQ, &maps.q, w.row0, v.h, v.b, bar_q);
        for (int t = 0; t < w.tiles; ++t) {
          const int g = ring + t, s = g % kStages;
          const uint32_t parity = ((g / kStages) & 1) ^ 1;
          const int k0 = int(w.span_lo + int64_t(t) * kWgKeys);
          T* sK = sKV + 2 * s * kTile;
          mbar_wait(bar(kEmptyK, s), parity);
          mbar_expect_tx(bar(kFullK, s), kTileBytes);
          tma_load_rows<kD, kWgKeys>(sK, &maps.k, k0, v.hk, v.b, bar(kFullK, s));
          mbar_wait(bar(kEmptyV, s), parity);
          mbar_expect_tx(bar(kFullV, s), kTileBytes);
          tma_load_rows<kD, kWgKeys>(sK + kTile, &maps.v, k0, v.hk, v.b, bar(kFullV, s));
        }
      } else {
        // Each thread waits for its own copies and fences them into the async
        // proxy before its arrival (128 a phase).
        const T* q = reinterpret_cast<const T*>(p.q.data) + p.q.at(v.b, v.h, v.tok_q);
        const T* k = reinterpret_cast<const T*>(p.k.data) + p.k.at(v.b, v.hk, v.tok_kv);
        const T* val = reinterpret_cast<const T*>(p.v.data) + p.v.at(v.b, v.hk, v.tok_kv);
        issue_swizzled<kD, kWgRows, 128>(sQ, q, p.q.seq, w.row0, v.len_q, int(p.head_dim));
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
          issue_swizzled<kD, kWgKeys, 128>(sK, k, p.k.seq, k0, v.len_kv, int(p.head_dim));
          cp_async_commit();
          mbar_wait(bar(kEmptyV, s), parity);
          issue_swizzled<kD, kWgKeys, 128>(sK + kTile, val, p.v.seq, k0, v.len_kv, int(p.value_dim));
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
  // wg and a tile's ring slots through a shuffle: ptxas then knows them warp-uniform and keeps the wgmma
  // descriptors they feed in uniform registers (else R2UR moves before every wgmma).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0) - 1, warp = threadIdx.x / 32 % 4,
            lane = threadIdx.x % 32, quad = lane % 4;
  const int own = 1 + wg, other = 2 - wg;  // named barriers of the issue turns
  const T* sQw = sQ + 64 * wg * 64;  // row 64 wg of every column block
  T* sOw = sO + 64 * wg * (kD + 8);
  const ScoreScales scales(p);
  const bool staged = staged_out(p);
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
      uint64_t kept = 0;  // dropout's keep bits of the tile whose S is in flight
      auto draw = [&](int t) {
        if constexpr (kDropout) kept = dropout_keep_bits<kWgKeys / 8>(p, v, f.row, span_lo + int64_t(t) * kWgKeys, quad);
      };
      auto softmax = [&](auto rule, int t) {
        constexpr TileRule kRule = decltype(rule)::value;
        constexpr bool kDefer = scale_deferrable(kRule);
        const int64_t k0 = span_lo + int64_t(t) * kWgKeys;
        tile_scores<kRule, kDefer>(s, tile_max, p, v, f, k0, quad, scales);
        softmax_rows<false>(s, m, l, corr, tile_max, p, v, f, k0, quad, kDefer ? scales.scale_log2 : 1.f);
        if constexpr (kDropout) apply_keep_bits(s, kept, dropout_scale<float>(p));
      };
      auto step = [&](auto rule, int t) {
        const int g = __shfl_sync(0xffffffffu, ring + t, 0), st = g % kStages, sp = (g - 1) % kStages;
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
        draw(t);  // while S_t runs
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
      draw(0);
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

template <class T, int kD, bool kTma, bool kDropout>
Status launch_kernel(const TmaMaps& maps, const Problem& p, CUstream_st* stream) {
  constexpr size_t smem = wgmma_forward_smem(kD);
  BARACUDA_TRY(allow_smem(attention_forward_sm90<T, kD, kTma, kDropout>, smem));
  const BlockOrder order = wgmma_block_order(p);
  const int64_t blocks = order.q_blocks * p.batch * p.heads_q;  // below 2^31 (wgmma_layout)
  // Persistent (Note [Hopper persistent blocks]) but for causal D128, whose
  // blocks of unequal work balance better on the hardware's block scheduler.
  const bool persistent = !(order.heavy_first && kD == 128);
  const unsigned grid = unsigned(persistent ? std::clamp<int64_t>(current_sm_count(), 1, blocks) : blocks);
  attention_forward_sm90<T, kD, kTma, kDropout><<<grid, kWgThreads, smem, stream>>>(maps, p, order, blocks);
  BARACUDA_CUDA_TRY(cudaGetLastError());
  return Status::ok();
}

/// launch_kernel with dropout (kernels_fwd_sm90_dropout.cu).
template <class T, int kD, bool kTma>
Status launch_dropout(const TmaMaps& maps, const Problem& p, CUstream_st* stream);

}  // namespace baracuda::attn::hopper
