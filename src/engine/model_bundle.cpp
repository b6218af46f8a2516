#include "engine/model_bundle.h"

#include <filesystem>

#include "util/error.h"

namespace reprise {

std::string ModelBundle::chat_template() const {
  return file->get_string("tokenizer.chat_template").value_or("");
}

std::unique_ptr<ModelBundle> load_model_bundle(const std::string& path,
                                               const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw Error(path + ": no such file");
  auto bundle = std::make_unique<ModelBundle>();
  bundle->path = path;
  const auto size = std::filesystem::file_size(path, ec);
  say("mapping " + path + " (" + std::to_string(size >> 20) + " MiB)");
  bundle->file = gguf::File::open(path);
  say("validated " + std::to_string(bundle->file->tensors().size()) + " tensors; loading " +
      bundle->file->get_string("general.architecture").value_or("?") + " weights and fingerprinting");
  bundle->model = load_model(*bundle->file);
  say("loading tokenizer");
  bundle->tokenizer = Tokenizer::from_gguf(*bundle->file);
  if (bundle->tokenizer->n_vocab() != bundle->model->info().n_vocab &&
      bundle->tokenizer->n_vocab() > bundle->model->info().n_vocab)
    throw Error(path + ": tokenizer has " + std::to_string(bundle->tokenizer->n_vocab()) +
                " tokens but the model's output has " + std::to_string(bundle->model->info().n_vocab));
  for (int32_t id : bundle->tokenizer->vocab().eog) bundle->eog_tokens.push_back(id);
  say("ready: " + std::to_string(bundle->model->info().n_params) + " parameters, fingerprint " +
      std::to_string(bundle->model->info().fingerprint[1]).substr(0, 8));
  return bundle;
}

}  // namespace reprise
