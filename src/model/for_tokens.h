// Per-token steps of a forward pass (norms, residual adds, biases) split
// across the pool by rows, when the batch is large enough to pay for the
// dispatch. Each row's operations are the same wherever it runs.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/thread_pool.h"

namespace reprise {

// Runs fn(t) for every token t in [0, n).
template <typename Fn>
void for_tokens(int64_t n, ThreadPool& pool, Fn&& fn) {
  constexpr int64_t kChunk = 8;
  if (n < 2 * kChunk || pool.size() == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  pool.parallel_for((n + kChunk - 1) / kChunk, [&](int64_t c) {
    const int64_t t1 = std::min(n, (c + 1) * kChunk);
    for (int64_t t = c * kChunk; t < t1; ++t) fn(t);
  });
}

// Runs fn(t) for t in [first, n).
template <typename Fn>
void for_tokens_from(int64_t first, int64_t n, ThreadPool& pool, Fn&& fn) {
  for_tokens(n - first, pool, [&](int64_t i) { fn(first + i); });
}

}  // namespace reprise
