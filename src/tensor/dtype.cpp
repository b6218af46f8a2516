#include "tensor/dtype.h"

#include <algorithm>

namespace reprise {

std::optional<DTypeInfo> dtype_info(uint32_t raw) {
  switch (raw) {
    case 0: return DTypeInfo{"F32", 1, 4};
    case 1: return DTypeInfo{"F16", 1, 2};
    case 2: return DTypeInfo{"Q4_0", 32, 18};
    case 3: return DTypeInfo{"Q4_1", 32, 20};
    case 6: return DTypeInfo{"Q5_0", 32, 22};
    case 7: return DTypeInfo{"Q5_1", 32, 24};
    case 8: return DTypeInfo{"Q8_0", 32, 34};
    case 9: return DTypeInfo{"Q8_1", 32, 36};
    case 10: return DTypeInfo{"Q2_K", 256, 84};
    case 11: return DTypeInfo{"Q3_K", 256, 110};
    case 12: return DTypeInfo{"Q4_K", 256, 144};
    case 13: return DTypeInfo{"Q5_K", 256, 176};
    case 14: return DTypeInfo{"Q6_K", 256, 210};
    case 15: return DTypeInfo{"Q8_K", 256, 292};
    case 16: return DTypeInfo{"IQ2_XXS", 256, 66};
    case 17: return DTypeInfo{"IQ2_XS", 256, 74};
    case 18: return DTypeInfo{"IQ3_XXS", 256, 98};
    case 19: return DTypeInfo{"IQ1_S", 256, 50};
    case 20: return DTypeInfo{"IQ4_NL", 32, 18};
    case 21: return DTypeInfo{"IQ3_S", 256, 110};
    case 22: return DTypeInfo{"IQ2_S", 256, 82};
    case 23: return DTypeInfo{"IQ4_XS", 256, 136};
    case 24: return DTypeInfo{"I8", 1, 1};
    case 25: return DTypeInfo{"I16", 1, 2};
    case 26: return DTypeInfo{"I32", 1, 4};
    case 27: return DTypeInfo{"I64", 1, 8};
    case 28: return DTypeInfo{"F64", 1, 8};
    case 29: return DTypeInfo{"IQ1_M", 256, 56};
    case 30: return DTypeInfo{"BF16", 1, 2};
    case 34: return DTypeInfo{"TQ1_0", 256, 54};
    case 35: return DTypeInfo{"TQ2_0", 256, 66};
    case 39: return DTypeInfo{"MXFP4", 32, 17};
    default: return std::nullopt;
  }
}

std::string dtype_name(uint32_t raw) {
  if (auto info = dtype_info(raw)) return info->name;
  return "type#" + std::to_string(raw);
}

std::span<const DType> supported_dtypes() {
  static constexpr DType kSupported[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1,
                                         DType::Q5_0, DType::Q5_1, DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K,
                                         DType::Q4_K, DType::Q5_K, DType::Q6_K};
  return kSupported;
}

bool dtype_supported(DType t) { return std::ranges::find(supported_dtypes(), t) != supported_dtypes().end(); }

std::string supported_dtype_names() {
  std::string names;
  for (DType t : supported_dtypes()) names += (names.empty() ? "" : ", ") + dtype_name(static_cast<uint32_t>(t));
  return names;
}

size_t dtype_row_bytes(DType t, uint64_t n) {
  auto info = dtype_info(static_cast<uint32_t>(t));
  return static_cast<size_t>(n / info->block_elems * info->block_bytes);
}

}  // namespace reprise
