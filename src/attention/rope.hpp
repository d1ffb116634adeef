// Rotary position embedding and the KV-cache append: the problems the plans
// bind, the frequency and rotation math shared by the host reference and the
// CUDA kernels, and their launch tables.
//
// Note [RoPE precision]
// ~~~~~~~~~~~~~~~~~~~~~
// Pair i of the rotary dims turns by theta = position * inv_freq(i), with
// inv_freq(i) = base^(-2i / rotary_dim) (then scaled). Every backend forms
// inv_freq with pow in f64 and theta as an f64 product reduced modulo 2 pi in
// f64 (`reduced_angle`); only cos/sin of the reduced angle and the rotation
// run in the math type: f32 for f16/bf16/f32, f64 for f64 (the host
// reference: f64 for all). So large positions lose nothing to the angle (an
// f32 product pos * inv_freq would err by pos * 6e-8 radians, 2.4e-4 at
// position 4096); the f32 result is within a few ulps of the f64 one.
#pragma once

#include <cmath>

#include "core/dtype_traits.hpp"
#include "core/launch_table.hpp"

struct CUstream_st;

namespace baracuda::rope {

/// `scaling` attribute values.
enum class Scaling : int { none = 0, linear = 1, ntk = 2, llama3 = 3 };

/// The frequency rule of one plan (attributes already checked).
struct Frequencies {
  double base = 10000;  ///< NTK-adjusted already
  int rotary_dim = 0;   ///< even, > 0
  Scaling scaling = Scaling::none;
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4, original_max_position = 8192;

  /// inv_freq of pair i in [0, rotary_dim / 2), in f64.
  BCD_HD double inv_freq(int64_t i) const {
    const double f = pow(base, -2.0 * double(i) / double(rotary_dim));
    switch (scaling) {
      case Scaling::linear: return f / factor;
      case Scaling::llama3: {
        // Llama 3.1: long wavelengths slow down by `factor`, short ones stay,
        // the band between is interpolated by the original context's cycles.
        constexpr double kTwoPi = 6.283185307179586;
        const double wavelen = kTwoPi / f;
        const double high_wavelen = original_max_position / high_freq_factor;
        const double low_wavelen = original_max_position / low_freq_factor;
        if (wavelen < high_wavelen) return f;
        if (wavelen > low_wavelen) return f / factor;
        const double smooth =
            (original_max_position / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
        return (1 - smooth) * f / factor + smooth * f;
      }
      default: return f;  // none; ntk changed the base
    }
  }
};

/// position * inv_freq reduced to about [-pi, pi], all in f64 (Note [RoPE precision]).
BCD_HD double reduced_angle(int64_t position, double inv_freq) {
  constexpr double kInvTwoPi = 0.15915494309189535;
  constexpr double kTwoPiHi = 6.283185307179586;       // 2 pi rounded to f64
  constexpr double kTwoPiLo = 2.4492935982947064e-16;  // 2 pi - kTwoPiHi
  const double theta = double(position) * inv_freq;
  const double k = rint(theta * kInvTwoPi);
  return fma(-k, kTwoPiLo, fma(-k, kTwoPiHi, theta));
}

/// cos and sin of a reduced angle in the math type M.
template <class M>
BCD_HD void cos_sin(double angle, M& c, M& s) {
  if constexpr (std::is_same_v<M, float>) {
#if defined(__CUDA_ARCH__)
    sincosf(float(angle), &s, &c);
#else
    c = cosf(float(angle)), s = sinf(float(angle));
#endif
  } else {
    c = cos(angle), s = sin(angle);
  }
}

/// (x0, x1) turned by the angle whose cos and sin are c and s.
template <class M>
BCD_HD void rotate(M x0, M x1, M c, M s, M& y0, M& y1) {
  y0 = x0 * c - x1 * s;
  y1 = x1 * c + x0 * s;
}

/// rope / rope_backward on x [batch, seq, heads, dim] (rank-3 x: batch 1).
/// Pairs are (i, i + rotary_dim / 2) (NeoX, rotate_half) or (2i, 2i + 1)
/// (GPT-J, interleaved); dims past rotary_dim pass through.
struct RopeProblem {
  const char* src = nullptr;
  char* dst = nullptr;
  const void* positions = nullptr;  ///< i32 or i64 [batch, seq]; batch stride 0 when shared
  bool positions_i64 = false;
  int64_t shape[4] = {};  ///< batch, seq, heads, dim
  int64_t src_stride[4] = {}, dst_stride[4] = {};
  int64_t pos_stride[2] = {};
  bool interleaved = false;
  bool inverse = false;    ///< rope_backward: turn by -theta
  bool copy_tail = false;  ///< dst is not src: copy the dims past rotary_dim
  Frequencies freq;

  BCD_HD int64_t pairs() const { return freq.rotary_dim / 2; }
  BCD_HD int64_t position(int64_t b, int64_t s) const {
    const int64_t at = b * pos_stride[0] + s * pos_stride[1];
    return positions_i64 ? static_cast<const int64_t*>(positions)[at] : int64_t(static_cast<const int32_t*>(positions)[at]);
  }
  /// Element offsets of pair i's two members along dim.
  BCD_HD int64_t first_of(int64_t i) const { return interleaved ? 2 * i : i; }
  BCD_HD int64_t second_of(int64_t i) const { return interleaved ? 2 * i + 1 : i + pairs(); }
};

/// One of kv_append's copies (keys or values): src [batch, tokens, heads,
/// dim] into cache [blocks, block_size, heads, dim] at the slots the block
/// table and cache_seqlens give. Contiguous caches have no block table, one
/// "block" per sequence and block_size = the cache's sequence length.
struct KvCopy {
  const char* src = nullptr;
  char* dst = nullptr;
  int64_t shape[4] = {};  ///< batch, tokens, heads, dim
  int64_t src_stride[4] = {}, dst_stride[4] = {};  ///< dst: block, slot, head, dim
  const int32_t* block_table = nullptr;  ///< [batch, max_blocks]; null: contiguous
  int64_t table_stride[2] = {}, max_blocks = 0;
  const int32_t* seqlens = nullptr;
  int64_t seqlens_stride = 0;
  int64_t num_blocks = 0, block_size = 0;
};

/// Where token t of sequence b goes, or why it cannot.
enum class SlotError : int { none, negative_position, past_block_table, bad_block_id, past_cache };

struct Slot {
  int64_t position = 0, block = 0, slot = 0;
  int64_t block_index = 0;  ///< into the block table row (paged)
  SlotError error = SlotError::none;
};

BCD_HD Slot slot_of(const KvCopy& p, int64_t b, int64_t t) {
  Slot r;
  r.position = int64_t(p.seqlens[b * p.seqlens_stride]) + t;
  if (r.position < 0) {
    r.error = SlotError::negative_position;
  } else if (!p.block_table) {
    r.block = b, r.slot = r.position;
    if (r.position >= p.block_size) r.error = SlotError::past_cache;
  } else {
    r.block_index = r.position / p.block_size;
    r.slot = r.position % p.block_size;
    if (r.block_index >= p.max_blocks) {
      r.error = SlotError::past_block_table;
    } else {
      r.block = p.block_table[b * p.table_stride[0] + r.block_index * p.table_stride[1]];
      if (r.block < 0 || r.block >= p.num_blocks) r.error = SlotError::bad_block_id;
    }
  }
  return r;
}

/// Rotary pairs the CUDA kernel's shared inv_freq table holds (f64 each).
inline constexpr int64_t kMaxCudaPairs = 4096;

using RopeFn = Status (*)(const RopeProblem&, CUstream_st*);
using RopeTable = LaunchTable<RopeFn>;
/// "rope:dtype" (forward and backward: RopeProblem::inverse).
RopeTable& host_rope();
RopeTable& cuda_rope();

using KvCopyFn = Status (*)(const KvCopy&, CUstream_st*);
using KvCopyTable = LaunchTable<KvCopyFn>;
/// "kv_append:in:cache".
KvCopyTable& host_kv_copy();
KvCopyTable& cuda_kv_copy();

/// Cache dtypes kv_append writes for each new-token dtype: the same, and fp8
/// caches (plain conversion, no scale; e4m3 turns out-of-range values to NaN).
template <class In, class Cache>
struct KvPair {
  using in = In;
  using cache = Cache;
};
using KvPairs = TypeList<KvPair<float, float>, KvPair<__half, __half>, KvPair<__nv_bfloat16, __nv_bfloat16>,
                         KvPair<double, double>, KvPair<float, __nv_fp8_e4m3>, KvPair<float, __nv_fp8_e5m2>,
                         KvPair<__half, __nv_fp8_e4m3>, KvPair<__half, __nv_fp8_e5m2>,
                         KvPair<__nv_bfloat16, __nv_fp8_e4m3>, KvPair<__nv_bfloat16, __nv_fp8_e5m2>>;

/// Registers `Rope<T>::run` for the four floats and `Kv<In, Cache>::run` for every pair.
template <template <class> class Rope, template <class, class> class Kv>
bool register_rope_kernels(RopeTable& rope, KvCopyTable& kv) {
  register_launchers<FloatTypes, Rope>(rope, "rope");
  for_each_type<KvPairs>([&]<class P>(TypeTag<P>) {
    using In = typename P::in;
    using Cache = typename P::cache;
    kv.add(launch_key("kv_append", dtype_of<In>, dtype_of<Cache>), &Kv<In, Cache>::run);
  });
  return true;
}

}  // namespace baracuda::rope
