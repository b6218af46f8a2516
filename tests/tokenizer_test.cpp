// Tokenizer tests: llama.cpp's vocab test vectors and the golden prompts are
// the oracle; the rest checks decoding, streaming, errors and robustness.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "gguf/gguf_file.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace fs = std::filesystem;
using reprise::Tokenizer;

namespace {

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& p) {
  auto file = reprise::gguf::File::open(p.string());
  return Tokenizer::from_gguf(*file);
}

// The .inp format: every test string is followed by "\n__ggml_vocab_test__\n".
std::vector<std::string> split_inputs(const std::string& all) {
  static const std::string kSep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  size_t pos = 0;
  for (size_t hit; (hit = all.find(kSep, pos)) != std::string::npos; pos = hit + kSep.size())
    out.push_back(all.substr(pos, hit - pos));
  if (pos < all.size()) out.push_back(all.substr(pos));  // tolerate a missing last separator
  return out;
}

std::vector<std::vector<int32_t>> split_outputs(const std::string& all) {
  std::vector<std::vector<int32_t>> out;
  std::istringstream lines(all);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream ids(line);
    std::vector<int32_t> v;
    for (int32_t id; ids >> id;) v.push_back(id);
    out.push_back(std::move(v));
  }
  return out;
}

struct VocabCase {
  fs::path gguf;
  std::vector<std::string> inputs;
  std::vector<std::vector<int32_t>> expected;
};

std::vector<VocabCase> vocab_cases(const std::string& fixtures) {
  std::vector<VocabCase> cases;
  for (const auto& entry : fs::directory_iterator(fs::path(fixtures) / "vocab")) {
    const fs::path p = entry.path();
    if (p.extension() != ".gguf") continue;
    fs::path inp = p.string() + ".inp", out = p.string() + ".out";
    if (!fs::exists(inp) || !fs::exists(out)) continue;
    cases.push_back({p, split_inputs(read_file(inp)), split_outputs(read_file(out))});
  }
  std::sort(cases.begin(), cases.end(), [](const VocabCase& a, const VocabCase& b) { return a.gguf < b.gguf; });
  return cases;
}

std::string ids_to_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : " ") + std::to_string(id);
  return s;
}

std::string decode_streaming(const Tokenizer& tok, const std::vector<int32_t>& ids) {
  reprise::StreamDecoder dec(tok);
  std::string text;
  for (int32_t id : ids) text += dec.push(id);
  return text + dec.flush();
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    auto b = static_cast<uint8_t>(s[i]);
    size_t n = b < 0x80 ? 1 : (b >= 0xC2 && b <= 0xDF) ? 2 : (b >= 0xE0 && b <= 0xEF) ? 3 : (b >= 0xF0 && b <= 0xF4) ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    i += n;
  }
  return true;
}

// --- minimal GGUF image builder for error/unit cases -------------------------

class GgufBuilder {
 public:
  GgufBuilder& str(const std::string& key, const std::string& value) {
    this->key(key, 8);
    put_string(value);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& u32(const std::string& key, uint32_t value) {
    this->key(key, 4);
    put(value);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& boolean(const std::string& key, bool value) {
    this->key(key, 7);
    put(static_cast<uint8_t>(value));
    ++n_kv_;
    return *this;
  }
  GgufBuilder& strings(const std::string& key, const std::vector<std::string>& values) {
    this->key(key, 9);
    put(uint32_t{8});
    put(static_cast<uint64_t>(values.size()));
    for (const auto& v : values) put_string(v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& i32s(const std::string& key, const std::vector<int32_t>& values) {
    this->key(key, 9);
    put(uint32_t{5});
    put(static_cast<uint64_t>(values.size()));
    for (int32_t v : values) put(v);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& f32s(const std::string& key, const std::vector<float>& values) {
    this->key(key, 9);
    put(uint32_t{6});
    put(static_cast<uint64_t>(values.size()));
    for (float v : values) put(v);
    ++n_kv_;
    return *this;
  }
  std::unique_ptr<reprise::gguf::File> build() const {
    std::vector<uint8_t> image;
    auto append = [&](const void* p, size_t n) {
      auto b = static_cast<const uint8_t*>(p);
      image.insert(image.end(), b, b + n);
    };
    append("GGUF", 4);
    uint32_t version = 3;
    uint64_t n_tensors = 0;
    append(&version, 4);
    append(&n_tensors, 8);
    append(&n_kv_, 8);
    image.insert(image.end(), body_.begin(), body_.end());
    while (image.size() % 32) image.push_back(0);
    return reprise::gguf::File::from_bytes(image, "test.gguf");
  }

 private:
  template <typename T>
  void put(T v) {
    auto b = reinterpret_cast<const uint8_t*>(&v);
    body_.insert(body_.end(), b, b + sizeof v);
  }
  void put_string(const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    body_.insert(body_.end(), s.begin(), s.end());
  }
  void key(const std::string& k, uint32_t type) {
    put_string(k);
    put(type);
  }
  std::vector<uint8_t> body_;
  uint64_t n_kv_ = 0;
};

// A tiny SentencePiece vocabulary: <unk>, <s>, </s>, 256 byte tokens, a few
// pieces and one user-defined token.
GgufBuilder tiny_spm() {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    types.push_back(6);
    scores.push_back(0);
  }
  for (const char* piece : {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab"}) {
    tokens.push_back(piece);
    types.push_back(1);
    scores.push_back(-static_cast<float>(tokens.size()) / 100.0f);
  }
  tokens.push_back("<tool>");
  types.push_back(4);
  scores.push_back(0);
  GgufBuilder b;
  b.str("tokenizer.ggml.model", "llama").strings("tokenizer.ggml.tokens", tokens).i32s("tokenizer.ggml.token_type", types);
  b.f32s("tokenizer.ggml.scores", scores);
  return b;
}

}  // namespace

TEST(TokenizerVocab, LlamaCppTestVectors) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto cases = vocab_cases(fixtures);
  ASSERT_FALSE(cases.empty());
  size_t total = 0;
  for (const VocabCase& c : cases) {
    SCOPED_TRACE(c.gguf.filename().string());
    ASSERT_EQ(c.inputs.size(), c.expected.size()) << "malformed .inp/.out pair";
    auto tok = load_tokenizer(c.gguf);
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      auto got = tok->encode(c.inputs[i], /*add_special=*/false, /*parse_special=*/false);
      EXPECT_EQ(ids_to_string(got), ids_to_string(c.expected[i])) << "input #" << i << ": '" << c.inputs[i] << "'";
      ++total;
    }
  }
  std::cout << "[ vocab ] " << cases.size() << " vocabularies, " << total << " strings\n";
}

TEST(TokenizerVocab, RoundTripThroughStreamDecoder) {
  REPRISE_REQUIRE_SHARED(fixtures);
  for (const VocabCase& c : vocab_cases(fixtures)) {
    SCOPED_TRACE(c.gguf.filename().string());
    auto tok = load_tokenizer(c.gguf);
    if (tok->vocab().kind == reprise::tok::VocabKind::Wpm) continue;  // BERT normalises: not reversible
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      const std::string& text = c.inputs[i];
      std::string expected = text;
      // SentencePiece adds a space in front; llama.cpp's pieces keep it.
      if (tok->vocab().add_space_prefix && !text.empty()) expected = " " + text;
      EXPECT_EQ(decode_streaming(*tok, c.expected[i]), expected) << "input #" << i;
      // detokenize() removes the prefix space again.
      if (tok->vocab().kind == reprise::tok::VocabKind::Spm) {
        EXPECT_EQ(tok->detokenize(c.expected[i]), text);
      }
    }
  }
}

TEST(TokenizerGolden, PromptsTokenizeLikeLlamaCpp) {
  REPRISE_REQUIRE_SHARED(fixtures);
  size_t n_prompts = 0, n_models = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(fixtures) / "golden")) {
    const fs::path p = entry.path();
    if (p.extension() != ".json" || p.filename().string().find("vision") != std::string::npos) continue;
    auto golden = nlohmann::json::parse(read_file(p));
    const std::string model = golden.at("model").get<std::string>();
    SCOPED_TRACE(model);
    auto tok = load_tokenizer(fs::path(fixtures) / "models" / model);
    EXPECT_EQ(tok->n_vocab(), golden.at("n_vocab").get<int32_t>());
    for (const auto& prompt : golden.at("prompts")) {
      const std::string text = prompt.at("text").get<std::string>();
      const auto expected = prompt.at("tokens").get<std::vector<int32_t>>();
      EXPECT_EQ(ids_to_string(tok->encode(text, true, true)), ids_to_string(expected)) << text;
      ++n_prompts;
    }
    ++n_models;
  }
  EXPECT_GT(n_models, 0u);
  std::cout << "[ golden ] " << n_models << " models, " << n_prompts << " prompts\n";
}

TEST(TokenizerSpecial, ControlTokensOnlyWithParseSpecial) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto gpt2 = load_tokenizer(fs::path(fixtures) / "vocab" / "ggml-vocab-gpt-2.gguf");
  const int32_t eot = *gpt2->find_token("<|endoftext|>");
  auto with = gpt2->encode("Hi<|endoftext|>there", false, true);
  auto without = gpt2->encode("Hi<|endoftext|>there", false, false);
  EXPECT_NE(std::find(with.begin(), with.end(), eot), with.end());
  EXPECT_EQ(std::find(without.begin(), without.end(), eot), without.end());
  EXPECT_TRUE(gpt2->is_eog(eot));
  EXPECT_EQ(gpt2->token_to_piece(eot), "");
  EXPECT_EQ(gpt2->token_to_piece(eot, true), "<|endoftext|>");

  auto spm = load_tokenizer(fs::path(fixtures) / "vocab" / "ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(spm->bos_id(), 1);
  EXPECT_EQ(spm->eos_id(), 2);
  EXPECT_TRUE(spm->add_bos());
  EXPECT_FALSE(spm->add_eos());
  EXPECT_TRUE(spm->is_eog(2));
  EXPECT_FALSE(spm->is_eog(1));
  auto ids = spm->encode("<s>Hello</s>", true, true);
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 1);
  EXPECT_EQ(ids.back(), 2);
  auto plain = spm->encode("<s>Hello</s>", true, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 1), 1);  // only the added BOS
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
}

TEST(TokenizerSpecial, TinySpmVocabulary) {
  auto file = tiny_spm().build();
  auto tok = Tokenizer::from_gguf(*file);
  const int32_t tool = *tok->find_token("<tool>");
  const int32_t a = *tok->find_token("\xE2\x96\x81" "ab");
  // User-defined tokens are split out even without parse_special; the text
  // after a special token gets the space prefix again.
  EXPECT_EQ(tok->encode("ab<tool>ab", false, false), (std::vector<int32_t>{a, tool, a}));
  EXPECT_EQ(tok->encode("ab", true, false), (std::vector<int32_t>{1, a}));
  // Unknown characters fall back to byte tokens.
  auto ids = tok->encode("\xC3\xA9", false, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{*tok->find_token("\xE2\x96\x81"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(decode_streaming(*tok, ids), " \xC3\xA9");
  EXPECT_EQ(tok->detokenize(ids), "\xC3\xA9");
}

TEST(TokenizerStream, HoldsBackIncompleteUtf8) {
  auto file = tiny_spm().build();
  auto tok = Tokenizer::from_gguf(*file);
  auto byte = [&](int b) { return 3 + b; };  // <0xXX> ids in the tiny vocabulary
  reprise::StreamDecoder dec(*tok);
  // U+65E5 (E6 97 A5) then U+1F642 (F0 9F 99 82), one byte token at a time.
  EXPECT_EQ(dec.push(byte(0xE6)), "");
  EXPECT_EQ(dec.push(byte(0x97)), "");
  EXPECT_EQ(dec.push(byte(0xA5)), "\xE6\x97\xA5");
  EXPECT_EQ(dec.push(byte(0xF0)), "");
  EXPECT_EQ(dec.push(byte(0x9F)), "");
  EXPECT_EQ(dec.push(byte(0x99)), "");
  EXPECT_EQ(dec.push(byte(0x82)), "\xF0\x9F\x99\x82");
  EXPECT_EQ(dec.flush(), "");
  // An interrupted sequence and a stray continuation byte become U+FFFD.
  EXPECT_EQ(dec.push(byte(0xE6)), "");
  EXPECT_EQ(dec.push(*tok->find_token("a")), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(dec.push(byte(0x97)), "\xEF\xBF\xBD");
  // A dangling tail is replaced on flush.
  EXPECT_EQ(dec.push(byte(0xF0)), "");
  EXPECT_EQ(dec.push(byte(0x9F)), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
  // Control tokens render as nothing unless asked for.
  EXPECT_EQ(dec.push(1), "");
  reprise::StreamDecoder special(*tok, /*render_special=*/true);
  EXPECT_EQ(special.push(1), "<s>");
}

TEST(TokenizerErrors, MissingOrUnsupportedMetadata) {
  auto expect_error = [](const GgufBuilder& b, const std::string& needle) {
    auto file = b.build();
    try {
      Tokenizer::from_gguf(*file);
      ADD_FAILURE() << "expected reprise::Error mentioning '" << needle << "'";
    } catch (const reprise::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(GgufBuilder().str("general.architecture", "llama"), "tokenizer.ggml.model");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "llama"), "tokenizer.ggml.tokens");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "t5").strings("tokenizer.ggml.tokens", {"a"}), "t5");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "mystery").strings("tokenizer.ggml.tokens", {"a"}), "mystery");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "gpt2")
                   .str("tokenizer.ggml.pre", "no-such-pretokenizer")
                   .strings("tokenizer.ggml.tokens", {"a", "b", "ab"})
                   .strings("tokenizer.ggml.merges", {"a b"}),
               "no-such-pretokenizer");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "gpt2")
                   .str("tokenizer.ggml.pre", "gpt-2")
                   .strings("tokenizer.ggml.tokens", {"a", "b", "ab"}),
               "tokenizer.ggml.merges");
  expect_error(GgufBuilder().str("tokenizer.ggml.model", "llama").strings("tokenizer.ggml.tokens", {"a", "a"}),
               "duplicate");
  expect_error(GgufBuilder()
                   .str("tokenizer.ggml.model", "gpt2")
                   .str("tokenizer.ggml.pre", "chatglm-bpe")  // a model without BOS
                   .strings("tokenizer.ggml.tokens", {"a", "b", "ab"})
                   .strings("tokenizer.ggml.merges", {"a b"})
                   .boolean("tokenizer.ggml.add_bos_token", true),
               "add_bos_token");
}

TEST(TokenizerRobustness, RandomBytesNeverCrash) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(Tokenizer::from_gguf(*tiny_spm().build()));
  if (auto fixtures = reprise::test::shared_fixtures()) {
    for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf",
                             "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-falcon.gguf", "ggml-vocab-bert-bge.gguf",
                             "ggml-vocab-starcoder.gguf", "ggml-vocab-mpt.gguf", "ggml-vocab-phi-3.gguf"})
      toks.push_back(load_tokenizer(fs::path(*fixtures) / "vocab" / name));
  }
  std::mt19937 rng(1234);
  const std::string alphabet[] = {" ", "  ", "\n", "\t", "a", "Z", "7", "'s", "\xC3\xA9", "\xE6\x97\xA5", "\xF0\x9F\x99\x82",
                                  "<s>", "</s>", "<|endoftext|>", "\xE2\x96\x81", "\xCC\x81", "\xF4\x90\x80\x80", "\xED\xA0\x80"};
  size_t runs = 0;
  for (int iter = 0; iter < 400; ++iter) {
    std::string text;
    const int len = static_cast<int>(rng() % 48);
    for (int i = 0; i < len; ++i) {
      if (rng() % 3 == 0)
        text += alphabet[rng() % std::size(alphabet)];
      else
        text.push_back(static_cast<char>(rng() % 256));
    }
    for (const auto& tok : toks) {
      auto ids = tok->encode(text, iter % 2 == 0, iter % 3 == 0);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab()) << id;
      EXPECT_TRUE(is_valid_utf8(decode_streaming(*tok, ids)));
      ++runs;
    }
  }
  EXPECT_GE(runs, 400u);
}
