// Synthetic models written once per test process into a temp directory, so
// tests that need a model run without ../shared.
#pragma once
#include <memory>
#include <string>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "model/synthetic_model.h"

namespace reprise::test {

struct LoadedModel {
  std::string path;
  std::unique_ptr<gguf::File> file;
  std::unique_ptr<Model> model;
};

// Writes (once) and loads the synthetic model for `spec`, cached under `tag`.
LoadedModel& synthetic_model(const std::string& tag, const SyntheticModelSpec& spec);

}  // namespace reprise::test
