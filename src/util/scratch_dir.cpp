#include "util/scratch_dir.h"

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <system_error>
#include <vector>

#include "util/error.h"

namespace reprise {

ScratchDir::ScratchDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (::mkdtemp(buffer.data()) == nullptr) throw Error("cannot create a scratch directory from " + pattern);
  path_ = buffer.data();
}

ScratchDir::~ScratchDir() {
  std::error_code ignored;  // a destructor must not throw; a leftover is harmless
  std::filesystem::remove_all(path_, ignored);
}

std::string ScratchDir::file(const std::string& name) const { return (path_ / name).string(); }

const ScratchDir& process_scratch_dir(const std::string& prefix) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<ScratchDir>> dirs;
  std::lock_guard<std::mutex> lock(mutex);
  auto& dir = dirs[prefix];
  if (!dir) dir = std::make_unique<ScratchDir>(prefix);
  return *dir;
}

}  // namespace reprise
