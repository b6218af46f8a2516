#include "tensor/dtype.h"

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

bool dtype_supported(DType t) {
  switch (t) {
    case DType::F32: case DType::F16: case DType::BF16: case DType::Q8_0: case DType::Q4_0:
    case DType::Q4_1: case DType::Q5_0: case DType::Q5_1:
    case DType::Q4_K: case DType::Q5_K: case DType::Q6_K:
      return true;
    default:
      return false;
  }
}

size_t dtype_row_bytes(DType t, uint64_t n) {
  auto info = dtype_info(static_cast<uint32_t>(t));
  return static_cast<size_t>(n / info->block_elems * info->block_bytes);
}

}  // namespace reprise
