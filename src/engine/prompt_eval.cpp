#include "engine/prompt_eval.h"

#include <algorithm>
#include <sstream>

#include "engine/flat_memory.h"

namespace reprise {

namespace {
std::vector<std::pair<int32_t, float>> top_k(const float* logits, int64_t n, int k) {
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i);
  k = static_cast<int>(std::min<int64_t>(k, n));
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), [&](int32_t a, int32_t b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < k; ++i) out.emplace_back(ids[i], logits[ids[i]]);
  return out;
}
}  // namespace

PromptEvaluation evaluate_prompt(ModelBundle& bundle, const std::string& text, int n_greedy, ThreadPool& pool) {
  PromptEvaluation ev;
  ev.text = text;
  ev.tokens = bundle.tokenizer->encode(text, true, true);
  Model& model = *bundle.model;
  const int64_t n_vocab = model.info().n_vocab;
  FlatMemory memory(model.state_spec());
  std::vector<float> logits;
  ForwardBatch batch;
  batch.tokens = ev.tokens;
  batch.logits_for = LogitsFor::All;
  model.forward(batch, memory, logits, pool);
  for (size_t p = 0; p < ev.tokens.size(); ++p) ev.top8.push_back(top_k(logits.data() + p * n_vocab, n_vocab, 8));
  ev.last_logits.assign(logits.end() - n_vocab, logits.end());
  std::vector<float> step(ev.last_logits);
  int64_t pos = static_cast<int64_t>(ev.tokens.size());
  for (int s = 0; s < n_greedy; ++s) {
    auto top4 = top_k(step.data(), n_vocab, 4);
    ev.greedy.push_back(top4[0].first);
    ev.greedy_top4.push_back(top4);
    if (s + 1 == n_greedy) break;
    int32_t tok = top4[0].first;
    ForwardBatch next;
    next.tokens = std::span<const int32_t>(&tok, 1);
    next.pos0 = pos++;
    model.forward(next, memory, step, pool);
  }
  return ev;
}

std::vector<std::string> split_prompts_file(const std::string& contents) {
  std::vector<std::string> prompts;
  std::istringstream in(contents);
  std::string line, current;
  bool first = true;
  while (std::getline(in, line)) {
    if (line == "-----") {
      prompts.push_back(current);
      current.clear();
      first = true;
      continue;
    }
    if (!first) current += "\n";
    current += line;
    first = false;
  }
  if (!first || !current.empty()) prompts.push_back(current);
  return prompts;
}

nlohmann::json evaluations_to_json(const std::string& model_name, int64_t n_vocab,
                                   const std::vector<PromptEvaluation>& evals, const std::string& stem) {
  using nlohmann::json;
  json out = {{"model", model_name}, {"n_vocab", n_vocab}, {"prompts", json::array()}};
  auto pairs = [](const std::vector<std::pair<int32_t, float>>& v) {
    json a = json::array();
    for (auto& [id, l] : v) a.push_back({id, l});
    return a;
  };
  for (size_t i = 0; i < evals.size(); ++i) {
    const auto& e = evals[i];
    json p = {{"text", e.text}, {"tokens", e.tokens}};
    json top8 = json::array(), gtop4 = json::array();
    for (auto& v : e.top8) top8.push_back(pairs(v));
    for (auto& v : e.greedy_top4) gtop4.push_back(pairs(v));
    p["top8"] = top8;
    p["last_logits_file"] = stem + ".p" + std::to_string(i) + ".last_logits.f32";
    p["greedy"] = e.greedy;
    p["greedy_top4"] = gtop4;
    out["prompts"].push_back(p);
  }
  return out;
}

}  // namespace reprise
