#include "engine/logit_order.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

namespace reprise {
namespace {

// A key whose unsigned order is the logits' descending order: the float's
// bits mapped to an ascending unsigned order, then inverted. -0 is +0; NaN
// sorts last.
uint32_t descending_key(float f) {
  if (std::isnan(f)) return 0xffffffffu;
  if (f == 0.0f) f = 0.0f;
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint32_t ascending = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return ~ascending;  // never 0xffffffff: only a NaN's bits map to 0
}

}  // namespace

void order_by_logit(std::vector<std::pair<float, int32_t>>& candidates,
                    std::vector<std::pair<float, int32_t>>& scratch) {
  const size_t n = candidates.size();
  if (n < 2) return;
  scratch.resize(n);
  // Least significant byte first; each pass is stable, so equal keys keep
  // the ascending ids they came in with.
  auto* src = &candidates;
  auto* dst = &scratch;
  for (int shift = 0; shift < 32; shift += 8) {
    std::array<size_t, 257> count{};
    for (const auto& c : *src) ++count[((descending_key(c.first) >> shift) & 0xff) + 1];
    if (count[1 + ((descending_key((*src)[0].first) >> shift) & 0xff)] == n) continue;  // one bucket: nothing moves
    for (int b = 0; b < 256; ++b) count[b + 1] += count[b];
    for (const auto& c : *src) (*dst)[count[(descending_key(c.first) >> shift) & 0xff]++] = c;
    std::swap(src, dst);
  }
  if (src != &candidates) candidates.swap(scratch);
}

namespace {

constexpr size_t kChunk = 64;  // logits per chunk: 8 AVX2 vectors

// Each chunk's maximum into chunk_max (the last chunk may be short); false
// when a logit is NaN.
bool chunk_maxima(std::span<const float> logits, std::vector<float>& chunk_max) {
  const size_t n = logits.size(), n_chunks = (n + kChunk - 1) / kChunk;
  chunk_max.resize(n_chunks);
  const float* v = logits.data();
  __m256 nan = _mm256_setzero_ps();
  size_t c = 0;
  for (; (c + 1) * kChunk <= n; ++c) {
    const float* p = v + c * kChunk;
    __m256 m = _mm256_loadu_ps(p);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(m, m, _CMP_UNORD_Q));
    for (size_t i = 8; i < kChunk; i += 8) {
      const __m256 x = _mm256_loadu_ps(p + i);
      nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      m = _mm256_max_ps(m, x);
    }
    const __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    const __m128 q = _mm_max_ps(h, _mm_movehl_ps(h, h));
    chunk_max[c] = _mm_cvtss_f32(_mm_max_ss(q, _mm_movehdup_ps(q)));
  }
  if (_mm256_movemask_ps(nan) != 0) return false;
  if (c < n_chunks) {
    float m = v[c * kChunk];
    for (size_t i = c * kChunk; i < n; ++i) {
      if (std::isnan(v[i])) return false;
      m = std::max(m, v[i]);
    }
    chunk_max[c] = m;
  }
  return true;
}

}  // namespace

bool select_top_k(std::span<const float> logits, size_t k, std::vector<std::pair<float, int32_t>>& out,
                  std::vector<float>& chunk_max) {
  if (k == 0 || k >= logits.size() || !chunk_maxima(logits, chunk_max)) return false;
  const size_t n = logits.size(), n_chunks = chunk_max.size();
  // k chunks each hold a logit at or above the k-th largest chunk maximum,
  // so the k-th largest logit is at or above it too. (The maxima are
  // selected in a copy after them.)
  float threshold = -INFINITY;
  if (n_chunks > k) {
    chunk_max.resize(2 * n_chunks);
    const auto first = chunk_max.begin() + static_cast<std::ptrdiff_t>(n_chunks);
    std::copy(chunk_max.begin(), first, first);
    std::nth_element(first, first + static_cast<std::ptrdiff_t>(k - 1), chunk_max.end(), std::greater<float>());
    threshold = first[static_cast<std::ptrdiff_t>(k - 1)];
  }
  out.clear();
  for (size_t c = 0; c < n_chunks; ++c) {
    if (chunk_max[c] < threshold) continue;
    const size_t end = std::min(n, (c + 1) * kChunk);
    for (size_t i = c * kChunk; i < end; ++i)
      if (logits[i] >= threshold) out.emplace_back(logits[i], static_cast<int32_t>(i));
  }
  std::partial_sort(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(k), out.end(), logit_before);
  out.resize(k);
  return true;
}

int32_t highest_logit(std::span<const float> logits) {
  const size_t n = logits.size();
  if (n == 0 || std::isnan(logits[0])) return 0;
  const float* v = logits.data();
  // The maximum with NaN lanes as -inf (logits[0] is a number, so the
  // maximum is one), then its first index.
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 m = neg_inf;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(v + i);
    m = _mm256_max_ps(m, _mm256_blendv_ps(neg_inf, x, _mm256_cmp_ps(x, x, _CMP_ORD_Q)));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = v[0];
  for (float l : lanes) best = std::max(best, l);
  for (; i < n; ++i)
    if (v[i] > best) best = v[i];
  const __m256 target = _mm256_set1_ps(best);
  for (i = 0; i + 8 <= n; i += 8)
    if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), target, _CMP_EQ_OQ)))
      return static_cast<int32_t>(i + __builtin_ctz(static_cast<unsigned>(hit)));
  for (; i < n; ++i)
    if (v[i] == best) return static_cast<int32_t>(i);
  return 0;  // not reached: best is one of the logits
}

}  // namespace reprise
