// Structured output's cost per sampled token: the allowed set over a real
// vocabulary, in the document states a reply spends its tokens in.
//
//   BM_AllowedTokens/<vocab>/<state>
//     vocab: 0 llama-spm (32k pieces), 1 qwen3's gpt-2 style (151k)
//     state: 0 inside a string value, 1 a value's start, 2 after a value,
//            3 inside a number, 4 a key's start (declared keys only),
//            5 inside a key of json_object (any key)
//
// Vocabularies come from ../shared/fixtures (REPRISE_SHARED overrides
// ../shared); without them the benchmark is skipped.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "gguf/gguf_file.h"
#include "grammar/json_constraint.h"
#include "tokenizer/tokenizer.h"

using namespace reprise;

namespace {

const char* const kFiles[] = {"vocab/ggml-vocab-llama-spm.gguf", "models/qwen3-gpt2-f16.gguf"};

std::shared_ptr<JsonVocabulary> vocabulary(int index) {
  static std::map<int, std::shared_ptr<JsonVocabulary>> loaded;
  auto& slot = loaded[index];
  if (!slot) {
    const char* env = std::getenv("REPRISE_SHARED");
    const auto shared = env ? std::filesystem::path(env)
                            : std::filesystem::path(REPRISE_SOURCE_DIR).parent_path() / "shared";
    const auto path = shared / "fixtures" / kFiles[index];
    if (!std::filesystem::exists(path)) return nullptr;
    const auto tok = Tokenizer::from_gguf(*gguf::File::open(path.string()));
    slot = std::make_shared<JsonVocabulary>(output_pieces(*tok));
  }
  return slot;
}

void BM_AllowedTokens(benchmark::State& state) {
  auto vocab = vocabulary(static_cast<int>(state.range(0)));
  if (!vocab) {
    state.SkipWithError("../shared/fixtures is absent");
    return;
  }
  const auto schema = JsonSchema::compile(nlohmann::json::parse(R"({"type":"object","properties":{
      "name":{"type":"string"},"age":{"type":"number"},"tags":{"type":"array","items":{"type":"string"}},
      "address":{"type":"object","properties":{"city":{"type":"string"}}}},"required":["name"]})"));
  const char* const prefixes[] = {R"({"name": "Ada Love)", R"({"name": )", R"({"name": "Ada")",
                                  R"({"name": "Ada", "age": 3)", R"({"name": "Ada", )", R"({"Ada Lo)"};
  const std::string prefix = prefixes[state.range(1)];
  JsonConstraint c(state.range(1) == 5 ? JsonSchema::any_object() : schema, vocab);
  std::vector<uint8_t> allowed;
  bool may_end = false;
  // Reach the state through the prefix's single-byte pieces.
  std::map<std::string, int32_t> by_piece;
  for (int32_t id = 0; id < vocab->trie().vocabulary_size(); ++id)
    if (vocab->trie().piece(id).size() == 1) by_piece.emplace(vocab->trie().piece(id), id);
  for (char ch : prefix) {
    const auto it = by_piece.find(std::string(1, ch));
    if (it == by_piece.end() || !c.accept(it->second)) {
      state.SkipWithError("the vocabulary has no single-byte piece for the prefix");
      return;
    }
  }
  size_t n_allowed = 0;
  for (auto _ : state) {
    c.allowed_tokens(allowed, may_end);
    benchmark::DoNotOptimize(allowed.data());
  }
  for (uint8_t a : allowed) n_allowed += a;
  state.counters["allowed"] = static_cast<double>(n_allowed);
  state.counters["vocab"] = static_cast<double>(allowed.size());
}
BENCHMARK(BM_AllowedTokens)->ArgsProduct({{0, 1}, {0, 1, 2, 3, 4, 5}})->Unit(benchmark::kMicrosecond);

}  // namespace

