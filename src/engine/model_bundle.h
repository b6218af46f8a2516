// A GGUF file loaded for serving: the mapping, the model and its tokenizer.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace reprise {

struct ModelBundle {
  std::string path;
  std::unique_ptr<gguf::File> file;  // must outlive model and tokenizer
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::vector<int32_t> eog_tokens;

  // The GGUF's tokenizer.chat_template, or "" when it has none.
  std::string chat_template() const;
};

// Loads and validates everything; `progress` (may be empty) receives
// human-readable steps while a large model loads. Throws reprise::Error.
std::unique_ptr<ModelBundle> load_model_bundle(const std::string& path,
                                               const std::function<void(const std::string&)>& progress = {});
// The same for a file the caller has opened already (gguf::File::open of
// `path`), so it is not mapped and parsed twice.
std::unique_ptr<ModelBundle> load_model_bundle(std::unique_ptr<gguf::File> file, const std::string& path,
                                               const std::function<void(const std::string&)>& progress = {});

// Throws reprise::Error unless `draft` can draft for `target`: the same
// vocabulary (every token's text) and no recurrent layers in either.
void check_draft_compatible(const ModelBundle& target, const ModelBundle& draft);

}  // namespace reprise
