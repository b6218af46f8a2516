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
  const auto size = std::filesystem::file_size(path, ec);
  say("mapping " + path + " (" + std::to_string(size >> 20) + " MiB)");
  return load_model_bundle(gguf::File::open(path), path, progress);
}

std::unique_ptr<ModelBundle> load_model_bundle(std::unique_ptr<gguf::File> file, const std::string& path,
                                               const std::function<void(const std::string&)>& progress) {
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  auto bundle = std::make_unique<ModelBundle>();
  bundle->path = path;
  bundle->file = std::move(file);
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
  // Weights are packed copies now; the mapping's pages need not stay resident.
  bundle->file->release_resident();
  say("ready: " + std::to_string(bundle->model->info().n_params) + " parameters, fingerprint " +
      std::to_string(bundle->model->info().fingerprint[1]).substr(0, 8));
  return bundle;
}

void check_draft_compatible(const ModelBundle& target, const ModelBundle& draft) {
  const Tokenizer& a = *target.tokenizer;
  const Tokenizer& b = *draft.tokenizer;
  if (a.n_vocab() != b.n_vocab() || target.model->info().n_vocab != draft.model->info().n_vocab)
    throw Error("draft model " + draft.path + " has a different vocabulary size (" + std::to_string(b.n_vocab()) +
                ") than the target " + target.path + " (" + std::to_string(a.n_vocab()) + ")");
  for (int32_t id = 0; id < a.n_vocab(); ++id)
    if (a.token_text(id) != b.token_text(id))
      throw Error("draft model " + draft.path + " does not share the target's vocabulary: token " +
                  std::to_string(id) + " differs");
  if (target.model->state_spec().has_recurrent() || draft.model->state_spec().has_recurrent())
    throw Error("speculative decoding with recurrent (SSM/hybrid) models is not supported yet: rejected "
                "tokens cannot be rolled back exactly without per-step snapshots");
}

}  // namespace reprise
