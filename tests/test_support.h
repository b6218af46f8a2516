// Helpers shared by the test executables: locating ../shared fixtures.
#pragma once
#include <optional>
#include <string>

namespace reprise::test {

// Absolute path of ../shared/fixtures beside the source tree, or nullopt when
// the oracle data is absent (a user's fresh clone). REPRISE_SHARED overrides.
std::optional<std::string> shared_fixtures();

}  // namespace reprise::test

// Skips the current test with a clear message when ../shared is missing.
#define REPRISE_REQUIRE_SHARED(var)                                              \
  auto var##_opt = ::reprise::test::shared_fixtures();                           \
  if (!var##_opt) GTEST_SKIP() << "../shared/fixtures not found: oracle test skipped"; \
  const std::string var = *var##_opt
