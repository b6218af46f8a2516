#include "test_support.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <thread>

namespace reprise::test {

int64_t resident_pages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in_core((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, in_core.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char c : in_core) n += c & 1;
  return n;
}

bool eventually(const std::function<bool()>& cond, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

int64_t pages_in(size_t bytes) { return static_cast<int64_t>(bytes / static_cast<size_t>(sysconf(_SC_PAGESIZE))); }

std::vector<float> read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  const size_t n = size > 0 ? static_cast<size_t>(size) / 4 : 0;
  in.seekg(0);
  std::vector<float> v(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * 4));
  return v;
}

int argmax(const float* x, int64_t n) { return static_cast<int>(std::max_element(x, x + n) - x); }

float q8_k_max_element(const float* section) {
  float amax = 0, max = 0;
  for (int i = 0; i < 256; ++i)
    if (std::fabs(section[i]) > amax) {
      amax = std::fabs(section[i]);
      max = section[i];
    }
  return max;
}

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
