// Block layouts of the quantized weight types reprise computes with. These are
// the on-disk GGUF layouts, so tensor data is used in place.
#pragma once
#include <cstdint>

namespace reprise {

constexpr int kQK8_0 = 32;
constexpr int kQK4_0 = 32;

// Q8_0: 32 signed bytes scaled by one f16: x[i] = d * qs[i].
struct BlockQ8_0 {
  uint16_t d;
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ8_0) == 34);

// Q4_0: 32 nibbles, low nibbles hold elements 0..15 and high nibbles 16..31:
// x[i] = d * (nibble - 8).
struct BlockQ4_0 {
  uint16_t d;
  uint8_t qs[kQK4_0 / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

}  // namespace reprise
