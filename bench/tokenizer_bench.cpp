// Tokenizer throughput: a server tokenizes a chat's whole rendered prompt on
// every turn, so a long conversation's text is encoded again and again.
//
//   BM_Encode/<vocab>  encode ~256 KB of text (add_special, no special
//                      parsing); counters: bytes and tokens per second.
//
// Vocabularies are llama.cpp's test vocabularies in ../shared/fixtures/vocab
// (REPRISE_SHARED overrides ../shared); without them the benchmark is skipped.
// The text is the vocabulary's own pieces (decoded), joined by spaces,
// punctuation and newlines, so that every tokenizer sees words it knows.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

using namespace reprise;

namespace {

const char* const kVocabs[] = {"llama-spm", "phi-3", "gpt-2", "deepseek-llm", "falcon"};

std::filesystem::path vocab_dir() {
  if (const char* env = std::getenv("REPRISE_SHARED")) return std::filesystem::path(env) / "fixtures" / "vocab";
  return std::filesystem::path(REPRISE_SOURCE_DIR).parent_path() / "shared" / "fixtures" / "vocab";
}

const Tokenizer* tokenizer(int index) {
  static std::map<int, std::unique_ptr<Tokenizer>> loaded;
  auto& slot = loaded[index];
  if (!slot) {
    const auto path = vocab_dir() / (std::string("ggml-vocab-") + kVocabs[index] + ".gguf");
    if (!std::filesystem::exists(path)) return nullptr;
    slot = Tokenizer::from_gguf(*gguf::File::open(path.string()));
  }
  return slot.get();
}

std::string text_for(const Tokenizer& tok, size_t bytes) {
  std::mt19937 rng(7);
  const char* const separators[] = {" ", " ", " ", " ", ", ", ". ", "\n", "\n\n", "  "};
  std::string text;
  while (text.size() < bytes) {
    const auto id = static_cast<int32_t>(rng() % tok.n_vocab());
    if (tok.is_control(id)) continue;
    std::string piece = tok.token_to_piece(id);
    while (!piece.empty() && piece.front() == ' ') piece.erase(piece.begin());
    text += piece;
    text += separators[rng() % std::size(separators)];
  }
  return text;
}

void BM_Encode(benchmark::State& state) {
  const Tokenizer* tok = tokenizer(static_cast<int>(state.range(0)));
  if (!tok) {
    state.SkipWithError("../shared/fixtures/vocab is absent");
    return;
  }
  const std::string text = text_for(*tok, 256 * 1024);
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, true, false);
    tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetLabel(kVocabs[state.range(0)]);
  state.counters["MBps"] = benchmark::Counter(static_cast<double>(text.size()) / 1e6,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens_per_s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Encode)->DenseRange(0, static_cast<int>(std::size(kVocabs)) - 1)->Unit(benchmark::kMillisecond);

}  // namespace
