#include "test_support.h"

#include <cstdlib>
#include <filesystem>

namespace reprise::test {

std::optional<std::string> shared_fixtures() {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("REPRISE_SHARED")) {
    fs::path p = fs::path(env) / "fixtures";
    if (fs::is_directory(p)) return p.string();
  }
  fs::path p = fs::path(REPRISE_SOURCE_DIR).parent_path() / "shared" / "fixtures";
  if (fs::is_directory(p)) return fs::canonical(p).string();
  return std::nullopt;
}

}  // namespace reprise::test
