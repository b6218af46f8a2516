#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "model/synthetic_model.h"
#include "tensor/cpu_topology.h"

namespace reprise::cli {

std::string default_model_path() {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) dir = xdg;
  else if (const char* home = std::getenv("HOME"); home && *home) dir = fs::path(home) / ".cache";
  else dir = fs::temp_directory_path();
  dir /= "reprise";
  fs::create_directories(dir);
  fs::path path = dir / "synthetic-tiny.gguf";
  if (!fs::exists(path)) {
    fs::path tmp = path;
    tmp += ".partial";
    make_synthetic_model(synthetic_preset("tiny"), tmp.string());
    fs::rename(tmp, path);
  }
  return path.string();
}

int resolve_threads(int requested) {
  if (requested > 0) return requested;
  return default_thread_count();
}

}  // namespace reprise::cli
