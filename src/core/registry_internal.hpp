// How op families add themselves to the registry.
#pragma once

#include "baracuda/registry.hpp"

namespace baracuda {

/// Each family appends its ops; called once, in this order, by registry().
void register_elementwise_ops(std::vector<OpInfo>& ops);
void register_reduce_ops(std::vector<OpInfo>& ops);
void register_softmax_ops(std::vector<OpInfo>& ops);
void register_norm_ops(std::vector<OpInfo>& ops);
void register_batch_norm_ops(std::vector<OpInfo>& ops);
void register_group_norm_ops(std::vector<OpInfo>& ops);  // group_norm, instance_norm
void register_scan_ops(std::vector<OpInfo>& ops);
void register_loss_ops(std::vector<OpInfo>& ops);
void register_ctc_ops(std::vector<OpInfo>& ops);
void register_linear_ce_ops(std::vector<OpInfo>& ops);  // linear_cross_entropy (composes gemm plans)
void register_gemm_ops(std::vector<OpInfo>& ops);
void register_grouped_gemm_ops(std::vector<OpInfo>& ops);  // grouped_mm
void register_grouped_gemm_list_ops(std::vector<OpInfo>& ops);  // grouped_gemm
void register_scaled_mm_ops(std::vector<OpInfo>& ops);
void register_attention_ops(std::vector<OpInfo>& ops);
void register_rope_ops(std::vector<OpInfo>& ops);
void register_decode_ops(std::vector<OpInfo>& ops);

}  // namespace baracuda
