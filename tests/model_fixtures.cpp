#include "model_fixtures.h"

#include <unistd.h>

#include <filesystem>
#include <map>
#include <mutex>

namespace reprise::test {

LoadedModel& synthetic_model(const std::string& tag, const SyntheticModelSpec& spec) {
  static std::mutex mutex;
  static std::map<std::string, LoadedModel> models;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = models.find(tag);
  if (it != models.end()) return it->second;
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("reprise-test-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  LoadedModel m;
  m.path = (dir / (tag + ".gguf")).string();
  make_synthetic_model(spec, m.path);
  m.file = gguf::File::open(m.path);
  m.model = load_model(*m.file);
  return models.emplace(tag, std::move(m)).first->second;
}

}  // namespace reprise::test
