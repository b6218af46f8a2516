#include "engine/logit_order.h"

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

}  // namespace reprise
