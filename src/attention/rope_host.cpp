// The host references of rope / rope_backward and kv_append: the test
// oracles. RoPE computes in f64 whatever the dtype; kv_append checks every
// slot before it writes one and names the first bad token.
#include <vector>

#include "attention/rope.hpp"
#include "core/errors.hpp"

namespace baracuda::rope {

RopeTable& host_rope() {
  static RopeTable table;
  return table;
}
KvCopyTable& host_kv_copy() {
  static KvCopyTable table;
  return table;
}

namespace {

template <class T>
struct HostRope {
  static Status run(const RopeProblem& p, CUstream_st*) {
    using M = math_t<T, true>;
    const auto [batch, seq, heads, dim] = p.shape;
    const int64_t pairs = p.pairs();
    std::vector<double> inv_freq(pairs);
    for (int64_t i = 0; i < pairs; ++i) inv_freq[i] = p.freq.inv_freq(i);
    std::vector<M> cs(pairs), sn(pairs);
    const M sign = p.inverse ? M(-1) : M(1);
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t s = 0; s < seq; ++s) {
        const int64_t pos = p.position(b, s);
        for (int64_t i = 0; i < pairs; ++i) {
          cos_sin(reduced_angle(pos, inv_freq[i]), cs[i], sn[i]);
          sn[i] *= sign;
        }
        for (int64_t h = 0; h < heads; ++h) {
          const T* x = reinterpret_cast<const T*>(p.src) + b * p.src_stride[0] + s * p.src_stride[1] + h * p.src_stride[2];
          T* y = reinterpret_cast<T*>(p.dst) + b * p.dst_stride[0] + s * p.dst_stride[1] + h * p.dst_stride[2];
          const int64_t sx = p.src_stride[3], sy = p.dst_stride[3];
          for (int64_t i = 0; i < pairs; ++i) {
            const int64_t d0 = p.first_of(i), d1 = p.second_of(i);
            M y0, y1;
            rotate(convert<M>(x[d0 * sx]), convert<M>(x[d1 * sx]), cs[i], sn[i], y0, y1);
            y[d0 * sy] = convert<T>(y0);
            y[d1 * sy] = convert<T>(y1);
          }
          if (p.copy_tail)
            for (int64_t d = 2 * pairs; d < dim; ++d) y[d * sy] = x[d * sx];
        }
      }
    }
    return Status::ok();
  }
};

template <class In, class Cache>
struct HostKvCopy {
  static Status run(const KvCopy& p, CUstream_st*) {
    const auto [batch, tokens, heads, dim] = p.shape;
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < tokens; ++t) {
        const Slot r = slot_of(p, b, t);
        if (r.error == SlotError::none) continue;
        const std::string where = cat("kv_append: sequence ", b, " token ", t, ": position ", r.position,
                                      " (cache_seqlens[", b, "] = ", p.seqlens[b * p.seqlens_stride], " + ", t, ")");
        switch (r.error) {
          case SlotError::none: break;
          case SlotError::negative_position: return invalid(where, " is negative");
          case SlotError::past_cache:
            return invalid(where, " is past the cache's ", p.block_size, " positions per sequence");
          case SlotError::past_block_table:
            return invalid(where, " needs block_table[", b, ", ", r.block_index, "], but the table has ", p.max_blocks,
                           " blocks per sequence (block_size ", p.block_size, ")");
          case SlotError::bad_block_id:
            return invalid(where, ": block id ", r.block, " at block_table[", b, ", ", r.block_index,
                           "] is outside [0, ", p.num_blocks, ")");
        }
      }
    }
    for (int64_t b = 0; b < batch; ++b) {
      for (int64_t t = 0; t < tokens; ++t) {
        const Slot r = slot_of(p, b, t);
        for (int64_t h = 0; h < heads; ++h) {
          const In* x = reinterpret_cast<const In*>(p.src) + b * p.src_stride[0] + t * p.src_stride[1] + h * p.src_stride[2];
          Cache* y = reinterpret_cast<Cache*>(p.dst) + r.block * p.dst_stride[0] + r.slot * p.dst_stride[1] +
                     h * p.dst_stride[2];
          for (int64_t d = 0; d < dim; ++d) y[d * p.dst_stride[3]] = convert<Cache>(x[d * p.src_stride[3]]);
        }
      }
    }
    return Status::ok();
  }
};

[[maybe_unused]] const bool registered = register_rope_kernels<HostRope, HostKvCopy>(host_rope(), host_kv_copy());

}  // namespace
}  // namespace baracuda::rope
