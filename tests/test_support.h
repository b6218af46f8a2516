// Helpers shared by the test executables: locating ../shared fixtures,
// reading golden values, counting resident pages, polling for a condition.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace reprise::test {

// Raw little-endian float32 values of a golden logits/embedding file.
std::vector<float> read_f32(const std::string& path);
// Index of the largest of n values (first on ties).
int argmax(const float* x, int64_t n);
// The Q8_K rule's scale element of a 256-float section (ggml's
// quantize_row_q8_K): the first element of largest magnitude, NaNs never
// comparing larger; 0 when no element has a nonzero magnitude.
float q8_k_max_element(const float* section);

// How many of the pages of [p, p + bytes) are resident (mincore), or -1
// when mincore fails.
int64_t resident_pages(const void* p, size_t bytes);
// The number of pages in `bytes`.
int64_t pages_in(size_t bytes);

// Polls `cond` (every millisecond) until it holds or `timeout` has passed;
// returns whether it held.
bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout = std::chrono::seconds(2));

// Absolute path of ../shared/fixtures beside the source tree, or nullopt when
// the oracle data is absent (a user's fresh clone). REPRISE_SHARED overrides.
std::optional<std::string> shared_fixtures();

}  // namespace reprise::test

// Skips the current test with a clear message when ../shared is missing.
#define REPRISE_REQUIRE_SHARED(var)                                              \
  auto var##_opt = ::reprise::test::shared_fixtures();                           \
  if (!var##_opt) {                                                              \
    GTEST_SKIP() << "../shared/fixtures not found: oracle test skipped";        \
  }                                                                              \
  const std::string var = *var##_opt
