#include "model_fixtures.h"

#include <map>
#include <mutex>

#include "util/scratch_dir.h"

namespace reprise::test {

LoadedModel& synthetic_model(const std::string& tag, const SyntheticModelSpec& spec) {
  static std::mutex mutex;
  static std::map<std::string, LoadedModel> models;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = models.find(tag);
  if (it != models.end()) return it->second;
  LoadedModel m;
  m.path = process_scratch_dir("reprise-test-").file(tag + ".gguf");
  make_synthetic_model(spec, m.path);
  m.file = gguf::File::open(m.path);
  m.model = load_model(*m.file);
  return models.emplace(tag, std::move(m)).first->second;
}

PairedSequences prefill_pairs(Model& model, std::mt19937_64& rng, int n_seq, int64_t min_len, int64_t max_len,
                              ThreadPool& pool) {
  auto rnd = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  const int64_t n_vocab = model.info().n_vocab;
  PairedSequences p;
  std::vector<float> logits;
  for (int s = 0; s < n_seq; ++s) {
    p.a.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    p.b.push_back(std::make_unique<FlatMemory>(model.state_spec()));
    std::vector<int32_t> prompt(rnd(min_len, max_len));
    for (auto& t : prompt) t = static_cast<int32_t>(rnd(3, n_vocab - 1));
    ForwardBatch b;
    b.tokens = prompt;
    model.forward(b, *p.a[s], logits, pool);
    model.forward(b, *p.b[s], logits, pool);
    p.pos.push_back(static_cast<int64_t>(prompt.size()));
  }
  return p;
}

}  // namespace reprise::test
