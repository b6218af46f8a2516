#include "tensor/key_layout.h"

#include <algorithm>

#include "tensor/fp16.h"

namespace reprise {

void gather_key_rows(const KeyView& k, int64_t p0, int64_t n, uint16_t* out) {
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = p0 + j;
    const uint16_t* src = k.group_start(p) + (p & (k.group - 1));
    uint16_t* dst = out + j * k.d;
    for (int64_t i = 0; i < k.d; ++i) dst[i] = src[i * k.group];
  }
}

const uint16_t* key_tile16(const KeyView& k, int64_t t0, int64_t lo, int64_t hi, uint16_t* scratch) {
  if (t0 + kKeyGroup <= lo || t0 >= hi) {  // no stored group to read
    std::fill_n(scratch, kKeyGroup * k.d, uint16_t{0});
    return scratch;
  }
  if (k.group == kKeyGroup) return k.group_start(t0);
  const int64_t G = k.group;
  for (int64_t g = t0; g < t0 + kKeyGroup; g += G) {
    const bool wanted = g + G > lo && g < hi;  // this group holds some position of [lo, hi)
    const uint16_t* src = wanted ? k.group_start(g) : nullptr;
    for (int64_t i = 0; i < k.d; ++i) {
      uint16_t* dst = scratch + i * kKeyGroup + (g - t0);
      if (src)
        std::copy_n(src + i * G, G, dst);
      else
        std::fill_n(dst, G, uint16_t{0});
    }
  }
  return scratch;
}

void store_key(uint16_t* group_start, int64_t group, int64_t p, const float* key, int64_t d) {
  uint16_t* dst = group_start + (p & (group - 1));
  for (int64_t i = 0; i < d; ++i) dst[i * group] = f32_to_f16(key[i]);
}

}  // namespace reprise
