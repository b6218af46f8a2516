#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "model/weights.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "util/error.h"

namespace reprise {
namespace {

struct ArchTraits {
  RopeStyle rope = RopeStyle::Normal;
  bool qkv_bias = false;        // qwen2
  bool qk_norm = false;         // qwen3, gemma3
  bool embed_scale = false;     // gemma: x *= sqrt(n_embd)
  bool post_norms = false;      // gemma3: post-attention and post-FFN norms
  bool gelu = false;            // gemma: GELU gate instead of SiLU
  bool sliding_window = false;  // gemma3
};

ArchTraits traits_for(const std::string& arch) {
  ArchTraits t;
  if (arch == "llama") return t;
  if (arch == "qwen2") {
    t.rope = RopeStyle::Neox;
    t.qkv_bias = true;
    return t;
  }
  if (arch == "qwen3") {
    t.rope = RopeStyle::Neox;
    t.qk_norm = true;
    return t;
  }
  if (arch == "gemma3") {
    t.rope = RopeStyle::Neox;
    t.qk_norm = true;
    t.embed_scale = true;
    t.post_norms = true;
    t.gelu = true;
    t.sliding_window = true;
    return t;
  }
  throw Error("unsupported architecture '" + arch + "'");
}

struct Layer {
  std::vector<float> attn_norm, ffn_norm, post_attn_norm, post_ffn_norm;
  std::vector<float> q_norm, k_norm, bq, bk, bv;
  MatrixView wq, wk, wv, wo, gate, up, down;
  int window = 0;
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;
};

// Adapts SequenceMemory rows of one layer and KV head to the attention kernel.
struct AttentionRows {
  SequenceMemory* memory;
  int layer;
  int64_t offset;
  static const uint16_t* key(const void* self, int64_t pos) {
    auto* r = static_cast<const AttentionRows*>(self);
    return r->memory->key(r->layer, pos) + r->offset;
  }
  static const uint16_t* value(const void* self, int64_t pos) {
    auto* r = static_cast<const AttentionRows*>(self);
    return r->memory->value(r->layer, pos) + r->offset;
  }
};

class Transformer final : public Model {
 public:
  explicit Transformer(const gguf::File& file);
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
               ThreadPool& pool) override;

 private:
  void attention(const Layer& layer, int il, const ForwardBatch& batch, SequenceMemory& memory,
                 const float* q, float* out, ThreadPool& pool) const;

  ArchTraits traits_;
  ModelInfo info_;
  StateSpec spec_;
  int64_t n_embd_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, n_rot_ = 0, n_ff_ = 0;
  float eps_ = 1e-5f;
  MatrixView token_embd_, output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
};

Transformer::Transformer(const gguf::File& file) {
  const std::string arch = file.require_string("general.architecture");
  traits_ = traits_for(arch);
  auto key = [&](const char* k) { return arch + "." + k; };
  n_embd_ = file.require_int(key("embedding_length"));
  const int64_t n_layer = file.require_int(key("block_count"));
  n_head_ = file.require_int(key("attention.head_count"));
  n_head_kv_ = file.get_int(key("attention.head_count_kv")).value_or(n_head_);
  if (n_embd_ <= 0 || n_layer <= 0 || n_layer > 1024 || n_head_ <= 0 || n_head_kv_ <= 0 ||
      n_head_ % n_head_kv_ != 0)
    file.fail("inconsistent attention hyper-parameters");
  head_dim_ = file.get_int(key("attention.key_length")).value_or(n_embd_ / n_head_);
  const int64_t head_dim_v = file.get_int(key("attention.value_length")).value_or(head_dim_);
  if (head_dim_v != head_dim_ || head_dim_ <= 0 || head_dim_ > 1024)
    file.fail("unsupported head dimensions");
  n_rot_ = file.get_int(key("rope.dimension_count")).value_or(head_dim_);
  if (n_rot_ <= 0 || n_rot_ > head_dim_ || n_rot_ % 2) file.fail("invalid rope.dimension_count");
  n_ff_ = file.require_int(key("feed_forward_length"));
  eps_ = static_cast<float>(file.get_float(key("attention.layer_norm_rms_epsilon")).value_or(1e-5));
  const float rope_base = static_cast<float>(file.get_float(key("rope.freq_base")).value_or(10000.0));
  float rope_scale = 1.0f;
  if (auto type = file.get_string(key("rope.scaling.type"))) {
    if (*type == "linear") {
      double f = file.get_float(key("rope.scaling.factor")).value_or(1.0);
      if (f > 0) rope_scale = static_cast<float>(1.0 / f);
    } else if (*type != "none") {
      file.fail("unsupported rope scaling type '" + *type + "'");
    }
  }

  WeightLoader w(file);
  const gguf::TensorInfo& embd = file.require_tensor("token_embd.weight");
  if (embd.shape.size() != 2) file.fail("token_embd.weight must be 2-D");
  const int64_t n_vocab = static_cast<int64_t>(embd.shape[1]);
  token_embd_ = w.matrix("token_embd.weight", n_embd_, n_vocab);
  output_ = w.has("output.weight") ? w.matrix("output.weight", n_embd_, n_vocab) : token_embd_;
  output_norm_ = w.vector("output_norm.weight", n_embd_);

  int swa_pattern = 0;
  int window = 0;
  if (traits_.sliding_window) {
    window = static_cast<int>(file.get_int(key("attention.sliding_window")).value_or(0));
    swa_pattern = static_cast<int>(file.get_int(key("attention.sliding_window_pattern")).value_or(6));
    if (window < 0 || swa_pattern < 0) file.fail("invalid sliding window settings");
  }

  const int64_t q_dim = n_head_ * head_dim_, kv_dim = n_head_kv_ * head_dim_;
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer& L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.attn_norm = w.vector(p + "attn_norm.weight", n_embd_);
    L.wq = w.matrix(p + "attn_q.weight", n_embd_, q_dim);
    L.wk = w.matrix(p + "attn_k.weight", n_embd_, kv_dim);
    L.wv = w.matrix(p + "attn_v.weight", n_embd_, kv_dim);
    L.wo = w.matrix(p + "attn_output.weight", q_dim, n_embd_);
    if (traits_.qkv_bias) {
      L.bq = w.optional_vector(p + "attn_q.bias", q_dim);
      L.bk = w.optional_vector(p + "attn_k.bias", kv_dim);
      L.bv = w.optional_vector(p + "attn_v.bias", kv_dim);
    }
    if (traits_.qk_norm) {
      L.q_norm = w.vector(p + "attn_q_norm.weight", head_dim_);
      L.k_norm = w.vector(p + "attn_k_norm.weight", head_dim_);
    }
    L.ffn_norm = w.vector(p + "ffn_norm.weight", n_embd_);
    L.gate = w.matrix(p + "ffn_gate.weight", n_embd_, n_ff_);
    L.up = w.matrix(p + "ffn_up.weight", n_embd_, n_ff_);
    L.down = w.matrix(p + "ffn_down.weight", n_ff_, n_embd_);
    if (traits_.post_norms) {
      L.post_attn_norm = w.vector(p + "post_attention_norm.weight", n_embd_);
      L.post_ffn_norm = w.vector(p + "post_ffw_norm.weight", n_embd_);
    }
    L.rope_base = rope_base;
    L.rope_scale = rope_scale;
    // gemma3: within every `pattern` layers, all but the last use the sliding
    // window (and the local RoPE base of 10000); the last is global.
    if (traits_.sliding_window && swa_pattern > 0 && window > 0 &&
        (il % swa_pattern) < (swa_pattern - 1)) {
      L.window = window;
      L.rope_base = 10000.0f;
      L.rope_scale = 1.0f;
    }
    LayerStateSpec s;
    s.kind = LayerStateKind::Attention;
    s.n_kv_heads = static_cast<int>(n_head_kv_);
    s.head_dim_k = s.head_dim_v = static_cast<int>(head_dim_);
    s.window = L.window;
    spec_.layers.push_back(s);
  }

  info_.arch = arch;
  info_.name = file.get_string("general.name").value_or("");
  info_.n_vocab = n_vocab;
  info_.n_ctx_train = file.get_int(key("context_length")).value_or(2048);
  info_.n_embd = n_embd_;
  info_.n_layer = n_layer;
  for (const auto& t : file.tensors()) {
    info_.n_params += static_cast<int64_t>(t.n_elements());
    info_.weight_bytes += t.n_bytes;
  }
  std::string layout = "transformer/v1/" + arch + "/" + std::to_string(n_embd_) + "/" +
                       std::to_string(n_layer) + "/" + std::to_string(n_head_) + "/" +
                       std::to_string(n_head_kv_) + "/" + std::to_string(head_dim_) + "/" +
                       std::to_string(n_rot_) + "/" + std::to_string(rope_base) + "/" +
                       std::to_string(rope_scale) + "/" + std::to_string(eps_) + "/" +
                       std::to_string(window) + "/" + std::to_string(swa_pattern);
  info_.fingerprint = fingerprint_weights(file, layout);
}

void Transformer::attention(const Layer& L, int il, const ForwardBatch& batch, SequenceMemory& memory,
                            const float* q, float* out, ThreadPool& pool) const {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  const int64_t group = n_head_ / n_head_kv_;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  pool.parallel_for(n * n_head_, [&](int64_t task) {
    const int64_t t = task / n_head_, h = task % n_head_;
    const int64_t pos = batch.pos0 + t;
    int64_t last = pos;
    if (t >= batch.bidir_begin && t < batch.bidir_end) last = batch.pos0 + batch.bidir_end - 1;
    int64_t first = 0;
    if (L.window > 0) first = std::max<int64_t>(0, pos - L.window + 1);
    const int64_t kv_off = (h / group) * head_dim_;
    AttentionRows rows{&memory, il, kv_off};
    attend_one_query(q + (t * n_head_ + h) * head_dim_, head_dim_, first, last + 1, scale,
                     &AttentionRows::key, &AttentionRows::value, &rows,
                     out + (t * n_head_ + h) * head_dim_);
  });
}

void Transformer::forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
                          ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(batch.tokens.size());
  if (n == 0) return;
  const int64_t q_dim = n_head_ * head_dim_, kv_dim = n_head_kv_ * head_dim_;
  memory.prepare(batch.pos0, batch.pos0 + n);

  std::vector<float> x(n * n_embd_), h(n * n_embd_), q(n * q_dim), k(n * kv_dim), v(n * kv_dim);
  std::vector<float> attn(n * q_dim), tmp(n * n_embd_), g(n * n_ff_), u(n * n_ff_);

  for (int64_t t = 0; t < n; ++t) {
    float* xt = x.data() + t * n_embd_;
    if (batch.embeddings && t >= batch.embd_begin && t < batch.embd_end) {
      std::memcpy(xt, batch.embeddings + (t - batch.embd_begin) * n_embd_, n_embd_ * sizeof(float));
      continue;  // projected image embeddings are already in the model's space
    }
    const int32_t tok = batch.tokens[t];
    if (tok < 0 || tok >= info_.n_vocab) throw Error("token id " + std::to_string(tok) + " out of range");
    dequantize_row(token_embd_, tok, xt);
    if (traits_.embed_scale) {
      const float s = std::sqrt(static_cast<float>(n_embd_));
      for (int64_t i = 0; i < n_embd_; ++i) xt[i] *= s;
    }
  }

  auto add_bias = [](std::vector<float>& m, const std::vector<float>& b, int64_t rows) {
    if (b.empty()) return;
    const int64_t dim = static_cast<int64_t>(b.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < dim; ++i) m[r * dim + i] += b[i];
  };

  for (int il = 0; il < static_cast<int>(layers_.size()); ++il) {
    const Layer& L = layers_[il];
    for (int64_t t = 0; t < n; ++t)
      rms_norm(x.data() + t * n_embd_, L.attn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    matmul(L.wq, h.data(), n, q.data(), pool);
    matmul(L.wk, h.data(), n, k.data(), pool);
    matmul(L.wv, h.data(), n, v.data(), pool);
    add_bias(q, L.bq, n);
    add_bias(k, L.bk, n);
    add_bias(v, L.bv, n);
    for (int64_t t = 0; t < n; ++t) {
      float* qt = q.data() + t * q_dim;
      float* kt = k.data() + t * kv_dim;
      if (traits_.qk_norm) {
        for (int64_t hh = 0; hh < n_head_; ++hh)
          rms_norm(qt + hh * head_dim_, L.q_norm.data(), eps_, head_dim_, qt + hh * head_dim_);
        for (int64_t hh = 0; hh < n_head_kv_; ++hh)
          rms_norm(kt + hh * head_dim_, L.k_norm.data(), eps_, head_dim_, kt + hh * head_dim_);
      }
      const int64_t pos = batch.pos0 + t;
      rope(qt, static_cast<int>(n_head_), static_cast<int>(head_dim_), static_cast<int>(n_rot_), pos,
           L.rope_base, L.rope_scale, traits_.rope);
      rope(kt, static_cast<int>(n_head_kv_), static_cast<int>(head_dim_), static_cast<int>(n_rot_), pos,
           L.rope_base, L.rope_scale, traits_.rope);
      convert_f32_to_f16(kt, memory.key(il, pos), kv_dim);
      convert_f32_to_f16(v.data() + t * kv_dim, memory.value(il, pos), kv_dim);
    }
    attention(L, il, batch, memory, q.data(), attn.data(), pool);
    matmul(L.wo, attn.data(), n, tmp.data(), pool);
    if (traits_.post_norms)
      for (int64_t t = 0; t < n; ++t)
        rms_norm(tmp.data() + t * n_embd_, L.post_attn_norm.data(), eps_, n_embd_, tmp.data() + t * n_embd_);
    for (int64_t i = 0; i < n * n_embd_; ++i) x[i] += tmp[i];

    for (int64_t t = 0; t < n; ++t)
      rms_norm(x.data() + t * n_embd_, L.ffn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    matmul(L.gate, h.data(), n, g.data(), pool);
    matmul(L.up, h.data(), n, u.data(), pool);
    if (traits_.gelu) {
      for (int64_t i = 0; i < n * n_ff_; ++i) g[i] = gelu_tanh(g[i]) * u[i];
    } else {
      for (int64_t i = 0; i < n * n_ff_; ++i) g[i] = silu(g[i]) * u[i];
    }
    matmul(L.down, g.data(), n, tmp.data(), pool);
    if (traits_.post_norms)
      for (int64_t t = 0; t < n; ++t)
        rms_norm(tmp.data() + t * n_embd_, L.post_ffn_norm.data(), eps_, n_embd_, tmp.data() + t * n_embd_);
    for (int64_t i = 0; i < n * n_embd_; ++i) x[i] += tmp[i];
  }

  if (batch.logits_for == LogitsFor::None) return;
  const int64_t first = batch.logits_for == LogitsFor::All ? 0 : n - 1;
  const int64_t rows = n - first;
  for (int64_t t = 0; t < rows; ++t)
    rms_norm(x.data() + (first + t) * n_embd_, output_norm_.data(), eps_, n_embd_, h.data() + t * n_embd_);
  logits.resize(rows * info_.n_vocab);
  matmul(output_, h.data(), rows, logits.data(), pool);
}

}  // namespace

bool is_transformer_arch(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3";
}

std::unique_ptr<Model> load_transformer(const gguf::File& file) {
  return std::make_unique<Transformer>(file);
}

}  // namespace reprise
