// Evaluates prompts the way the golden oracle files describe them: per-position
// top-k logits, last-position logits and a greedy continuation. Used by
// `reprise eval` so any GGUF can be compared against another engine's output.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/model_bundle.h"
#include "tensor/thread_pool.h"

namespace reprise {

struct PromptEvaluation {
  std::string text;
  std::vector<int32_t> tokens;
  std::vector<std::vector<std::pair<int32_t, float>>> top8;  // per prompt position
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
  std::vector<std::vector<std::pair<int32_t, float>>> greedy_top4;
};

PromptEvaluation evaluate_prompt(ModelBundle& bundle, const std::string& text, int n_greedy, ThreadPool& pool);

// Splits a prompts file: prompts separated by lines holding only "-----".
std::vector<std::string> split_prompts_file(const std::string& contents);

// The golden-file JSON for `evals`; last_logits_file names are
// <stem>.p<i>.last_logits.f32 (the caller writes those files).
nlohmann::json evaluations_to_json(const std::string& model_name, int64_t n_vocab,
                                   const std::vector<PromptEvaluation>& evals, const std::string& stem);

}  // namespace reprise
