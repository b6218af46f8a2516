#include "tokenizer/vocab.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "gguf/gguf_file.h"
#include "tokenizer/unicode_text.h"
#include "util/error.h"

namespace reprise::tok {
namespace {

// tokenizer.ggml.token_type values.
enum TokenType : int64_t { kTypeNormal = 1, kTypeUnknown = 2, kTypeControl = 3, kTypeUserDefined = 4,
                           kTypeUnused = 5, kTypeByte = 6 };

uint32_t attrs_for_type(int64_t type) {
  switch (type) {
    case kTypeNormal: return attr::kNormal;
    case kTypeUnknown: return attr::kUnknown;
    case kTypeControl: return attr::kControl;
    case kTypeUserDefined: return attr::kUserDefined;
    case kTypeUnused: return attr::kUnused;
    case kTypeByte: return attr::kByte;
    default: return 0;  // undefined
  }
}

bool text_is_one_of(std::string_view text, std::initializer_list<std::string_view> options) {
  return std::find(options.begin(), options.end(), text) != options.end();
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size()) {
    out.append(s, pos, hit - pos);
    out.append(to);
  }
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

}  // namespace

std::optional<int32_t> Vocab::find(std::string_view text) const {
  return ids.find(text);
}

std::optional<int32_t> Vocab::byte_token(uint8_t byte) const {
  if (kind == VocabKind::Spm) {
    static const char* hex = "0123456789ABCDEF";
    const char name[7] = {'<', '0', 'x', hex[byte >> 4], hex[byte & 15], '>', 0};
    if (auto id = find(name)) return id;
    return find(std::string(1, static_cast<char>(byte)));
  }
  return find(byte_to_gpt2_char(byte));
}

Vocab Vocab::from_gguf(const gguf::File& file) {
  Vocab v;
  auto model = file.get_string("tokenizer.ggml.model");
  if (!model) file.fail("missing tokenizer metadata: no 'tokenizer.ggml.model' key");
  v.model_name = *model;
  v.pre_name = file.get_string("tokenizer.ggml.pre").value_or("");

  if (v.model_name == "llama") {
    v.kind = VocabKind::Spm;
    v.bos = 1;
    v.eos = 2;
    v.unk = 0;
    v.add_space_prefix = true;
    v.add_bos = true;
  } else if (v.model_name == "gpt2") {
    v.kind = VocabKind::Bpe;
    v.bos = 11;
    v.eos = 11;
    try {
      v.pre = pretokenizer_config(v.pre_name);
    } catch (const Error& e) {
      file.fail(e.what());
    }
    v.clean_spaces = v.pre.clean_spaces;
    v.ignore_merges = v.pre.ignore_merges;
    v.add_bos = v.pre.add_bos;
    v.add_sep = v.pre.add_sep;
    if (v.pre.clear_bos) v.bos = kNoToken;
  } else if (v.model_name == "bert") {
    v.kind = VocabKind::Wpm;
    v.bos = 101;
    v.unk = 100;
    v.sep = 102;
    v.pad = 0;
    v.mask = 103;
    v.add_bos = true;
    v.add_sep = true;
    v.clean_spaces = true;
  } else if (v.model_name == "no_vocab" || v.model_name == "none") {
    file.fail("the model has no vocabulary (tokenizer.ggml.model = '" + v.model_name + "')");
  } else if (text_is_one_of(v.model_name, {"t5", "rwkv", "plamo2", "gemma4", "hybriddna", "whitespace"})) {
    file.fail("tokenizer model '" + v.model_name + "' is not supported (supported: llama, gpt2, bert)");
  } else {
    file.fail("unknown tokenizer model '" + v.model_name + "' (tokenizer.ggml.model)");
  }

  if (auto prefix = file.get_bool("tokenizer.ggml.add_space_prefix")) v.add_space_prefix = *prefix;

  v.read_tokens(file);
  v.read_special_ids(file);
  v.detect_special_tokens();
  v.build_caches();
  v.apply_model_attributes(file);
  return v;
}

void Vocab::read_tokens(const gguf::File& file) {
  const gguf::Value* list = file.find("tokenizer.ggml.tokens");
  if (!list) file.fail("missing tokenizer metadata: no 'tokenizer.ggml.tokens' key");
  if (list->type != gguf::ValueType::ARRAY || list->elem_type != gguf::ValueType::STRING)
    file.fail("'tokenizer.ggml.tokens' is not a string array");
  const size_t n = list->strings.size();
  if (n == 0) file.fail("'tokenizer.ggml.tokens' is empty");
  if (n > static_cast<size_t>(INT32_MAX)) file.fail("'tokenizer.ggml.tokens' is too large");

  std::vector<float> scores;
  if (const gguf::Value* s = file.find("tokenizer.ggml.scores")) {
    scores = s->float_array("tokenizer.ggml.scores");
    if (scores.size() < n) file.fail("'tokenizer.ggml.scores' has fewer entries than tokenizer.ggml.tokens");
  }
  std::vector<int64_t> types;
  if (const gguf::Value* t = file.find("tokenizer.ggml.token_type")) {
    types = t->int_array("tokenizer.ggml.token_type");
    if (types.size() < n) file.fail("'tokenizer.ggml.token_type' has fewer entries than tokenizer.ggml.tokens");
  }

  tokens.resize(n);
  ids.reserve(n);
  size_t text_bytes = 0;
  for (size_t i = 0; i < n; ++i) {
    TokenEntry& e = tokens[i];
    e.text = std::string(list->strings[i]);
    if (e.text.empty()) e.text = "[EMPTY_" + std::to_string(i) + "]";
    text_bytes += e.text.size();
    if (text_bytes > TokenIndex::kMaxTextBytes) file.fail("the vocabulary's token texts exceed 4 GiB");
    if (auto first = ids.insert(e.text, static_cast<int32_t>(i)))
      file.fail("duplicate token in vocabulary: '" + e.text + "' has ids " + std::to_string(*first) + " and " +
                std::to_string(i));
    max_token_bytes = std::max(max_token_bytes, e.text.size());
    e.score = scores.empty() ? 0.0f : scores[i];
    e.attrs = types.empty() ? attr::kNormal : attrs_for_type(types[i]);
  }
}

void Vocab::read_special_ids(const gguf::File& file) {
  struct Slot {
    const char* key;
    int32_t* id;
  };
  const Slot slots[] = {
      {"tokenizer.ggml.bos_token_id", &bos},         {"tokenizer.ggml.eos_token_id", &eos},
      {"tokenizer.ggml.eot_token_id", &eot},         {"tokenizer.ggml.eom_token_id", &eom},
      {"tokenizer.ggml.unknown_token_id", &unk},     {"tokenizer.ggml.seperator_token_id", &sep},
      {"tokenizer.ggml.padding_token_id", &pad},     {"tokenizer.ggml.mask_token_id", &mask},
      {"tokenizer.ggml.fim_pre_token_id", &fim_pre}, {"tokenizer.ggml.fim_suf_token_id", &fim_suf},
      {"tokenizer.ggml.fim_mid_token_id", &fim_mid}, {"tokenizer.ggml.fim_pad_token_id", &fim_pad},
      {"tokenizer.ggml.fim_rep_token_id", &fim_rep}, {"tokenizer.ggml.fim_sep_token_id", &fim_sep},
      // deprecated spellings
      {"tokenizer.ggml.prefix_token_id", &fim_pre},  {"tokenizer.ggml.suffix_token_id", &fim_suf},
      {"tokenizer.ggml.middle_token_id", &fim_mid},
  };
  for (const Slot& slot : slots) {
    // A default outside the vocabulary is disabled; an out-of-range value in
    // the metadata is ignored (the default stays), as llama.cpp does.
    if (*slot.id >= 0 && *slot.id >= n_tokens()) *slot.id = kNoToken;
    const gguf::Value* value = file.find(slot.key);
    if (!value || !value->is_integer()) continue;
    int64_t id = value->as_int(slot.key);
    if (id >= 0 && id < n_tokens()) *slot.id = static_cast<int32_t>(id);
  }

  if (auto b = file.get_bool("tokenizer.ggml.add_bos_token")) add_bos = *b;
  if (auto b = file.get_bool("tokenizer.ggml.add_eos_token")) add_eos = *b;
  if (auto b = file.get_bool("tokenizer.ggml.add_sep_token")) add_sep = *b;
  if (add_bos && bos == kNoToken) file.fail("tokenizer.ggml.add_bos_token is true, but there is no BOS token");
  if (add_eos && eos == kNoToken) file.fail("tokenizer.ggml.add_eos_token is true, but there is no EOS token");
  if (add_sep && sep == kNoToken)
    file.fail("tokenizer.ggml.add_sep_token is true, but tokenizer.ggml.seperator_token_id is not set");

  if (auto b = file.get_bool("tokenizer.ggml.normalizer.lowercase")) lowercase = *b;
  strip_accents = lowercase;
  if (auto b = file.get_bool("tokenizer.ggml.normalizer.strip_accents")) strip_accents = *b;
}

// llama.cpp recognises chat/FIM/end tokens by their text and forces them to be
// control tokens. It walks a hash map, so when several texts qualify for one
// role the pick is arbitrary there; here the lowest id wins.
void Vocab::detect_special_tokens() {
  auto force_control = [&](int32_t id) { tokens[id].attrs |= attr::kControl; };
  auto pick = [&](int32_t& slot, std::initializer_list<std::string_view> texts) {
    if (slot != kNoToken) return;
    for (int32_t id = 0; id < n_tokens(); ++id) {
      if (text_is_one_of(tokens[id].text, texts)) {
        slot = id;
        force_control(id);
        return;
      }
    }
  };
  pick(eot, {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
             "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
             "<end_of_utterance>"});
  pick(eom, {"<|eom_id|>"});
  pick(fim_pre, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "begin\xEF\xBD\x9C>",
                 "<PRE>", "\xE2\x96\x81<PRE>", "<|code_prefix|>", "<|prefix|>"});
  pick(fim_suf, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81hole\xEF\xBD\x9C>",
                 "<SUF>", "\xE2\x96\x81<SUF>", "<|code_suffix|>", "<|suffix|>"});
  pick(fim_mid, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\xEF\xBD\x9C" "fim\xE2\x96\x81" "end\xEF\xBD\x9C>",
                 "<MID>", "\xE2\x96\x81<MID>", "<|code_middle|>", "<|middle|>"});
  pick(fim_pad, {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"});
  pick(fim_rep, {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"});
  pick(fim_sep, {"<|file_sep|>"});

  for (TokenEntry& t : tokens)
    if ((t.attrs & attr::kControl) && t.text.find("unused") != std::string::npos) t.attrs |= attr::kUnused;

  eog.clear();
  for (int32_t id : {fim_pad, fim_rep, fim_sep})
    if (id != kNoToken) eog.insert(id);
  for (int32_t id = 0; id < n_tokens(); ++id) {
    if (text_is_one_of(tokens[id].text,
                       {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
                        "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>", "[e~["})) {
      eog.insert(id);
      force_control(id);
    }
  }
  // gpt-oss markers are always rendered.
  for (int32_t id = 0; id < n_tokens(); ++id)
    if (text_is_one_of(tokens[id].text, {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}))
      tokens[id].attrs = attr::kUserDefined;
  for (int32_t id : {eos, eot, eom})
    if (id != kNoToken) eog.insert(id);

  // o200k_harmony / solar-open: "<|end|>" ends a message, not the generation.
  auto eog_with_text = [&](std::string_view text) -> int32_t {
    for (int32_t id : eog)
      if (valid(id) && tokens[id].text == text) return id;
    return kNoToken;
  };
  const int32_t end_id = eog_with_text("<|end|>");
  const bool has_return = eog_with_text("<|return|>") != kNoToken;
  const bool has_call = eog_with_text("<|call|>") != kNoToken || eog_with_text("<|calls|>") != kNoToken;
  const bool has_flush = eog_with_text("<|flush|>") != kNoToken;
  if (end_id != kNoToken && has_call && (has_return || has_flush)) {
    eog.erase(end_id);
    tokens[end_id].attrs = attr::kUserDefined;
  }
  // gemma4 / paddleocr: "</s>" is not an end-of-generation token there.
  const int32_t s_id = eog_with_text("</s>");
  if (s_id != kNoToken && eog_with_text("<|tool_response>") != kNoToken) {
    eog.erase(s_id);
    tokens[s_id].attrs = attr::kNormal;
  }
}

void Vocab::build_caches() {
  special_tokens.clear();
  for (int32_t id = 0; id < n_tokens(); ++id)
    if (tokens[id].attrs & (attr::kControl | attr::kUserDefined | attr::kUnknown)) special_tokens.push_back(id);
  // Same comparator and input order as llama.cpp, so equal-length ties come
  // out in the same order with the same standard library.
  std::sort(special_tokens.begin(), special_tokens.end(),
            [&](int32_t a, int32_t b) { return tokens[a].text.size() > tokens[b].text.size(); });

  pieces.resize(tokens.size());
  for (int32_t id = 0; id < n_tokens(); ++id) pieces[id] = compute_piece(id);
}

// llama.cpp adjusts a few attributes by model name (not stored in GGUF).
void Vocab::apply_model_attributes(const gguf::File& file) {
  std::string name = file.get_string("general.name").value_or("");
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  const std::string arch = file.get_string("general.architecture").value_or("");
  auto contains_any = [](const std::string& s, std::initializer_list<std::string_view> parts) {
    for (std::string_view p : parts)
      if (s.find(p) != std::string::npos) return true;
    return false;
  };
  auto set_attr = [&](std::string_view text, uint32_t bit, bool on) {
    auto id = find(text);
    if (!id) return;
    tokens[*id].attrs = on ? (tokens[*id].attrs | bit) : (tokens[*id].attrs & ~bit);
  };
  if (contains_any(pre_name, {"jina-v2-de", "jina-v2-es", "jina-v2-code"}) ||
      contains_any(arch, {"nomic-bert-moe", "jina-bert-v3"})) {
    set_attr("<mask>", attr::kLstrip, true);
  } else if (contains_any(name, {"phi-3", "phi3"})) {
    for (int32_t id : special_tokens) tokens[id].attrs |= attr::kRstrip;
    set_attr("</s>", attr::kRstrip, true);
    for (std::string_view t : {"<unk>", "<s>", "<|endoftext|>"}) set_attr(t, attr::kRstrip, false);
  } else if (contains_any(name, {"modern-bert"})) {
    set_attr("[MASK]", attr::kLstrip, true);
  }
}

std::string Vocab::compute_piece(int32_t id) const {
  const TokenEntry& t = tokens[id];
  const uint32_t a = t.attrs;
  if (a & (attr::kUnknown | attr::kControl | attr::kUserDefined)) return t.text;
  if (a & attr::kNormal) {
    if (kind != VocabKind::Bpe) {
      std::string s = t.text;
      replace_all(s, "\xE2\x96\x81", " ");
      return s;
    }
    // Undo the GPT-2 byte alphabet; characters outside it are reported the
    // way llama.cpp does.
    std::string out;
    for (uint32_t cpt : decode_utf8_lenient(t.text)) {
      int byte = gpt2_char_to_byte(cpt);
      if (byte >= 0) {
        out.push_back(static_cast<char>(byte));
        continue;
      }
      std::string utf8 = codepoint_to_utf8(cpt);
      out += "[UNK_BYTE_0x";
      static const char* hex = "0123456789abcdef";
      for (unsigned char c : utf8) {
        out.push_back(hex[c >> 4]);
        out.push_back(hex[c & 15]);
      }
      out += t.text + "]";
    }
    return out;
  }
  if (a & attr::kByte) {
    if (t.text.size() < 5) return std::string();
    return std::string(1, static_cast<char>(std::strtol(t.text.substr(3, 2).c_str(), nullptr, 16)));
  }
  return std::string();
}

}  // namespace reprise::tok
