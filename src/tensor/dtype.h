// ggml tensor element types as stored in GGUF files, with their block layout.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace reprise {

// Numeric ids are the GGUF/ggml ones; do not renumber.
enum class DType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q8_1 = 9,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, Q8_K = 15,
  IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21,
  IQ2_S = 22, IQ4_XS = 23, I8 = 24, I16 = 25, I32 = 26, I64 = 27, F64 = 28,
  IQ1_M = 29, BF16 = 30, TQ1_0 = 34, TQ2_0 = 35, MXFP4 = 39,
};

struct DTypeInfo {
  const char* name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
};

// Layout of any type ggml defines (so sizes of unsupported tensors can still be
// validated); nullopt for ids ggml does not define.
std::optional<DTypeInfo> dtype_info(uint32_t raw_type);

// Name for messages, e.g. "Q4_K" or "type#99".
std::string dtype_name(uint32_t raw_type);

// The types reprise computes with: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
// Q5_1, IQ4_NL, IQ4_XS, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
std::span<const DType> supported_dtypes();
bool dtype_supported(DType t);
// "F32, F16, ..." for messages.
std::string supported_dtype_names();

// Bytes for n elements (n must be a multiple of the block size).
size_t dtype_row_bytes(DType t, uint64_t n);

}  // namespace reprise
