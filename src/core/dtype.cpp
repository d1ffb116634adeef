#include <array>

#include "baracuda/core.hpp"

namespace baracuda {
namespace {

struct DTypeRow {
  DType dtype;
  const char* name;
  size_t size;
};

constexpr std::array<DTypeRow, kNumDTypes> kDTypes{{
    {DType::f32, "f32", 4},       {DType::f16, "f16", 2},           {DType::bf16, "bf16", 2},
    {DType::f64, "f64", 8},       {DType::fp8_e4m3, "fp8_e4m3", 1}, {DType::fp8_e5m2, "fp8_e5m2", 1},
    {DType::i8, "i8", 1},         {DType::u8, "u8", 1},             {DType::i16, "i16", 2},
    {DType::i32, "i32", 4},       {DType::i64, "i64", 8},           {DType::u32, "u32", 4},
    {DType::boolean, "bool", 1},  {DType::c64, "c64", 8},           {DType::c128, "c128", 16},
}};

constexpr std::array<DType, kNumDTypes> kAll = [] {
  std::array<DType, kNumDTypes> all{};
  for (int i = 0; i < kNumDTypes; ++i) all[i] = kDTypes[i].dtype;
  return all;
}();

}  // namespace

size_t dtype_size(DType d) { return kDTypes[static_cast<int>(d)].size; }
const char* dtype_name(DType d) { return kDTypes[static_cast<int>(d)].name; }
std::span<const DType> all_dtypes() { return kAll; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& row : kDTypes)
    if (name == row.name) return row.dtype;
  // Common aliases (torch / numpy spellings).
  static constexpr std::pair<std::string_view, DType> kAliases[] = {
      {"float32", DType::f32},  {"float", DType::f32},        {"float16", DType::f16},
      {"half", DType::f16},     {"bfloat16", DType::bf16},    {"float64", DType::f64},
      {"double", DType::f64},   {"int8", DType::i8},          {"uint8", DType::u8},
      {"int16", DType::i16},    {"int32", DType::i32},        {"int", DType::i32},
      {"int64", DType::i64},    {"long", DType::i64},         {"uint32", DType::u32},
      {"boolean", DType::boolean}, {"complex64", DType::c64}, {"complex128", DType::c128},
      {"float8_e4m3fn", DType::fp8_e4m3}, {"float8_e5m2", DType::fp8_e5m2},
  };
  for (auto [alias, d] : kAliases)
    if (name == alias) return d;
  return std::nullopt;
}

bool is_floating(DType d) {
  switch (d) {
    case DType::f32: case DType::f16: case DType::bf16: case DType::f64:
    case DType::fp8_e4m3: case DType::fp8_e5m2: return true;
    default: return false;
  }
}
bool is_integral(DType d) {
  switch (d) {
    case DType::i8: case DType::u8: case DType::i16: case DType::i32:
    case DType::i64: case DType::u32: return true;
    default: return false;
  }
}
bool is_complex(DType d) { return d == DType::c64 || d == DType::c128; }

}  // namespace baracuda
