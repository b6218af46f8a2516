// Tokenizer tests: llama.cpp's vocab test vectors and the golden prompts are
// the oracle; the rest checks decoding, streaming, errors and robustness.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <span>
#include <sstream>

#include "gguf/gguf_file.h"
#include "test_support.h"
#include "tokenizer/bpe_pretokenizer.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/merge_table.h"
#include "tokenizer/token_index.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode_text.h"
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
// pieces (and `more`, scored below them) and one user-defined token.
GgufBuilder tiny_spm(const std::vector<std::string>& more = {}) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  std::vector<float> scores = {0, 0, 0};
  static const char* hex = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) {
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    types.push_back(6);
    scores.push_back(0);
  }
  std::vector<std::string> pieces = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab", "\xE2\x96\x81" "ab"};
  pieces.insert(pieces.end(), more.begin(), more.end());
  for (const std::string& piece : pieces) {
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

TEST(TokenizerSpecial, Phi3SpecialTokensEatFollowingWhitespace) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto phi3 = load_tokenizer(fs::path(fixtures) / "vocab" / "ggml-vocab-phi-3.gguf");
  const int32_t user = *phi3->find_token("<|user|>");
  const int32_t end = *phi3->find_token("<|end|>");
  EXPECT_TRUE(phi3->is_eog(end));
  auto spaced = phi3->encode("<|user|>  \n Hi<|end|>", false, true);
  auto tight = phi3->encode("<|user|>Hi<|end|>", false, true);
  EXPECT_EQ(spaced, tight);
  EXPECT_EQ(spaced.front(), user);
  EXPECT_EQ(spaced.back(), end);
  // <s> is exempt: the space after it survives (as a "▁" piece).
  EXPECT_NE(phi3->encode("<s> Hi", false, true), phi3->encode("<s>Hi", false, true));
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

namespace {

// `parts` random parts: entries of `alphabet`, token texts of `tok`'s
// vocabulary and, with stray_bytes, single random bytes.
std::string random_vocab_text(std::mt19937& rng, const Tokenizer& tok, std::span<const std::string> alphabet, int parts,
                              bool stray_bytes) {
  std::string text;
  for (int i = 0; i < parts; ++i) {
    switch (rng() % (stray_bytes ? 3 : 2)) {
      case 0: text += alphabet[rng() % alphabet.size()]; break;
      case 1: text += tok.token_text(static_cast<int32_t>(rng() % tok.n_vocab())); break;
      default: text.push_back(static_cast<char>(rng() % 256));
    }
  }
  return text;
}

}  // namespace

// SentencePiece merging word by word (cut before escaped spaces that no
// token can join to the byte before them) against merging the whole text at
// once, as llama.cpp does, over random escaped texts. The tiny vocabulary's
// extra pieces cross words ("b▁a", "▁▁", a newline before a space), so some
// cuts must be refused; the fixture vocabularies are the real ones.
TEST(TokenizerSpm, WordByWordMergingMatchesMergingTheWholeText) {
  const std::string space = "\xE2\x96\x81";
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(Tokenizer::from_gguf(
      *tiny_spm({"b" + space + "a", space + space, space + space + space, "\n" + space, "a" + space + space + "b", "\n"})
           .build()));
  if (auto fixtures = reprise::test::shared_fixtures()) {
    for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-baichuan.gguf"})
      toks.push_back(load_tokenizer(fs::path(*fixtures) / "vocab" / name));
  } else {
    std::cout << "[ skipped ] the fixture vocabularies: ../shared is absent\n";
  }
  std::mt19937 rng(46);
  const std::string alphabet[] = {space, space + space, "\n", "a", "b", "ab", "\xC3\xA9", "\xF0\x9F\x99\x82", "\xF0", "\xE2"};
  size_t words_cut = 0;
  for (const auto& tok : toks) {
    const auto* spm = dynamic_cast<const reprise::tok::SpmTokenizer*>(tok.get());
    ASSERT_NE(spm, nullptr);
    for (int iter = 0; iter < 300; ++iter) {
      const std::string text = random_vocab_text(rng, *tok, alphabet, static_cast<int>(rng() % 200), true);
      std::vector<int32_t> by_words, whole;
      spm->encode_escaped(text, by_words);
      reprise::tok::spm_merge(tok->vocab(), text, whole);
      ASSERT_EQ(ids_to_string(by_words), ids_to_string(whole)) << "text: '" << text << "'";
      words_cut += std::count(text.begin(), text.end(), '\x81');
    }
  }
  EXPECT_GT(words_cut, 1000u);
  // The tiny vocabulary's joins are honoured: "b a" is one token.
  const std::string b_space_a = "b" + space + "a";
  std::vector<int32_t> ids;
  dynamic_cast<const reprise::tok::SpmTokenizer&>(*toks[0]).encode_escaped(space + b_space_a, ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{*toks[0]->find_token(space), *toks[0]->find_token(b_space_a)}));
}

namespace {

// Byte-level BPE by its definition: merge the adjacent pair with the lowest
// rank (leftmost on ties) by text until none is left, then each symbol's
// token, or its bytes' tokens.
std::vector<int32_t> textbook_bpe(const reprise::tok::BpeTokenizer& tok, const std::string& word) {
  std::vector<std::string> symbols;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(reprise::tok::utf8_sequence_length(static_cast<uint8_t>(word[i])), word.size() - i);
    symbols.push_back(word.substr(i, n));
    i += n;
  }
  for (;;) {
    int best = -1, best_rank = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const int rank = tok.merge_rank(symbols[i], symbols[i + 1]);
      if (rank >= 0 && (best < 0 || rank < best_rank)) best = static_cast<int>(i), best_rank = rank;
    }
    if (best < 0) break;
    symbols[best] += symbols[best + 1];
    symbols.erase(symbols.begin() + best + 1);
  }
  std::vector<int32_t> out;
  for (const std::string& s : symbols) {
    if (auto id = tok.find_token(s)) {
      out.push_back(*id);
      continue;
    }
    for (char c : s)
      if (auto id = tok.find_token(std::string(1, c))) out.push_back(*id);
  }
  return out;
}

}  // namespace

// Byte-level BPE's merges looked up by token ids against the textbook merge
// by text, over random words of vocabulary pieces, alphabet characters and
// stray bytes. The tiny vocabulary has rules whose sides or result are no
// token ("x" is none; "y z" joins into "yz", which is none), so both lookups
// and the byte fallback run; the fixture vocabularies are real ones.
TEST(TokenizerBpe, MergingByTokenIdsMatchesMergingByText) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(Tokenizer::from_gguf(*GgufBuilder()
                                           .str("tokenizer.ggml.model", "gpt2")
                                           .str("tokenizer.ggml.pre", "gpt-2")
                                           .strings("tokenizer.ggml.tokens", {"a", "b", "ab", "y", "z", "xa", "aby", "q"})
                                           .strings("tokenizer.ggml.merges", {"a b", "y z", "x a", "ab y", "b a", "a b", "xa q"})
                                           .build()));
  // (the second "a b" is a duplicate: the first rank wins, as by text)
  if (auto fixtures = reprise::test::shared_fixtures()) {
    for (const char* name : {"ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf",
                             "ggml-vocab-starcoder.gguf"})
      toks.push_back(load_tokenizer(fs::path(*fixtures) / "vocab" / name));
  } else {
    std::cout << "[ skipped ] the fixture vocabularies: ../shared is absent\n";
  }
  std::mt19937 rng(4646);
  const std::string alphabet[] = {"a", "b", "x", "y", "z", "q", "\xC4\xA0", "\xC3\xA9", "\xE6\x97\xA5", "\xC4"};
  size_t words = 0;
  for (const auto& tok : toks) {
    const auto* bpe = dynamic_cast<const reprise::tok::BpeTokenizer*>(tok.get());
    ASSERT_NE(bpe, nullptr);
    for (int iter = 0; iter < 400; ++iter) {
      const std::string word = random_vocab_text(rng, *tok, alphabet, 1 + static_cast<int>(rng() % 12), false);
      std::vector<int32_t> got;
      bpe->encode_word(word, got);
      ASSERT_EQ(ids_to_string(got), ids_to_string(textbook_bpe(*bpe, word))) << "word: '" << word << "'";
      ++words;
    }
  }
  EXPECT_GE(words, 400u);
}

TEST(TokenizerBpe, MergeTableKeepsTheFirstRuleForAPairAndEveryRuleAsItGrows) {
  reprise::tok::MergeTable table;
  EXPECT_FALSE(table.find(0, 0));
  std::mt19937 rng(7);
  std::map<std::pair<int32_t, int32_t>, int32_t> first_rank;
  for (int32_t rank = 0; rank < 5000; ++rank) {
    // Ids up to 2^31 - 1 on both sides, and repeats.
    const int32_t left = rank % 7 == 0 ? 3 : static_cast<int32_t>(rng() % 0x7fffffff);
    const int32_t right = rank % 7 == 0 ? 5 : static_cast<int32_t>(rng() % 300);
    table.insert(left, right, {rank, rank + 1});
    first_rank.emplace(std::pair{left, right}, rank);
  }
  EXPECT_EQ(table.size(), first_rank.size());
  for (const auto& [pair, rank] : first_rank) {
    auto merge = table.find(pair.first, pair.second);
    ASSERT_TRUE(merge);
    EXPECT_EQ(merge->rank, rank);
    EXPECT_EQ(merge->merged, rank + 1);
  }
  EXPECT_EQ(table.find(3, 5)->rank, 0);
  EXPECT_FALSE(table.find(5, 3));
}

TEST(TokenizerVocab, TokenIndexFindsEveryTextAndRefusesDuplicates) {
  reprise::tok::TokenIndex index;
  EXPECT_FALSE(index.find("a"));
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) texts.push_back(std::to_string(i * 7919) + (i % 2 ? "\xE2\x96\x81" : ""));
  texts.push_back("");
  texts.push_back(std::string(1, '\0'));
  for (size_t i = 0; i < texts.size(); ++i) ASSERT_FALSE(index.insert(texts[i], static_cast<int32_t>(i))) << i;
  EXPECT_EQ(index.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) EXPECT_EQ(index.find(texts[i]), static_cast<int32_t>(i));
  // A duplicate names the first id and changes nothing.
  EXPECT_EQ(index.insert(texts[5], 99999), 5);
  EXPECT_EQ(index.find(texts[5]), 5);
  EXPECT_EQ(index.size(), texts.size());
  // Prefixes and extensions of present texts are absent.
  EXPECT_FALSE(index.find("79"));
  EXPECT_FALSE(index.find(texts[1] + "x"));
  EXPECT_FALSE(index.find(std::string(2, '\0')));
}

// --- differential test of the hand-coded pre-tokenizers ----------------------
//
// The oracle is the mechanism llama.cpp itself falls back to: std::regex over
// a "collapsed" text where every non-ASCII code point is replaced by one byte
// naming its category (patterns with \p{..}), or std::wregex over the code
// points (patterns without), non-ASCII whitespace being shown as U+000B in
// both. Each regex of the list re-splits every piece into matches and gaps.

namespace {

using reprise::tok::PreTokenizerKind;

struct OracleRegex {
  bool collapsed;
  std::string narrow;  // collapsed pattern
  std::wstring wide;   // code point pattern
};

OracleRegex collapsed(const std::string& pattern) {
  // \p{X} -> the category byte plus the ASCII members llama.cpp lists.
  static const std::map<std::string, std::string> categories = {
      {"\\p{N}", "\xD1\x30-\x39"},
      {"\\p{L}", "\xD2\x41-\x5A\x61-\x7A"},
      {"\\p{P}", "\xD3\x21-\x23\x25-\x2A\x2C-\x2F\x3A-\x3B\x3F-\x40\\\x5B-\\\x5D\x5F\\\x7B\\\x7D"},
      {"\\p{M}", "\xD4"},
      {"\\p{S}", "\xD5\\\x24\\\x2B\x3C-\x3E\x5E\x60\\\x7C"},
  };
  std::string out;
  bool inside = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '[' && (i == 0 || pattern[i - 1] != '\\')) {
      inside = true;
      out += '[';
      continue;
    }
    if (inside && pattern[i] == ']' && pattern[i - 1] != '\\') {
      inside = false;
      out += ']';
      continue;
    }
    auto it = categories.find(pattern.substr(i, 5));
    if (it != categories.end()) {
      out += inside ? it->second : "[" + it->second + "]";
      i += 4;
      continue;
    }
    out += pattern[i];
  }
  return {true, out, {}};
}
OracleRegex wide(const std::wstring& pattern) { return {false, {}, pattern}; }

const std::string kGpt2 = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)";
const std::string kContractions = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";

std::wstring deepseek_letters_class() {
  static const std::pair<uint32_t, uint32_t> ranges[] = {
      {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
      {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
      {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
      {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
      {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
      {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
      {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
      {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
      {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
      {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
      {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
      {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
      {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
      {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
      {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
      {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
      {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943}};
  std::wstring s = L"\\s?[";
  for (auto [lo, hi] : ranges) {
    s += static_cast<wchar_t>(lo);
    s += L'-';
    s += static_cast<wchar_t>(hi);
  }
  return s + L"]+";
}

std::vector<OracleRegex> oracle_regexes(PreTokenizerKind kind) {
  const std::string llama3 = kContractions +
                             "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                             "\\s+(?!\\S)|\\s+";
  const std::string qwen2 = kContractions +
                            "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
                            "\\s+(?!\\S)|\\s+";
  const std::string qwen35 = kContractions +
                             "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
                             "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  const std::wstring poro = L" ?[^(\\s|.,!?\u2026\u3002\uFF0C\u3001\u0964\u06D4\u060C)]+";
  switch (kind) {
    case PreTokenizerKind::Default:
      return {collapsed("[\\p{P}\\$\\+<=>\\^~\\|]+"), collapsed(kGpt2), collapsed("\\p{N}+"), wide(L"[0-9][0-9][0-9]")};
    case PreTokenizerKind::Gpt2:
      return {collapsed(kGpt2)};
    case PreTokenizerKind::Llama3:
      return {collapsed(llama3)};
    case PreTokenizerKind::Qwen2:
      return {collapsed(qwen2)};
    case PreTokenizerKind::Qwen35:
      return {collapsed(qwen35)};
    case PreTokenizerKind::DeepseekLlm:
      return {wide(L"[\r\n]"), wide(deepseek_letters_class()),
              wide(L"\\s?[!-/:-~\uFF01-\uFF0F\uFF1A-\uFF5E\u2018-\u201F\u3000-\u3002]+"), wide(L"\\s+$"),
              wide(L"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"), collapsed("\\p{N}+")};
    case PreTokenizerKind::DeepseekCoder:
      return {wide(L"[\r\n]"), collapsed("\\s?\\p{L}+"), collapsed("\\s?\\p{P}+"),
              wide(L"[\u4E00-\u9FA5\u0800-\u4E00\uAC00-\uD7FF]+"), collapsed("\\p{N}")};
    case PreTokenizerKind::Deepseek3:
      return {collapsed("\\p{N}{1,3}"), wide(L"[\u4E00-\u9FA5\u3040-\u309F\u30A0-\u30FF]+"),
              collapsed("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+|"
                        " ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+")};
    case PreTokenizerKind::Falcon:
      return {collapsed("[\\p{P}\\$\\+<=>\\^~\\|`]+"), collapsed(kGpt2), wide(L"[0-9][0-9][0-9]")};
    case PreTokenizerKind::Starcoder:
      return {collapsed("\\p{N}"), collapsed(kGpt2)};
    case PreTokenizerKind::Poro:
      return {wide(poro)};
    case PreTokenizerKind::Viking:
      return {wide(poro), collapsed("\\p{N}")};
  }
  return {};
}

template <typename CharT>
std::vector<size_t> regex_pass(const std::basic_string<CharT>& text, const std::basic_regex<CharT>& re,
                               const std::vector<size_t>& pieces) {
  std::vector<size_t> out;
  size_t start = 0;
  for (size_t len : pieces) {
    std::regex_iterator<const CharT*> it(text.data() + start, text.data() + start + len, re), end;
    size_t done = 0;
    for (; it != end; ++it) {
      size_t pos = static_cast<size_t>(it->position()), n = static_cast<size_t>(it->length());
      if (pos > done) out.push_back(pos - done);
      out.push_back(n);
      done = pos + n;
    }
    if (done < len) out.push_back(len - done);
    start += len;
  }
  return out;
}

std::vector<std::string> oracle_pretokenize(PreTokenizerKind kind, const std::string& text) {
  using namespace reprise::tok;
  const std::vector<uint32_t> cpts = decode_utf8_lenient(text);
  std::string narrow;
  std::wstring wtext;
  for (uint32_t c : cpts) {
    const CodepointFlags f = codepoint_flags(c);
    wtext += static_cast<wchar_t>(c > 0x7F && f.whitespace() ? 0x0B : c);
    if (c < 0x80) {
      narrow += static_cast<char>(c);
    } else if (f.whitespace()) {
      narrow += '\x0B';
    } else {
      narrow += f.number() ? '\xD1' : f.letter() ? '\xD2' : f.punctuation() ? '\xD3' : f.mark() ? '\xD4'
              : f.symbol() ? '\xD5' : '\xD0';
    }
  }
  std::vector<size_t> pieces;
  if (!cpts.empty()) pieces.push_back(cpts.size());
  for (const OracleRegex& r : oracle_regexes(kind)) {
    constexpr auto flags = std::regex_constants::optimize | std::regex_constants::nosubs;
    if (r.collapsed)
      pieces = regex_pass(narrow, std::regex(r.narrow, flags), pieces);
    else
      pieces = regex_pass(wtext, std::wregex(r.wide, flags), pieces);
  }
  std::vector<std::string> words;
  size_t start = 0;
  for (size_t len : pieces) {
    std::string utf8, word;
    for (size_t i = start; i < start + len; ++i) append_utf8(utf8, cpts[i]);
    for (char c : utf8) word += byte_to_gpt2_char(static_cast<uint8_t>(c));
    words.push_back(word);
    start += len;
  }
  return words;
}

}  // namespace

TEST(TokenizerPreTokenizer, MatchesRegexOracle) {
  const std::string alphabet[] = {
      " ", " ", "  ", "\t", "\n", "\r\n", "\x0B", "a", "Z", "q", "x", "7", "0", "42", "'", "'s", "'S", "'re", "'Ll",
      "'ve", "'d", "'M", ".", ",", "!", "?", "~", "`", "$", "+", "<", "=", "^", "|", "(", ")", "-", "_", "\\",
      "\xC3\xA9",          // é
      "\xD0\x96",          // Ж
      "\xCC\x81",          // combining acute
      "\xC2\xA0",          // NBSP
      "\xC2\x85",          // NEL
      "\xE3\x80\x80",      // ideographic space
      "\xE3\x80\x82",      // 。
      "\xE3\x80\x81",      // 、
      "\xEF\xBC\x8C",      // ，
      "\xEF\xBC\x81",      // ！
      "\xE2\x80\x99",      // ’
      "\xE2\x80\xA6",      // …
      "\xE2\x82\xAC",      // €
      "\xC2\xBD",          // ½
      "\xD9\xA3",          // Arabic-Indic 3
      "\xE6\x97\xA5",      // 日
      "\xE3\x81\x82",      // あ
      "\xE3\x82\xA2",      // ア
      "\xED\x95\x9C",      // 한
      "\xE0\xA4\x95",      // क
      "\xE0\xA4\xBF",      // ि (mark)
      "\xE0\xA5\xA4",      // ।
      "\xE1\xBE\xBE",      // ι (U+1FBE)
      "\xE2\x84\xAA",      // Kelvin sign
      "\xF0\x9F\x99\x82",  // emoji
      "\xF0\x90\x90\x80",  // Deseret capital
      "\xE2\x80\x8B",      // zero width space (Cf)
      "\xFF",              // invalid byte
  };
  const PreTokenizerKind kinds[] = {
      PreTokenizerKind::Default,     PreTokenizerKind::Gpt2,          PreTokenizerKind::Llama3,
      PreTokenizerKind::Qwen2,       PreTokenizerKind::Qwen35,        PreTokenizerKind::DeepseekLlm,
      PreTokenizerKind::DeepseekCoder, PreTokenizerKind::Deepseek3,   PreTokenizerKind::Falcon,
      PreTokenizerKind::Starcoder,   PreTokenizerKind::Poro,          PreTokenizerKind::Viking};
  std::mt19937 rng(42);
  for (PreTokenizerKind kind : kinds) {
    SCOPED_TRACE(static_cast<int>(kind));
    int failures = 0;
    for (int iter = 0; iter < 250 && failures < 5; ++iter) {
      std::string text;
      const int len = 1 + static_cast<int>(rng() % 24);
      for (int i = 0; i < len; ++i) text += alphabet[rng() % std::size(alphabet)];
      auto got = reprise::tok::pretokenize(kind, text);
      auto want = oracle_pretokenize(kind, text);
      if (got != want) {
        ++failures;
        ADD_FAILURE() << "text '" << text << "': " << got.size() << " words, oracle " << want.size();
      }
    }
  }
}
