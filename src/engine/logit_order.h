// Orders sampling candidates by logit, highest first, lower ids first among
// equal logits: exactly std::sort with that comparator, in linear time.
//
// Why: with top-k off (top_k = 0, which several chat front ends send), every
// token sorted the whole vocabulary; std::sort of 32 000 candidates took
// ~3 ms per token, a quarter of the speed of a small model's decode, and
// ~15 ms at a 150 000-token vocabulary. A stable radix sort on the logits'
// bits gives the same order (so the same draws) in a few passes.
#pragma once
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace reprise {

// The order: higher logit first, lower id first among equal logits (+0 and
// -0 are equal). Not a strict weak order when a logit is NaN.
inline bool logit_before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// Sorts `candidates` (logit, id), given in ascending id order, by logit
// descending; equal logits (+0 and -0 count as equal) keep ascending ids.
// `scratch` is working memory, kept by the caller to avoid reallocation.
// NaN logits are placed after every other value.
void order_by_logit(std::vector<std::pair<float, int32_t>>& candidates,
                    std::vector<std::pair<float, int32_t>>& scratch);

// The first k candidates (logit, id) in that order (what std::partial_sort
// with the comparator above gives over the whole vocabulary) into `out`,
// reading only the 64-logit chunks whose maximum reaches the k-th largest
// chunk maximum: every top-k logit does. 0 < k < logits.size(). False, with
// `out` unspecified, when a logit is NaN (the comparator does not order
// NaN; the caller sorts as before). `chunk_max` is working memory.
//
// Why: partial_sort over the candidate pairs of a 32 000-token vocabulary
// took ~60 us a token, a tenth of a small model's decode step, five times
// that at a 150 000-token vocabulary.
bool select_top_k(std::span<const float> logits, size_t k, std::vector<std::pair<float, int32_t>>& out,
                  std::vector<float>& chunk_max);

// The index of the highest logit, the lowest on ties (+0 and -0 tie); NaN
// never wins, and a NaN at index 0 is kept (0 is returned): what a scan
// that takes index i when logits[i] > logits[best] gives. 0 when empty.
int32_t highest_logit(std::span<const float> logits);

}  // namespace reprise
