#include "tensor/key_layout.h"

#include <immintrin.h>

#include <algorithm>

#include "tensor/avx2_math.h"
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

void store_keys(uint16_t* group_start, int64_t group, int64_t p0, int64_t n, const float* keys, int64_t key_stride,
                int64_t d) {
  if (group == kKeyGroup && n == kKeyGroup && d % 8 == 0) {
    // A whole group (prompts): 8 positions x 8 dimensions transposed in
    // registers, then converted, so each store is 8 positions of a dimension.
    for (int half = 0; half < 2; ++half)
      for (int64_t i = 0; i < d; i += 8) {
        __m256i r[8];
        for (int j = 0; j < 8; ++j)
          r[j] = _mm256_castps_si256(_mm256_loadu_ps(keys + (8 * half + j) * key_stride + i));
        kernels::avx2::transpose8x8_epi32(r);
        for (int j = 0; j < 8; ++j)
          _mm_storeu_si128(reinterpret_cast<__m128i*>(group_start + (i + j) * kKeyGroup + 8 * half),
                           _mm256_cvtps_ph(_mm256_castsi256_ps(r[j]), _MM_FROUND_TO_NEAREST_INT));
      }
    return;
  }
  for (int64_t r = 0; r < n; ++r) {
    uint16_t* dst = group_start + ((p0 + r) & (group - 1));
    const float* key = keys + r * key_stride;
    for (int64_t i = 0; i < d; ++i) dst[i * group] = f32_to_f16(key[i]);
  }
}

}  // namespace reprise
