#include "model/synthetic_model.h"

#include <cmath>
#include <unordered_set>

#include "gguf/gguf_writer.h"
#include "util/error.h"

namespace reprise {
namespace {

// ------------------------------------------------------------ random values

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t mix64(uint64_t z) {  // splitmix64 finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// Counter-based stream: draw i of a tensor depends only on (seed, name, i), so
// rows can be generated in any order and tensors are independent of each
// other's sizes. All arithmetic below is exact or IEEE-rounded (no libm), so
// the bytes are the same on every machine.
class TensorRandom {
 public:
  TensorRandom(uint64_t seed, const std::string& name) : key_(mix64(seed ^ fnv1a(name))) {}
  uint64_t bits(uint64_t i) const { return mix64(key_ + (i + 1) * kGolden); }
  // Uniform in [0, 1) with 24 bits.
  float unit(uint64_t i) const { return static_cast<float>(bits(i) >> 40) * 0x1p-24f; }
  // Sum of three uniforms on [-1, 1): mean 0, standard deviation 1, bounded
  // by 3 (a bell shape without the outliers of a true normal).
  float bell(uint64_t i) const {
    int64_t s = 0;
    for (uint64_t c = 0; c < 3; ++c) s += static_cast<int64_t>(bits(3 * i + c) >> 40);
    return static_cast<float>(s - 3 * (int64_t(1) << 23)) * 0x1p-23f;
  }

 private:
  uint64_t key_;
};

// How a tensor's values are drawn.
enum class Init {
  Dense,   // scale * bell (matrices, embeddings, conv kernels)
  Norm,    // 1 + 0.2 * bell, never exactly 1
  Bias,    // 0.1 * bell
  DtBias,  // softplus^-1 of dt in ~[0.001, 0.1]: uniform on [-6.9, -2.25]
  SsmA1,   // mamba A (stored as -exp(A_log)): -(s + 1) * c per channel
  SsmA2,   // mamba2 A per head: uniform on [-12, -1]
  SsmD,    // skip weight D: 1 + 0.1 * bell
  Values,  // PlannedTensor::values as given
};

struct PlannedTensor {
  std::string name;
  std::vector<uint64_t> shape;
  DType type;
  Init init;
  float scale = 1.0f;
  std::vector<float> values;  // Init::Values
};

void fill_row(const PlannedTensor& t, const TensorRandom& rng, int64_t row, std::span<float> out) {
  const uint64_t n = out.size();
  const uint64_t base = static_cast<uint64_t>(row) * n;
  switch (t.init) {
    case Init::Dense:
      for (uint64_t j = 0; j < n; ++j) out[j] = t.scale * rng.bell(base + j);
      return;
    case Init::Norm:
      for (uint64_t j = 0; j < n; ++j) {
        float v = 1.0f + 0.2f * rng.bell(base + j);
        out[j] = v == 1.0f ? 1.0f + 0x1p-7f : v;
      }
      return;
    case Init::Bias:
      for (uint64_t j = 0; j < n; ++j) out[j] = 0.1f * rng.bell(base + j);
      return;
    case Init::DtBias:
      for (uint64_t j = 0; j < n; ++j) out[j] = -6.9f + 4.65f * rng.unit(base + j);
      return;
    case Init::SsmA1: {
      const float channel_scale = 0.5f + rng.unit(static_cast<uint64_t>(row));
      for (uint64_t j = 0; j < n; ++j) out[j] = -static_cast<float>(j + 1) * channel_scale;
      return;
    }
    case Init::SsmA2:
      for (uint64_t j = 0; j < n; ++j) out[j] = -1.0f - 11.0f * rng.unit(base + j);
      return;
    case Init::SsmD:
      for (uint64_t j = 0; j < n; ++j) out[j] = 1.0f + 0.1f * rng.bell(base + j);
      return;
    case Init::Values:
      for (uint64_t j = 0; j < n; ++j) out[j] = t.values[base + j];
      return;
  }
}

// ------------------------------------------------------------ vocabulary

const char* const kCommonWords[] = {
    "the", "a", "and", "to", "of", "in", "is", "it", "that", "was", "he", "she", "for", "on",
    "with", "as", "you", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there", "an",
    "which", "do", "how", "their", "if", "will", "up", "out", "then", "them", "so", "some",
    "her", "would", "make", "like", "him", "into", "time", "has", "look", "two", "more", "go",
    "see", "no", "way", "could", "people", "my", "than", "first", "water", "been", "who", "now",
    "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "once", "upon",
    "little", "girl", "boy", "named", "play", "park", "happy", "big", "dog", "cat", "friend",
    "tree", "sun", "mom", "very", "loved", "wanted", "saw", "went", "home", "hello", "world",
    "good", "new", "old", "red", "blue", "ball", "toy", "fun", "sad", "day", "night", "run"};

const char* const kCommonPieces[] = {
    "er", "in", "en", "on", "es", "at", "or", "an", "is", "re", "it", "ar", "le", "ou", "al",
    "ed", "ion", "ing", "ic", "as", "el", "ent", "nd", "st", "th", "he", "ly", "om", "ll",
    "ve", "ch", "ow", "ur", "ut", "ot", "ay", "id", "ad", "am", "ir", "ers", "est", "ter"};

const std::string kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space marker

class VocabBuilder {
 public:
  explicit VocabBuilder(size_t limit) : limit_(limit) {}
  bool full() const { return pieces_.size() >= limit_; }
  void add(const std::string& piece) {
    if (!full() && seen_.insert(piece).second) pieces_.push_back(piece);
  }
  // The word plus the left prefixes SentencePiece merges pass through.
  void add_with_prefixes(const std::string& word, size_t keep_first) {
    for (size_t k = keep_first + 1; k <= word.size(); ++k) add(word.substr(0, k));
  }
  std::vector<std::string> take() { return std::move(pieces_); }

 private:
  size_t limit_;
  std::vector<std::string> pieces_;
  std::unordered_set<std::string> seen_;
};

// ------------------------------------------------------------ spec helpers

bool is_attention_arch(const std::string& a) {
  return a == "llama" || a == "qwen2" || a == "qwen3" || a == "gemma3";
}
bool is_known_arch(const std::string& a) {
  return is_attention_arch(a) || a == "mamba" || a == "mamba2" || a == "jamba";
}
bool is_block_type(DType t) {
  const auto info = dtype_info(static_cast<uint32_t>(t));
  return info && info->block_elems > 1;
}

// Fills the derived defaults so the rest of the maker sees concrete values.
SyntheticModelSpec resolved(SyntheticModelSpec s) {
  if (s.arch == "mamba" || s.arch == "mamba2") s.n_head = s.n_head_kv = 0;
  if (s.head_dim == 0 && s.n_head > 0) s.head_dim = s.n_embd / s.n_head;
  if (s.d_inner == 0) s.d_inner = 2 * s.n_embd;
  if (s.dt_rank == 0) s.dt_rank = (s.n_embd + 15) / 16;
  if (s.arch == "jamba") {
    if (s.attention_layers.empty()) {
      s.attention_layers.assign(static_cast<size_t>(s.n_layer), false);
      for (int64_t i = 0; i < s.n_layer; ++i)
        s.attention_layers[i] = s.n_layer > 4 ? i % 8 == 4 : i == 1;
    }
    if (s.moe_layers.empty()) {
      s.moe_layers.assign(static_cast<size_t>(s.n_layer), false);
      if (s.n_expert > 0)
        for (int64_t i = 0; i < s.n_layer; ++i) s.moe_layers[i] = i % 2 == 1;
    }
  }
  return s;
}

// llama.cpp's LLAMA_FTYPE of the spec's weights.
uint32_t file_type_of(const SyntheticModelSpec& s) {
  // The _M mixes (validate_synthetic_spec admits Q4_K and Q5_K bases only).
  if (s.more_bits_dtype) return s.dtype == DType::Q4_K ? 15 : 17;  // MOSTLY_Q4_K_M, MOSTLY_Q5_K_M
  switch (s.dtype) {
    case DType::F32: return 0;
    case DType::F16: return 1;
    case DType::Q4_0: return 2;
    case DType::Q8_0: return 7;
    case DType::Q4_1: return 3;
    case DType::Q5_0: return 8;
    case DType::Q5_1: return 9;
    case DType::Q4_K: return 14;  // llama.cpp's LLAMA_FTYPE_MOSTLY_Q4_K_S
    case DType::Q5_K: return 16;  // MOSTLY_Q5_K_S
    case DType::Q6_K: return 18;  // MOSTLY_Q6_K
    case DType::Q2_K: return 10;  // MOSTLY_Q2_K
    case DType::Q3_K: return 11;  // MOSTLY_Q3_K_S
    case DType::IQ4_NL: return 25;  // MOSTLY_IQ4_NL
    case DType::IQ4_XS: return 30;  // MOSTLY_IQ4_XS
    case DType::BF16: return 32;
    default: return 0;
  }
}

// ------------------------------------------------------------ tensor plan

class Planner {
 public:
  explicit Planner(const SyntheticModelSpec& s) : s_(s) {}

  // A weight matrix in the spec's dtype, or its more_bits_dtype where a mix
  // gives this matrix more bits (F16 if its rows do not fit blocks).
  void matrix(const std::string& name, std::vector<uint64_t> shape, bool more_bits = false) {
    const DType t = more_bits && s_.more_bits_dtype ? *s_.more_bits_dtype : s_.dtype;
    add(name, shape, fitted(t, shape[0]), Init::Dense, 1.0f / std::sqrt(static_cast<float>(shape[0])));
  }
  // Mamba's small matrices llama-quantize leaves alone (F16 in quantized files).
  void small_matrix(const std::string& name, std::vector<uint64_t> shape) {
    DType t = is_block_type(s_.dtype) ? DType::F16 : s_.dtype;
    add(name, shape, t, Init::Dense, 1.0f / std::sqrt(static_cast<float>(shape[0])));
  }
  void embedding(const std::string& name, std::vector<uint64_t> shape, float scale) {
    add(name, shape, fitted(s_.embd_dtype.value_or(s_.dtype), shape[0]), Init::Dense, scale);
  }
  // Always-F32 parameters (norms, biases, SSM A/D/conv, MoE router).
  void f32(const std::string& name, std::vector<uint64_t> shape, Init init, float scale = 1.0f) {
    add(name, shape, DType::F32, init, scale);
  }
  void f32_values(const std::string& name, std::vector<float> values) {
    add(name, {values.size()}, DType::F32, Init::Values, 1.0f);
    plan_.back().values = std::move(values);
  }

  std::vector<PlannedTensor> take() { return std::move(plan_); }

 private:
  // Rows that do not fill whole blocks fall back as llama-quantize's do: a
  // K type to its 32-element counterpart (Q2_K, Q3_K, IQ4_XS -> IQ4_NL, Q4_K ->
  // Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0), and rows that are not whole 32-element
  // blocks to F16.
  static DType fitted(DType t, uint64_t row_len) {
    if (!is_block_type(t)) return t;
    const uint64_t block = dtype_info(static_cast<uint32_t>(t))->block_elems;
    if (row_len % block == 0) return t;
    if (row_len % 32 != 0) return DType::F16;
    switch (t) {
      case DType::Q2_K:
      case DType::Q3_K:
      case DType::IQ4_XS: return DType::IQ4_NL;
      case DType::Q4_K: return DType::Q5_0;
      case DType::Q5_K: return DType::Q5_1;
      default: return DType::Q8_0;
    }
  }
  void add(const std::string& name, std::vector<uint64_t> shape, DType t, Init init, float scale) {
    plan_.push_back(PlannedTensor{name, std::move(shape), t, init, scale, {}});
  }
  const SyntheticModelSpec& s_;
  std::vector<PlannedTensor> plan_;
};

std::string blk(int64_t layer, const char* what) { return "blk." + std::to_string(layer) + "." + what; }

// The layers llama-quantize's _M mixes give more bits in attn_v and
// ffn_down: the first and last eighth, and every third layer between.
bool more_bits_layer(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

void plan_attention(Planner& p, const SyntheticModelSpec& s, int64_t l, bool with_extras) {
  const uint64_t e = s.n_embd, q = s.n_head * s.head_dim, kv = s.n_head_kv * s.head_dim;
  p.matrix(blk(l, "attn_q.weight"), {e, q});
  p.matrix(blk(l, "attn_k.weight"), {e, kv});
  p.matrix(blk(l, "attn_v.weight"), {e, kv}, more_bits_layer(l, s.n_layer));
  p.matrix(blk(l, "attn_output.weight"), {q, e});
  if (!with_extras) return;
  if (s.arch == "qwen2") {
    p.f32(blk(l, "attn_q.bias"), {q}, Init::Bias);
    p.f32(blk(l, "attn_k.bias"), {kv}, Init::Bias);
    p.f32(blk(l, "attn_v.bias"), {kv}, Init::Bias);
  }
  if (s.arch == "qwen3" || s.arch == "gemma3") {
    p.f32(blk(l, "attn_q_norm.weight"), {static_cast<uint64_t>(s.head_dim)}, Init::Norm);
    p.f32(blk(l, "attn_k_norm.weight"), {static_cast<uint64_t>(s.head_dim)}, Init::Norm);
  }
}

void plan_dense_ffn(Planner& p, const SyntheticModelSpec& s, int64_t l) {
  const uint64_t e = s.n_embd, f = s.n_ff;
  p.matrix(blk(l, "ffn_gate.weight"), {e, f});
  p.matrix(blk(l, "ffn_up.weight"), {e, f});
  p.matrix(blk(l, "ffn_down.weight"), {f, e}, more_bits_layer(l, s.n_layer));
}

void plan_mamba1(Planner& p, const SyntheticModelSpec& s, int64_t l) {
  const uint64_t e = s.n_embd, di = s.d_inner, ds = s.d_state, dc = s.d_conv, r = s.dt_rank;
  p.matrix(blk(l, "ssm_in.weight"), {e, 2 * di});
  p.f32(blk(l, "ssm_conv1d.weight"), {dc, di}, Init::Dense, 1.0f / std::sqrt(static_cast<float>(dc)));
  p.f32(blk(l, "ssm_conv1d.bias"), {di}, Init::Bias);
  p.small_matrix(blk(l, "ssm_x.weight"), {di, r + 2 * ds});
  p.small_matrix(blk(l, "ssm_dt.weight"), {r, di});
  p.f32(blk(l, "ssm_dt.bias"), {di}, Init::DtBias);
  p.f32(blk(l, "ssm_a"), {ds, di}, Init::SsmA1);
  p.f32(blk(l, "ssm_d"), {di}, Init::SsmD);
  p.matrix(blk(l, "ssm_out.weight"), {di, e});
}

void plan_mamba2(Planner& p, const SyntheticModelSpec& s, int64_t l) {
  const uint64_t e = s.n_embd, di = s.d_inner, ds = s.d_state, dc = s.d_conv;
  const uint64_t ng = s.n_group, nh = s.ssm_n_head;
  const uint64_t conv_channels = di + 2 * ng * ds;
  p.matrix(blk(l, "ssm_in.weight"), {e, 2 * di + 2 * ng * ds + nh});
  p.f32(blk(l, "ssm_conv1d.weight"), {dc, conv_channels}, Init::Dense,
        1.0f / std::sqrt(static_cast<float>(dc)));
  p.f32(blk(l, "ssm_conv1d.bias"), {conv_channels}, Init::Bias);
  p.f32(blk(l, "ssm_dt.bias"), {nh}, Init::DtBias);
  p.f32(blk(l, "ssm_a"), {1, nh}, Init::SsmA2);
  p.f32(blk(l, "ssm_d"), {1, nh}, Init::SsmD);
  p.f32(blk(l, "ssm_norm.weight"), {di / ng, ng}, Init::Norm);
  p.matrix(blk(l, "ssm_out.weight"), {di, e});
}

std::vector<PlannedTensor> plan_tensors(const SyntheticModelSpec& s) {
  Planner p(s);
  const uint64_t e = s.n_embd, v = s.n_vocab;
  // Untied llama-style embeddings are unit-variance lookups (as in the
  // fixtures); tied or gemma (which scales by sqrt(n_embd)) ones double as the
  // output projection, so they get the fan-in scale to keep logits O(1).
  const bool small_embd = s.tied_output || s.arch == "gemma3";
  p.embedding("token_embd.weight", {e, v}, small_embd ? 1.0f / std::sqrt(static_cast<float>(e)) : 1.0f);
  if (!s.rope_freq_factors.empty()) p.f32_values("rope_freqs.weight", s.rope_freq_factors);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    p.f32(blk(l, "attn_norm.weight"), {e}, Init::Norm);
    if (is_attention_arch(s.arch)) {
      plan_attention(p, s, l, true);
      p.f32(blk(l, "ffn_norm.weight"), {e}, Init::Norm);
      plan_dense_ffn(p, s, l);
      if (s.arch == "gemma3") {
        p.f32(blk(l, "post_attention_norm.weight"), {e}, Init::Norm);
        p.f32(blk(l, "post_ffw_norm.weight"), {e}, Init::Norm);
      }
    } else if (s.arch == "mamba") {
      plan_mamba1(p, s, l);
    } else if (s.arch == "mamba2") {
      plan_mamba2(p, s, l);
    } else {  // jamba
      if (s.attention_layers[l]) {
        plan_attention(p, s, l, false);
      } else {
        plan_mamba1(p, s, l);
        p.f32(blk(l, "ssm_dt_norm.weight"), {static_cast<uint64_t>(s.dt_rank)}, Init::Norm);
        p.f32(blk(l, "ssm_b_norm.weight"), {static_cast<uint64_t>(s.d_state)}, Init::Norm);
        p.f32(blk(l, "ssm_c_norm.weight"), {static_cast<uint64_t>(s.d_state)}, Init::Norm);
      }
      p.f32(blk(l, "ffn_norm.weight"), {e}, Init::Norm);
      if (s.moe_layers[l]) {
        const uint64_t f = s.n_ff, x = s.n_expert;
        p.f32(blk(l, "ffn_gate_inp.weight"), {e, x}, Init::Dense, 1.0f / std::sqrt(static_cast<float>(e)));
        p.matrix(blk(l, "ffn_gate_exps.weight"), {e, f, x});
        p.matrix(blk(l, "ffn_up_exps.weight"), {e, f, x});
        p.matrix(blk(l, "ffn_down_exps.weight"), {f, e, x});
      } else {
        plan_dense_ffn(p, s, l);
      }
    }
  }
  p.f32("output_norm.weight", {e}, Init::Norm);
  if (!s.tied_output) p.matrix("output.weight", {e, v}, true);
  return p.take();
}

// ------------------------------------------------------------ metadata

void write_metadata(gguf::Writer& w, const SyntheticModelSpec& s) {
  using gguf::MetaValue;
  const std::string a = s.arch + ".";
  const bool ssm = s.arch == "mamba" || s.arch == "mamba2" || s.arch == "jamba";
  w.set_string("general.architecture", s.arch);
  w.set_string("general.name", s.name);
  w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx));
  w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
  w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
  const bool pure_ssm = s.arch == "mamba" || s.arch == "mamba2";
  w.set_u32(a + "feed_forward_length", pure_ssm ? 0 : static_cast<uint32_t>(s.n_ff));
  w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
  if (s.arch == "jamba") {
    // Per layer: 0 marks a recurrent (mamba) layer.
    std::vector<int32_t> kv(static_cast<size_t>(s.n_layer));
    for (int64_t l = 0; l < s.n_layer; ++l)
      kv[l] = s.attention_layers[l] ? static_cast<int32_t>(s.n_head_kv) : 0;
    w.set(a + "attention.head_count_kv", MetaValue::array(std::span<const int32_t>(kv)));
  } else {
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
  }
  w.set_f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
  if (is_attention_arch(s.arch)) {
    w.set_u32(a + "rope.dimension_count", static_cast<uint32_t>(s.head_dim));
    w.set_f32(a + "rope.freq_base", s.rope_freq_base);
    if (s.rope_linear_scaling > 0) {
      w.set_string(a + "rope.scaling.type", "linear");
      w.set_f32(a + "rope.scaling.factor", s.rope_linear_scaling);
    }
  }
  if (ssm) {
    w.set_u32(a + "ssm.conv_kernel", static_cast<uint32_t>(s.d_conv));
    w.set_u32(a + "ssm.inner_size", static_cast<uint32_t>(s.d_inner));
    w.set_u32(a + "ssm.state_size", static_cast<uint32_t>(s.d_state));
    w.set_u32(a + "ssm.time_step_rank",
              static_cast<uint32_t>(s.arch == "mamba2" ? s.ssm_n_head : s.dt_rank));
    if (s.arch == "mamba2") w.set_u32(a + "ssm.group_count", static_cast<uint32_t>(s.n_group));
  }
  if (s.arch == "jamba") {
    w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
    w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
  }
  w.set_u32("general.file_type", file_type_of(s));
  const bool explicit_head_dim = s.n_head > 0 && s.head_dim * s.n_head != s.n_embd;
  if (s.arch == "qwen3" || s.arch == "gemma3" || (is_attention_arch(s.arch) && explicit_head_dim)) {
    w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
    w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
  }
  if (s.arch == "gemma3") {
    w.set_u32(a + "attention.sliding_window", static_cast<uint32_t>(s.sliding_window));
    w.set_u32(a + "attention.sliding_window_pattern", static_cast<uint32_t>(s.sliding_window_pattern));
  }

  std::vector<std::string> tokens = synthetic_vocab(s.tokenizer_tokens > 0 ? s.tokenizer_tokens : s.n_vocab);
  std::vector<float> scores(tokens.size(), 0.0f);
  std::vector<int32_t> types(tokens.size(), 1);  // NORMAL
  types[0] = 2;                                  // UNKNOWN
  types[1] = types[2] = 3;                       // CONTROL
  for (size_t i = 3; i < 259; ++i) types[i] = 6;  // BYTE
  for (size_t i = 259; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i - 259);
  const size_t n_added = s.user_defined_tokens.size() + s.control_tokens.size();
  if (n_added + 259 > tokens.size()) throw Error("too many added tokens for n_vocab");
  for (size_t k = 0; k < n_added; ++k) {
    const size_t id = tokens.size() - n_added + k;
    const bool control = k < s.control_tokens.size();
    tokens[id] = control ? s.control_tokens[k] : s.user_defined_tokens[k - s.control_tokens.size()];
    types[id] = control ? 3 : 4;  // CONTROL, USER_DEFINED
  }
  w.set_string("tokenizer.ggml.model", "llama");
  w.set_string("tokenizer.ggml.pre", "default");
  w.set("tokenizer.ggml.tokens", MetaValue::string_array(std::move(tokens)));
  w.set("tokenizer.ggml.scores", MetaValue::array(std::span<const float>(scores)));
  w.set("tokenizer.ggml.token_type", MetaValue::array(std::span<const int32_t>(types)));
  w.set_u32("tokenizer.ggml.bos_token_id", 1);
  w.set_u32("tokenizer.ggml.eos_token_id", 2);
  w.set_u32("tokenizer.ggml.unknown_token_id", 0);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_u32(a + "vocab_size", static_cast<uint32_t>(s.n_vocab));
  if (is_block_type(s.dtype) || (s.embd_dtype && is_block_type(*s.embd_dtype)))
    w.set_u32("general.quantization_version", 2);
}

}  // namespace

std::vector<std::string> synthetic_vocab(int64_t n_vocab) {
  if (n_vocab < 260) throw Error("synthetic vocab: n_vocab " + std::to_string(n_vocab) + " < 260");
  VocabBuilder v(static_cast<size_t>(n_vocab));
  v.add("<unk>");
  v.add("<s>");
  v.add("</s>");
  static const char kHex[] = "0123456789ABCDEF";
  for (int b = 0; b < 256; ++b) v.add(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");

  // Single characters first (the units merges start from), then frequent
  // pieces and words with the prefixes leading to them, then every short
  // letter combination until the vocabulary is full.
  const std::string lower = "abcdefghijklmnopqrstuvwxyz";
  const std::string upper = "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  const std::string other = ".,!?'\";:-()0123456789";
  v.add(kSpace);
  for (char c : lower) v.add(kSpace + c);
  for (char c : lower) v.add(std::string(1, c));
  for (char c : other) v.add(std::string(1, c));
  for (char c : upper) v.add(kSpace + c);
  for (char c : upper) v.add(std::string(1, c));
  for (const char* p : kCommonPieces) v.add(p);
  for (const char* word : kCommonWords) v.add_with_prefixes(kSpace + word, kSpace.size());
  for (const char* word : kCommonWords) {
    std::string cap = word;
    cap[0] = static_cast<char>(cap[0] - 'a' + 'A');
    v.add_with_prefixes(kSpace + cap, kSpace.size());
  }
  for (int len = 2; !v.full(); ++len) {
    // All lowercase strings of this length, plain and after a space.
    std::string s(static_cast<size_t>(len), 'a');
    while (!v.full()) {
      v.add(kSpace + s);
      v.add(s);
      int i = len - 1;
      while (i >= 0 && s[i] == 'z') s[i--] = 'a';
      if (i < 0) break;
      ++s[i];
    }
  }
  return v.take();
}

void validate_synthetic_spec(const SyntheticModelSpec& spec) {
  const SyntheticModelSpec s = resolved(spec);
  auto bad = [&](const std::string& what) { throw Error("synthetic model (" + s.arch + "): " + what); };
  if (!is_known_arch(s.arch)) bad("unknown architecture");
  if (s.n_embd <= 0 || s.n_layer <= 0 || s.n_ctx <= 0) bad("n_embd, n_layer and n_ctx must be positive");
  if (s.n_vocab < 260) bad("n_vocab must be at least 260 (specials, 256 byte tokens, pieces)");
  if (s.tokenizer_tokens != 0 && (s.tokenizer_tokens < 260 || s.tokenizer_tokens > s.n_vocab))
    bad("tokenizer_tokens must be 0 or in [260, n_vocab]");
  if (!dtype_supported(s.dtype)) bad("unsupported weight dtype " + dtype_name(static_cast<uint32_t>(s.dtype)));
  if (s.embd_dtype && !dtype_supported(*s.embd_dtype)) bad("unsupported embedding dtype");
  if (s.more_bits_dtype && !((s.dtype == DType::Q4_K || s.dtype == DType::Q5_K) && *s.more_bits_dtype == DType::Q6_K))
    bad("the _M mixes are Q4_K or Q5_K with Q6_K where they give more bits");
  const bool has_attention = is_attention_arch(s.arch) || s.arch == "jamba";
  if (!s.rope_freq_factors.empty() &&
      (s.arch != "llama" || s.rope_freq_factors.size() != static_cast<size_t>(s.head_dim / 2)))
    bad("rope_freq_factors are llama's, head_dim / 2 of them");
  if (has_attention) {
    if (s.n_head <= 0 || s.n_head_kv <= 0 || s.n_head % s.n_head_kv != 0)
      bad("n_head must be a positive multiple of n_head_kv");
    if (s.head_dim <= 0 || s.head_dim % 2 != 0) bad("head_dim must be positive and even");
    if (s.n_ff <= 0) bad("n_ff must be positive");
  }
  if (s.arch == "gemma3" && (s.sliding_window <= 0 || s.sliding_window_pattern <= 0))
    bad("gemma3 needs a positive sliding_window and sliding_window_pattern");
  if (s.arch == "mamba" || s.arch == "mamba2" || s.arch == "jamba") {
    if (s.d_inner <= 0 || s.d_state <= 0 || s.d_conv <= 0 || s.dt_rank <= 0)
      bad("d_inner, d_state, d_conv and dt_rank must be positive");
  }
  if (s.arch == "mamba2") {
    if (s.n_group <= 0 || s.ssm_n_head <= 0 || s.d_inner % s.ssm_n_head != 0 ||
        s.d_inner % s.n_group != 0 || s.ssm_n_head % s.n_group != 0)
      bad("mamba2 needs d_inner divisible by ssm_n_head and n_group, ssm_n_head by n_group");
  }
  if (s.arch == "jamba") {
    if (s.attention_layers.size() != static_cast<size_t>(s.n_layer) ||
        s.moe_layers.size() != static_cast<size_t>(s.n_layer))
      bad("attention_layers and moe_layers need one entry per layer");
    bool any_moe = false;
    for (bool m : s.moe_layers) any_moe |= m;
    if (any_moe && (s.n_expert <= 0 || s.n_expert_used <= 0 || s.n_expert_used > s.n_expert))
      bad("MoE layers need 0 < n_expert_used <= n_expert");
  }
}

void make_synthetic_model(const SyntheticModelSpec& spec, const std::string& out_path) {
  validate_synthetic_spec(spec);
  const SyntheticModelSpec s = resolved(spec);
  gguf::Writer w;
  write_metadata(w, s);
  for (const PlannedTensor& t : plan_tensors(s)) {
    const TensorRandom rng(s.seed, t.name);
    w.add_tensor_rows(t.name, t.shape, t.type, [t, rng](int64_t row, std::span<float> out) {
      fill_row(t, rng, row, out);
    });
  }
  w.write(out_path);
}

std::vector<float> llama3_rope_freq_factors(int64_t n_rot, float freq_base, float factor, float low_freq_factor,
                                            float high_freq_factor, int64_t original_context) {
  const double low_freq_wavelen = static_cast<double>(original_context) / low_freq_factor;
  const double high_freq_wavelen = static_cast<double>(original_context) / high_freq_factor;
  std::vector<float> factors;
  for (int64_t i = 0; i < n_rot; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(freq_base), static_cast<double>(i) / n_rot);
    const double wavelen = 2.0 * M_PI / freq;
    double f = 1.0;
    if (wavelen > low_freq_wavelen) {
      f = factor;
    } else if (wavelen >= high_freq_wavelen) {
      const double smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

SyntheticModelSpec synthetic_preset(const std::string& name) {
  SyntheticModelSpec s;
  s.name = "synthetic-" + name;
  if (name == "tiny") {
    // ~1.04M parameters: quick to generate and to run in tests.
    s.arch = "llama";
    s.n_embd = 128; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 32;
    s.n_ff = 384; s.n_vocab = 1024; s.n_ctx = 512; s.dtype = DType::F32;
  } else if (name == "60m") {
    s.arch = "llama";
    s.n_embd = 512; s.n_layer = 8; s.n_head = 8; s.n_head_kv = 8; s.head_dim = 64;
    s.n_ff = 1536; s.n_vocab = 32000; s.n_ctx = 2048; s.dtype = DType::F16;
  } else if (name == "jamba-small") {
    // Jamba's layout scaled down: attention at layer 4, experts on odd layers.
    s.arch = "jamba";
    s.n_embd = 256; s.n_layer = 8; s.n_head = 8; s.n_head_kv = 2; s.head_dim = 32;
    s.n_ff = 512; s.n_vocab = 4096; s.n_ctx = 4096; s.dtype = DType::F16;
    s.d_inner = 512; s.d_state = 16; s.d_conv = 4; s.dt_rank = 16;
    s.n_expert = 4; s.n_expert_used = 2;
  } else if (name == "tiny-qwen2" || name == "tiny-qwen3") {
    s.arch = name.substr(5);
    s.n_embd = 64; s.n_layer = 3; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 16;
    s.n_ff = 128; s.n_vocab = 1024; s.n_ctx = 4096; s.rope_freq_base = 1e6f;
    s.tied_output = name == "tiny-qwen2";
  } else if (name == "tiny-gemma3") {
    s.arch = "gemma3";
    s.n_embd = 128; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 32;
    s.n_ff = 256; s.n_vocab = 1024; s.n_ctx = 4096; s.tied_output = true;
    s.sliding_window = 64; s.sliding_window_pattern = 2;
  } else if (name == "tiny-mamba") {
    s.arch = "mamba";
    s.n_embd = 64; s.n_layer = 3; s.n_ff = 0; s.n_vocab = 1024; s.n_ctx = 1048576;
    s.d_inner = 128; s.d_state = 16; s.d_conv = 4; s.dt_rank = 4;
  } else if (name == "tiny-mamba2") {
    s.arch = "mamba2";
    s.n_embd = 64; s.n_layer = 2; s.n_ff = 0; s.n_vocab = 1024; s.n_ctx = 1048576;
    s.d_inner = 128; s.d_state = 16; s.d_conv = 4; s.n_group = 1; s.ssm_n_head = 8;
  } else if (name == "tiny-jamba") {
    // The fixture's layout: M, A, M, M with experts on layers 1 and 3.
    s.arch = "jamba";
    s.n_embd = 64; s.n_layer = 4; s.n_head = 4; s.n_head_kv = 2; s.head_dim = 16;
    s.n_ff = 128; s.n_vocab = 1024; s.n_ctx = 1048576;
    s.d_inner = 128; s.d_state = 16; s.d_conv = 4; s.dt_rank = 4;
    s.attention_layers = {false, true, false, false};
    s.moe_layers = {false, true, false, true};
    s.n_expert = 4; s.n_expert_used = 2;
  } else {
    throw Error("unknown synthetic model preset '" + name + "'");
  }
  return s;
}

std::vector<std::string> synthetic_preset_names() {
  return {"tiny", "60m", "jamba-small", "tiny-qwen2", "tiny-qwen3",
          "tiny-gemma3", "tiny-mamba", "tiny-mamba2", "tiny-jamba"};
}

}  // namespace reprise
