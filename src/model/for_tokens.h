// Per-token steps of a forward pass (norms, residual adds, biases) split
// across the pool by rows, when the batch is large enough to pay for the
// dispatch. Each row's operations are the same wherever it runs.
#pragma once
#include <algorithm>
#include <cstdint>

#include "tensor/thread_pool.h"

namespace reprise {

// Runs fn(t) for every token t in [0, n), in chunks of at least kChunk
// rows, about 4 a thread: each chunk is a claim on a line the threads share
// (an image encoder's 1024 patch rows in 8-row chunks, 128 claims a step,
// encoded 1.1-1.3x slower than in 8 chunks).
template <typename Fn>
void for_tokens(int64_t n, ThreadPool& pool, Fn&& fn) {
  constexpr int64_t kChunk = 8;
  if (n < 2 * kChunk || pool.size() == 1) {
    for (int64_t t = 0; t < n; ++t) fn(t);
    return;
  }
  const int64_t chunk = std::max(kChunk, (n + 4 * pool.size() - 1) / (4 * pool.size()));
  pool.parallel_for((n + chunk - 1) / chunk, [&](int64_t c) {
    const int64_t t1 = std::min(n, (c + 1) * chunk);
    for (int64_t t = c * chunk; t < t1; ++t) fn(t);
  });
}

// Runs fn(t) for t in [first, n).
template <typename Fn>
void for_tokens_from(int64_t first, int64_t n, ThreadPool& pool, Fn&& fn) {
  for_tokens(n - first, pool, [&](int64_t i) { fn(first + i); });
}

}  // namespace reprise
