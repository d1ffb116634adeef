// Pieces every bespoke family's plans share.
#pragma once

#include "baracuda/core.hpp"

namespace baracuda {

/// The sku of a bespoke-family plan: any strided layout; math and
/// accumulation in f64 on the host reference and for f64, f32 otherwise;
/// bitwise deterministic (these families use fixed reduction orders and no
/// float atomics); the arch of the current device for CUDA plans.
KernelSku bespoke_sku(OpCategory category, const char* op, DType element, Backend backend);

/// An error naming `op` unless `workspace` holds `needed` bytes.
Status check_workspace(std::string_view op, const Workspace& workspace, size_t needed);

}  // namespace baracuda
