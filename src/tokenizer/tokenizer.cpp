#include "tokenizer/tokenizer.h"

#include "gguf/gguf_file.h"
#include "tokenizer/bpe_tokenizer.h"
#include "tokenizer/spm_tokenizer.h"
#include "tokenizer/wpm_tokenizer.h"
#include "util/error.h"

namespace reprise {

std::unique_ptr<Tokenizer> Tokenizer::from_gguf(const gguf::File& file) {
  tok::Vocab vocab = tok::Vocab::from_gguf(file);
  switch (vocab.kind) {
    case tok::VocabKind::Spm:
      return std::make_unique<tok::SpmTokenizer>(std::move(vocab));
    case tok::VocabKind::Bpe:
      return std::make_unique<tok::BpeTokenizer>(std::move(vocab), file);
    case tok::VocabKind::Wpm:
      return std::make_unique<tok::WpmTokenizer>(std::move(vocab));
  }
  file.fail("unsupported tokenizer");
}

Tokenizer::Tokenizer(tok::Vocab vocab) : vocab_(std::move(vocab)) {}
Tokenizer::~Tokenizer() = default;

const std::string& Tokenizer::token_text(int32_t id) const {
  if (!vocab_.valid(id)) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
  return vocab_.tokens[id].text;
}

bool Tokenizer::is_control(int32_t id) const {
  return vocab_.valid(id) && (vocab_.attrs(id) & (tok::attr::kControl | tok::attr::kUnknown));
}

std::string Tokenizer::piece(int32_t id, bool render_special) const {
  if (!vocab_.valid(id)) throw Error("token id " + std::to_string(id) + " is outside the vocabulary");
  if (!render_special && (vocab_.attrs(id) & (tok::attr::kControl | tok::attr::kUnknown))) return std::string();
  return vocab_.pieces[id];
}

std::string Tokenizer::detokenize(std::span<const int32_t> ids, bool remove_special, bool unparse_special) const {
  bool remove_space = vocab_.add_space_prefix;
  if (remove_special && vocab_.add_bos && !ids.empty() && ids.front() == vocab_.bos) {
    remove_space = false;
    ids = ids.subspan(1);
  }
  if (remove_special && vocab_.add_eos && !ids.empty() && ids.back() == vocab_.eos) ids = ids.first(ids.size() - 1);

  std::string text;
  for (int32_t id : ids) {
    std::string p = token_to_piece(id, unparse_special);
    if (remove_space && !p.empty() && p.front() == ' ') p.erase(0, 1);
    remove_space = false;
    text += p;
  }
  if (!vocab_.clean_spaces || text.empty()) return text;

  // llama.cpp's clean_up_tokenization_spaces, three passes.
  std::string a;
  a.push_back(text[0]);
  for (size_t i = 1; i < text.size(); ++i) {
    char x = text[i];
    if (text[i - 1] == ' ' && (x == '?' || x == '!' || x == '.' || x == ',')) a.pop_back();
    a.push_back(x);
  }
  std::string b;
  b.push_back(a[0]);
  for (size_t i = 1; i < a.size(); ++i) {
    char x = a[i];
    if (x == '\'' && i + 1 < a.size() && a[i - 1] == ' ' && a[i + 1] == ' ') {
      b.pop_back();    // the space before the apostrophe
      a[i + 1] = '\0';  // and the one after it, which is skipped (llama.cpp
      ++i;             // marks it so a following " ' " is not matched)
    }
    b.push_back(x);
  }
  std::string c;
  c.push_back(b[0]);
  for (size_t i = 1; i < b.size(); ++i) {
    char x = b[i];
    if (b[i - 1] == ' ' && x == '\'' && i + 1 < b.size()) {
      char x1 = b[i + 1];
      if (x1 == 's' || x1 == 'm') {
        c.pop_back();
      } else if (i + 2 < b.size()) {
        char x2 = b[i + 2];
        if ((x1 == 'r' && x2 == 'e') || (x1 == 'v' && x2 == 'e')) c.pop_back();
      }
    }
    c.push_back(x);
  }
  return c;
}

std::string model_token_piece(const Tokenizer& tokenizer, int32_t id) {
  return id < tokenizer.n_vocab() ? tokenizer.token_to_piece(id) : std::string();
}

std::vector<std::string> output_pieces(const Tokenizer& tokenizer) {
  std::vector<std::string> pieces(tokenizer.n_vocab());
  for (int32_t id = 0; id < tokenizer.n_vocab(); ++id)
    if (!tokenizer.is_control(id)) pieces[id] = tokenizer.token_to_piece(id);
  return pieces;
}

}  // namespace reprise
