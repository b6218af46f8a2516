#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "gguf/gguf_file.h"
#include "model/for_tokens.h"
#include "model/layer_attention.h"
#include "model/lora_apply.h"
#include "model/output_head.h"
#include "model/pass_segments.h"
#include "model/team_step.h"
#include "model/weights.h"
#include "tensor/fp16.h"
#include "tensor/decode_team.h"
#include "tensor/kernels.h"
#include "tensor/scratch_allocator.h"
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
  // llama: RoPE frequency factors from `rope_freqs.weight` when the file has
  // it (Llama 3.1 and later; llama.cpp reads it for this architecture only).
  bool rope_freq_factors = false;
};

ArchTraits traits_for(const std::string& arch) {
  ArchTraits t;
  if (arch == "llama") {
    t.rope_freq_factors = true;
    return t;
  }
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
  PackedMatrix wq, wk, wv, wo, gate, up, down;
  std::string prefix;  // "blk.N.": the GGUF names of its tensors, which adapters adapt
  int window = 0;
  float rope_base = 10000.0f;
  float rope_scale = 1.0f;
  const float* rope_factors = nullptr;  // n_rot / 2, or null (all ones)
};

// Rows [r0, n) of a batch as a batch of their own, for attention: the same
// positions, and the same bidirectional span in absolute terms.
ForwardBatch rows_from(const ForwardBatch& b, int64_t r0) {
  ForwardBatch t = b;
  t.tokens = b.tokens.subspan(static_cast<size_t>(r0));
  t.pos0 = b.pos0 + r0;
  t.embeddings = nullptr;
  t.embd_begin = t.embd_end = 0;
  t.bidir_begin = std::max<int64_t>(0, b.bidir_begin - r0);
  t.bidir_end = std::max<int64_t>(0, b.bidir_end - r0);
  if (t.bidir_begin >= t.bidir_end) t.bidir_begin = t.bidir_end = 0;
  return t;
}

// RoPE angles of a pass's rows: one table for each (base, scale) its layers
// use (gemma3's local layers share one, its global ones another).
struct RopeTables {
  std::vector<int> of_layer;    // layer -> its table
  std::vector<float> cos, sin;  // [table][row][n_rot / 2]
  int64_t n_rows = 0;
  int64_t half_rot = 0;
  const float* cos_at(int layer, int64_t row) const { return cos.data() + offset(layer, row); }
  const float* sin_at(int layer, int64_t row) const { return sin.data() + offset(layer, row); }
  int64_t offset(int layer, int64_t row) const { return (of_layer[layer] * n_rows + row) * half_rot; }
};

// A pass's scratch (see Transformer::run), bound by position there: the
// fields are only storage, so their order does not matter.
struct PassBuffers {
  std::vector<int64_t> row_pos;
  // A long prompt's pass needs megabytes of each: huge pages (scratch_allocator.h).
  ScratchVector<float> x, h, q, k, v, attn, tmp, g, u;
  std::vector<SequenceAttention> per_sequence;
  ForwardBatch tail;
};

class Transformer final : public SegmentedModel {
 public:
  explicit Transformer(const gguf::File& file);
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return spec_; }
  void prepare_scratch(int64_t n_tokens, ThreadPool& pool) override {
    size_pass_buffers(pool.caller_local<PassBuffers>(), n_tokens);
  }
  void check_adapter(const LoraAdapter& adapter) const override;

 private:
  // One pass over every segment's rows: products over all rows at once,
  // attention per segment against its own memory.
  void run(std::span<const PassSegment> segments, ThreadPool& pool) override;
  // Whether run_team_step takes the pass: one token of each sequence (a
  // decode step of up to kDecodeTeamMaxSequences - 1), each wanting its
  // logits, on a pool of several threads that fits the CPUs.
  bool team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const;
  // run for such a pass, by every thread of the pool inside one dispatch
  // (tensor/decode_team.h): the same operations, the same bits.
  void run_team_step(std::span<const PassSegment> segments, ThreadPool& pool);

  // Steps both forms of a pass take, so they take them alike.
  // The pass's product and attention outputs, sized for n rows.
  void size_pass_buffers(PassBuffers& b, int64_t n) const;
  // A token's embedding row (out: n_embd floats).
  void embed_token(int32_t token, float* out) const;
  // One row's query heads [h0, h1) and their KV heads (whole), as the
  // layer's projections left them: biases, Q/K norms, then RoPE (the row's
  // angles, n_rot / 2 each).
  void ready_heads(const Layer& L, float* q, float* k, float* v, int64_t h0, int64_t h1, const float* cos,
                   const float* sin) const;
  // x += the product output t (post-normed into scratch first where the
  // architecture has post-norms).
  void add_residual(float* x, const float* t, const std::vector<float>& post_norm, float* scratch) const;
  // The RoPE tables of rows at `positions`, each computed once.
  void build_rope_tables(std::span<const int64_t> positions, RopeTables& t, ThreadPool& pool) const;

  ArchTraits traits_;
  ModelInfo info_;
  StateSpec spec_;
  int64_t n_embd_ = 0, n_head_ = 0, n_head_kv_ = 0, head_dim_ = 0, n_rot_ = 0, n_ff_ = 0;
  float eps_ = 1e-5f;
  float attn_scale_ = 1.0f;  // query-key scores' scale
  MatrixView token_embd_;
  PackedMatrix output_;
  std::vector<float> output_norm_;
  std::vector<float> rope_freqs_;  // empty: none (Layer::rope_factors)
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
  // Scores are scaled by 1/sqrt(head_dim), except Gemma 3 27B's (62 layers),
  // whose query_pre_attn_scalar is n_embd / n_head (168, not its head_dim
  // 128): llama.cpp picks that by the layer count too.
  attn_scale_ = 1.0f / std::sqrt(static_cast<float>(arch == "gemma3" && n_layer == 62 ? n_embd_ / n_head_ : head_dim_));
  eps_ = static_cast<float>(file.get_float(key("attention.layer_norm_rms_epsilon")).value_or(1e-5));
  const float rope_base = static_cast<float>(file.get_float(key("rope.freq_base")).value_or(10000.0));
  float rope_scale = 1.0f;
  // As llama.cpp: no type means linear, and the factor may be the older
  // rope.scale_linear key (2023 files of linearly scaled long-context models).
  const std::string scaling = file.get_string(key("rope.scaling.type")).value_or("linear");
  if (scaling == "linear") {
    const double f = file.get_float(key("rope.scaling.factor")).value_or(file.get_float(key("rope.scale_linear")).value_or(0.0));
    if (f > 0) rope_scale = static_cast<float>(1.0 / f);
  } else if (scaling != "none") {
    file.fail("unsupported rope scaling type '" + scaling + "'");
  }
  if (const int64_t experts = file.get_int(key("expert_count")).value_or(0); experts > 0)
    file.fail("mixture-of-experts " + arch + " models (expert_count " + std::to_string(experts) +
              ") are not supported");

  int swa_pattern = 0;
  int window = 0;
  if (traits_.sliding_window) {
    window = static_cast<int>(file.get_int(key("attention.sliding_window")).value_or(0));
    swa_pattern = static_cast<int>(file.get_int(key("attention.sliding_window_pattern")).value_or(6));
    if (window < 0 || swa_pattern < 0) file.fail("invalid sliding window settings");
  }
  std::string layout = "transformer/v1/" + arch + "/" + std::to_string(n_embd_) + "/" +
                       std::to_string(n_layer) + "/" + std::to_string(n_head_) + "/" +
                       std::to_string(n_head_kv_) + "/" + std::to_string(head_dim_) + "/" +
                       std::to_string(n_rot_) + "/" + std::to_string(rope_base) + "/" +
                       std::to_string(rope_scale) + "/" + std::to_string(eps_) + "/" +
                       std::to_string(window) + "/" + std::to_string(swa_pattern);
  auto fingerprint = fingerprint_weights_async(file, std::move(layout));

  WeightLoader w(file);
  const int64_t n_vocab = load_embedding_and_head(w, n_embd_, token_embd_, output_, output_norm_);
  if (traits_.rope_freq_factors) {
    // Llama 3.1's long-context RoPE: each rotation pair's frequency divided
    // by its factor. Ignoring them would load and run, with wrong angles.
    rope_freqs_ = w.optional_vector("rope_freqs.weight", n_rot_ / 2);
    for (float f : rope_freqs_)
      if (!(f > 0.0f) || !std::isfinite(f)) file.fail("rope_freqs.weight holds a factor that is not positive and finite");
  }

  const int64_t q_dim = n_head_ * head_dim_, kv_dim = n_head_kv_ * head_dim_;
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer& L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.prefix = p;
    L.attn_norm = w.vector(p + "attn_norm.weight", n_embd_);
    L.wq = PackedMatrix(w.matrix(p + "attn_q.weight", n_embd_, q_dim));
    L.wk = PackedMatrix(w.matrix(p + "attn_k.weight", n_embd_, kv_dim));
    L.wv = PackedMatrix(w.matrix(p + "attn_v.weight", n_embd_, kv_dim));
    L.wo = PackedMatrix(w.matrix(p + "attn_output.weight", q_dim, n_embd_));
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
    L.gate = PackedMatrix(w.matrix(p + "ffn_gate.weight", n_embd_, n_ff_));
    L.up = PackedMatrix(w.matrix(p + "ffn_up.weight", n_embd_, n_ff_));
    L.down = PackedMatrix(w.matrix(p + "ffn_down.weight", n_ff_, n_embd_));
    if (traits_.post_norms) {
      L.post_attn_norm = w.vector(p + "post_attention_norm.weight", n_embd_);
      L.post_ffn_norm = w.vector(p + "post_ffw_norm.weight", n_embd_);
    }
    L.rope_base = rope_base;
    L.rope_scale = rope_scale;
    L.rope_factors = rope_freqs_.empty() ? nullptr : rope_freqs_.data();
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
  info_.attention_scale = attn_scale_;
  for (const auto& t : file.tensors()) {
    info_.n_params += static_cast<int64_t>(t.n_elements());
    info_.weight_bytes += t.n_bytes;
  }
  w.refuse_unknown_tensors();
  info_.fingerprint = fingerprint.get();
}

void Transformer::size_pass_buffers(PassBuffers& b, int64_t n) const {
  const int64_t q_dim = n_head_ * head_dim_, kv_dim = n_head_kv_ * head_dim_;
  b.x.resize(n * n_embd_);
  b.h.resize(n * n_embd_);
  b.q.resize(n * q_dim);
  b.k.resize(n * kv_dim);
  b.v.resize(n * kv_dim);
  b.attn.resize(n * q_dim);
  b.tmp.resize(n * n_embd_);
  b.g.resize(n * n_ff_);
  b.u.resize(n * n_ff_);
}

void Transformer::embed_token(int32_t token, float* out) const {
  dequantize_row(token_embd_, token, out);
  if (traits_.embed_scale) {
    const float s = std::sqrt(static_cast<float>(n_embd_));
    for (int64_t j = 0; j < n_embd_; ++j) out[j] *= s;
  }
}

void Transformer::ready_heads(const Layer& L, float* q, float* k, float* v, int64_t h0, int64_t h1, const float* cos,
                              const float* sin) const {
  const int64_t D = head_dim_, group = n_head_ / n_head_kv_, j0 = h0 / group, j1 = h1 / group;
  auto add_bias = [](float* m, const std::vector<float>& b, int64_t from, int64_t to) {
    if (b.empty()) return;
    for (int64_t i = from; i < to; ++i) m[i] += b[i];
  };
  add_bias(q, L.bq, h0 * D, h1 * D);
  add_bias(k, L.bk, j0 * D, j1 * D);
  add_bias(v, L.bv, j0 * D, j1 * D);
  if (traits_.qk_norm) {
    for (int64_t hh = h0; hh < h1; ++hh) rms_norm(q + hh * D, L.q_norm.data(), eps_, D, q + hh * D);
    for (int64_t j = j0; j < j1; ++j) rms_norm(k + j * D, L.k_norm.data(), eps_, D, k + j * D);
  }
  rope_apply(q + h0 * D, static_cast<int>(h1 - h0), static_cast<int>(D), static_cast<int>(n_rot_), cos, sin,
             traits_.rope);
  rope_apply(k + j0 * D, static_cast<int>(j1 - j0), static_cast<int>(D), static_cast<int>(n_rot_), cos, sin,
             traits_.rope);
}

void Transformer::add_residual(float* x, const float* t, const std::vector<float>& post_norm, float* scratch) const {
  if (traits_.post_norms) {
    rms_norm(t, post_norm.data(), eps_, n_embd_, scratch);
    t = scratch;
  }
  add_inplace(x, t, n_embd_);
}

void Transformer::build_rope_tables(std::span<const int64_t> positions, RopeTables& t, ThreadPool& pool) const {
  const int64_t n = static_cast<int64_t>(positions.size()), half_rot = n_rot_ / 2;
  t.n_rows = n;
  t.half_rot = half_rot;
  t.of_layer.assign(layers_.size(), 0);
  std::vector<const Layer*> firsts;  // each table's first layer
  for (size_t il = 0; il < layers_.size(); ++il) {
    const Layer& L = layers_[il];
    size_t i = 0;
    while (i < firsts.size() && (firsts[i]->rope_base != L.rope_base || firsts[i]->rope_scale != L.rope_scale ||
                                 firsts[i]->rope_factors != L.rope_factors))
      ++i;
    if (i == firsts.size()) firsts.push_back(&L);
    t.of_layer[il] = static_cast<int>(i);
  }
  const int64_t n_tables = static_cast<int64_t>(firsts.size());
  t.cos.resize(n_tables * n * half_rot);
  t.sin.resize(n_tables * n * half_rot);
  for (int64_t i = 0; i < n_tables; ++i) {
    const Layer& L = *firsts[i];
    for_tokens(n, pool, [&](int64_t r) {
      rope_table(static_cast<int>(n_rot_), positions[r], L.rope_base, L.rope_scale, L.rope_factors,
                 t.cos.data() + (i * n + r) * half_rot, t.sin.data() + (i * n + r) * half_rot);
    });
  }
}

// What a transformer's team step keeps between steps, per pool
// (ThreadPool::caller_local), beside every model's (team_step.h).
// A team member's adapter deltas (run_team_step): every member computes
// every delta itself and adds it where it reads the product's output.
struct MemberLoraDeltas {
  LoraRowDeltas q, k, v, o, gate, up, down;
  std::vector<float> row, up_rows;  // a product's output row plus its deltas; up's rows likewise
};

struct TransformerTeamState : TeamStepState {
  std::vector<int64_t> positions;  // each sequence's token's
  RopeTables rope;
  std::vector<std::unique_ptr<MemberLoraDeltas>> lora;  // by member index
};

bool Transformer::team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const {
  if (!decode_team_may_run(segments, pool)) return false;
  for (const PassSegment& seg : segments)
    if (!team_attention_takes(head_dim_, n_head_, n_head_kv_, seg.batch.pos0 + 1)) return false;
  return pool.caller_local<TransformerTeamState>().ready();
}

void Transformer::run_team_step(std::span<const PassSegment> segments, ThreadPool& pool) {
  const int64_t n = static_cast<int64_t>(segments.size());  // one token (row) per sequence
  const int64_t q_dim = n_head_ * head_dim_;
  const int64_t n_layer = static_cast<int64_t>(layers_.size()), n_vocab = info_.n_vocab;
  // Outputs of the products and attention, which every member reads (each
  // member keeps its own residual stream and inputs below).
  PassBuffers& shared = pool.caller_local<PassBuffers>();
  size_pass_buffers(shared, n);
  ScratchVector<float>&q = shared.q, &k = shared.k, &v = shared.v, &attn = shared.attn, &tmp = shared.tmp,
                       &g = shared.g, &u = shared.u;

  TransformerTeamState& st = pool.caller_local<TransformerTeamState>();
  st.firsts.clear();
  for (const Layer& L : layers_) st.firsts.insert(st.firsts.end(), {&L.wq, &L.wo, &L.gate, &L.down});
  st.firsts.push_back(&output_);
  std::vector<float>& logits = st.begin(segments, n_vocab, pool);
  st.positions.resize(n);
  for (int64_t r = 0; r < n; ++r) st.positions[r] = segments[r].batch.pos0;
  build_rope_tables(st.positions, st.rope, pool);

  const bool loras = pass_has_loras(segments);
  if (loras)
    while (static_cast<int>(st.lora.size()) < st.team->size()) st.lora.push_back(std::make_unique<MemberLoraDeltas>());
  st.team->run([&](DecodeTeam::Member& m) {
    // This member's residual stream and inputs: every member computes them
    // all (the same bits), so reading them needs no barrier.
    thread_local std::vector<float> x, h, act;
    // With adapters, every member computes every delta itself and adds it
    // where it reads the product's output (model/lora_apply.h): the query,
    // key and value heads it readies, the residual adds, the gate. (Kept
    // with the pool, by member: not in every thread that ever led a step.)
    MemberLoraDeltas* const lora = loras ? st.lora[m.index()].get() : nullptr;
    thread_local std::vector<AttentionRows> rows;
    thread_local std::vector<AttentionBatch> batches;
    x.resize(n * n_embd_);
    h.resize(n * n_embd_);
    act.resize(n * std::max(n_embd_, n_ff_));
    if (static_cast<int64_t>(rows.size()) < n) rows.resize(n);
    batches.resize(n);
    for (int64_t r = 0; r < n; ++r) embed_token(segments[r].batch.tokens[0], x.data() + r * n_embd_);
    auto norm_rows = [&](const std::vector<float>& weight) {
      for (int64_t r = 0; r < n; ++r)
        rms_norm(x.data() + r * n_embd_, weight.data(), eps_, n_embd_, h.data() + r * n_embd_);
    };
    auto add_residuals = [&](const std::vector<float>& post_norm, const LoraRowDeltas* deltas) {
      for (int64_t r = 0; r < n; ++r) {
        const float* t = tmp.data() + r * n_embd_;
        if (deltas) {
          lora->row.assign(t, t + n_embd_);
          deltas->add(r, lora->row.data(), 0, n_embd_);
          t = lora->row.data();
        }
        add_residual(x.data() + r * n_embd_, t, post_norm, act.data());
      }
    };
    // The K/V slots this member's attention tasks will likely write (its
    // share of the tasks, which run sequence by sequence): its part of the
    // KV heads of one sequence, or its part of several sequences.
    auto prefetch_my_slots = [&](int layer) {
      const int me = m.index(), size = m.size();
      if (n == 1) {
        prefetch_kv_slot_heads(*segments[0].memory, layer, segments[0].batch.pos0, n_head_kv_ * me / size,
                               n_head_kv_ * (me + 1) / size, head_dim_);
        return;
      }
      for (int64_t r = n * me / size; r < n * (me + 1) / size; ++r)
        prefetch_kv_slot_heads(*segments[r].memory, layer, segments[r].batch.pos0, 0, n_head_kv_, head_dim_);
    };
    int product = 0;
    for (int64_t il = 0; il < n_layer; ++il) {
      const Layer& L = layers_[il];
      const int layer = static_cast<int>(il);
      norm_rows(L.attn_norm);
      prefetch_my_slots(layer);
      if (loras) {
        lora->q.compute(segments, L.prefix + "attn_q.weight", h.data(), n_embd_, q_dim);
        lora->k.compute(segments, L.prefix + "attn_k.weight", h.data(), n_embd_, n_head_kv_ * head_dim_);
        lora->v.compute(segments, L.prefix + "attn_v.weight", h.data(), n_embd_, n_head_kv_ * head_dim_);
      }
      const MatmulOutput qkv[] = {{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}};
      team_matmul_many(qkv, h.data(), m, st.plan, product++);
      const LayerAttentionShape shape{n_head_, n_head_kv_, head_dim_, L.window, attn_scale_};
      for (int64_t r = 0; r < n; ++r)
        batches[r] = one_token_attention(segments[r].batch, *segments[r].memory, layer, shape, q.data() + r * q_dim,
                                         attn.data() + r * q_dim, rows[r]);
      // A task's heads, readied before it attends them: biases, norms and
      // RoPE on its query heads and KV heads, then its K/V rows stored.
      struct Prepare {
        const Transformer* self;
        const Layer* L;
        int layer;
        std::span<const PassSegment> segments;
        float *q, *k, *v;
        const RopeTables* rope;
        const MemberLoraDeltas* lora;  // null without adapters
      } prep{this, &L, layer, segments, q.data(), k.data(), v.data(), &st.rope, lora};
      auto prepare = [](void* ctx, size_t r, int64_t h0, int64_t h1) {
        const Prepare& p = *static_cast<const Prepare*>(ctx);
        const Transformer& t = *p.self;
        const int64_t D = t.head_dim_, group = t.n_head_ / t.n_head_kv_;
        float* q = p.q + r * t.n_head_ * D;
        float* k = p.k + r * t.n_head_kv_ * D;
        float* v = p.v + r * t.n_head_kv_ * D;
        const auto row = static_cast<int64_t>(r);
        if (p.lora) {
          const int64_t j0 = h0 / group, j1 = h1 / group;
          p.lora->q.add(row, q, h0 * D, h1 * D);
          p.lora->k.add(row, k, j0 * D, j1 * D);
          p.lora->v.add(row, v, j0 * D, j1 * D);
        }
        t.ready_heads(*p.L, q, k, v, h0, h1, p.rope->cos_at(p.layer, row), p.rope->sin_at(p.layer, row));
        const PassSegment& seg = p.segments[r];
        store_kv_heads(*seg.memory, p.layer, seg.batch.pos0, h0 / group, h1 / group, D, k, v);
      };
      team_attention(std::span<const AttentionBatch>(batches.data(), n), m, prepare, &prep, st.plan);
      const MatmulOutput o[] = {{&L.wo, tmp.data()}};
      team_matmul_many(o, attn.data(), m, st.plan, product++);
      if (loras) lora->o.compute(segments, L.prefix + "attn_output.weight", attn.data(), q_dim, n_embd_);
      add_residuals(L.post_attn_norm, lora ? &lora->o : nullptr);
      norm_rows(L.ffn_norm);
      if (loras) {
        lora->gate.compute(segments, L.prefix + "ffn_gate.weight", h.data(), n_embd_, n_ff_);
        lora->up.compute(segments, L.prefix + "ffn_up.weight", h.data(), n_embd_, n_ff_);
      }
      const MatmulOutput gate_up[] = {{&L.gate, g.data()}, {&L.up, u.data()}};
      team_matmul_many(gate_up, h.data(), m, st.plan, product++);
      std::memcpy(act.data(), g.data(), n * n_ff_ * sizeof(float));
      const float* up_rows = u.data();
      if (loras) {
        lora->up_rows.assign(u.data(), u.data() + n * n_ff_);
        for (int64_t r = 0; r < n; ++r) {
          lora->gate.add(r, act.data() + r * n_ff_, 0, n_ff_);
          lora->up.add(r, lora->up_rows.data() + r * n_ff_, 0, n_ff_);
        }
        up_rows = lora->up_rows.data();
      }
      for (int64_t r = 0; r < n; ++r) {
        if (traits_.gelu) gelu_mul(act.data() + r * n_ff_, up_rows + r * n_ff_, n_ff_);
        else silu_mul(act.data() + r * n_ff_, up_rows + r * n_ff_, n_ff_);
      }
      if (loras) lora->down.compute(segments, L.prefix + "ffn_down.weight", act.data(), n_ff_, n_embd_);
      const MatmulOutput down[] = {{&L.down, tmp.data()}};
      team_matmul_many(down, act.data(), m, st.plan, product++);
      add_residuals(L.post_ffn_norm, lora ? &lora->down : nullptr);
    }
    norm_rows(output_norm_);
    const MatmulOutput out[] = {{&output_, logits.data()}};
    team_matmul_many(out, h.data(), m, st.plan, product++);
  });
  st.end(segments, n_vocab, pool);
}

void Transformer::run(std::span<const PassSegment> segments, ThreadPool& pool) {
  if (team_step_takes(segments, pool)) return run_team_step(segments, pool);
  const int64_t n = pass_rows(segments);
  const int64_t q_dim = n_head_ * head_dim_, kv_dim = n_head_kv_ * head_dim_;
  // Activation buffers are reused across calls: a prompt's buffers run to
  // megabytes, and fresh pages would be faulted in each time. One set per
  // pool (ThreadPool::caller_local), not per calling thread.
  auto& [row_pos, x, h, q, k, v, attn, tmp, g, u, per_sequence, tail] = pool.caller_local<PassBuffers>();
  // Every row's position.
  row_pos.resize(n);
  for (const PassSegment& s : segments) {
    const int64_t len = static_cast<int64_t>(s.batch.tokens.size());
    for (int64_t i = 0; i < len; ++i) row_pos[s.row0 + i] = s.batch.pos0 + i;
  }

  size_pass_buffers(pool.caller_local<PassBuffers>(), n);
  const bool loras = pass_has_loras(segments);

  for (const PassSegment& seg : segments) {
    const ForwardBatch& batch = seg.batch;
    for (int64_t i = 0; i < static_cast<int64_t>(batch.tokens.size()); ++i) {
      float* xt = x.data() + (seg.row0 + i) * n_embd_;
      if (batch.embeddings && i >= batch.embd_begin && i < batch.embd_end) {
        std::memcpy(xt, batch.embeddings + (i - batch.embd_begin) * n_embd_, n_embd_ * sizeof(float));
        continue;  // projected image embeddings are already in the model's space
      }
      embed_token(batch.tokens[i], xt);
    }
  }

  RopeTables rope;
  build_rope_tables(row_pos, rope, pool);

  for (int il = 0; il < static_cast<int>(layers_.size()); ++il) {
    const Layer& L = layers_[il];
    for_tokens(n, pool, [&](int64_t t) {
      rms_norm(x.data() + t * n_embd_, L.attn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    });
    prefetch_kv_slots(segments, il, n_head_kv_, head_dim_);
    const MatmulOutput qkv[] = {{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}};
    matmul_many(qkv, h.data(), n, pool);
    if (loras) {
      add_lora_deltas(segments, L.prefix + "attn_q.weight", h.data(), n_embd_, q.data(), q_dim, 0, pool);
      add_lora_deltas(segments, L.prefix + "attn_k.weight", h.data(), n_embd_, k.data(), kv_dim, 0, pool);
      add_lora_deltas(segments, L.prefix + "attn_v.weight", h.data(), n_embd_, v.data(), kv_dim, 0, pool);
    }
    for_tokens(n, pool, [&](int64_t t) {
      ready_heads(L, q.data() + t * q_dim, k.data() + t * kv_dim, v.data() + t * kv_dim, 0, n_head_,
                  rope.cos_at(il, t), rope.sin_at(il, t));
    });
    store_kv(segments, il, n_head_kv_, head_dim_, k.data(), v.data(), pool);
    const LayerAttentionShape shape{n_head_, n_head_kv_, head_dim_, L.window, attn_scale_};
    // The last layer's output matters only for rows that produce logits (as
    // llama.cpp's inp_out_ids): rows [r0, n). Their K and V are written above.
    const int64_t r0 = il + 1 == static_cast<int>(layers_.size()) ? last_layer_first_row(segments) : 0;
    if (r0 >= n) break;
    // tail: the one segment's rows from r0 (r0 > 0 only with one segment).
    per_sequence.clear();
    if (r0 > 0) {
      tail = rows_from(segments[0].batch, r0);
      per_sequence.push_back({&tail, segments[0].memory, q.data() + r0 * q_dim, attn.data() + r0 * q_dim});
    } else {
      for (const PassSegment& seg : segments)
        per_sequence.push_back({&seg.batch, seg.memory, q.data() + seg.row0 * q_dim, attn.data() + seg.row0 * q_dim});
    }
    attend_layer_many(per_sequence, il, shape, pool);
    const int64_t m = n - r0;  // rows this layer still computes, from r0
    matmul(L.wo, attn.data() + r0 * q_dim, m, tmp.data() + r0 * n_embd_, pool);
    if (loras) add_lora_deltas(segments, L.prefix + "attn_output.weight", attn.data(), q_dim, tmp.data(), n_embd_, r0, pool);
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      float* tt = tmp.data() + t * n_embd_;
      add_residual(x.data() + t * n_embd_, tt, L.post_attn_norm, tt);
      rms_norm(x.data() + t * n_embd_, L.ffn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    });
    const MatmulOutput gate_up[] = {{&L.gate, g.data() + r0 * n_ff_}, {&L.up, u.data() + r0 * n_ff_}};
    matmul_many(gate_up, h.data() + r0 * n_embd_, m, pool);
    if (loras) {
      add_lora_deltas(segments, L.prefix + "ffn_gate.weight", h.data(), n_embd_, g.data(), n_ff_, r0, pool);
      add_lora_deltas(segments, L.prefix + "ffn_up.weight", h.data(), n_embd_, u.data(), n_ff_, r0, pool);
    }
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      if (traits_.gelu) gelu_mul(g.data() + t * n_ff_, u.data() + t * n_ff_, n_ff_);
      else silu_mul(g.data() + t * n_ff_, u.data() + t * n_ff_, n_ff_);
    });
    matmul(L.down, g.data() + r0 * n_ff_, m, tmp.data() + r0 * n_embd_, pool);
    if (loras) add_lora_deltas(segments, L.prefix + "ffn_down.weight", g.data(), n_ff_, tmp.data(), n_embd_, r0, pool);
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      float* tt = tmp.data() + t * n_embd_;
      add_residual(x.data() + t * n_embd_, tt, L.post_ffn_norm, tt);
    });
  }

  output_logits(x.data(), segments, n_embd_, output_norm_, eps_, output_, info_.n_vocab, h.data(), pool);
}

void Transformer::check_adapter(const LoraAdapter& adapter) const {
  const std::string& path = adapter.path();
  if (adapter.architecture() != info_.arch)
    throw Error(path + ": the adapter is for '" + adapter.architecture() + "' models, this model is '" + info_.arch +
                "'");
  for (const auto& [name, pair] : adapter.pairs()) {
    auto fail = [&](const std::string& why) { throw Error(path + ": LoRA tensor '" + name + "' " + why); };
    // "blk.<layer>.<role>.weight"
    const size_t dot = name.find('.', 4);
    if (name.rfind("blk.", 0) != 0 || dot == std::string::npos)
      fail("adapts a tensor outside the layers (output and embedding adapters are not supported)");
    const std::string index = name.substr(4, dot - 4);
    if (index.empty() || index.size() > 4 || index.find_first_not_of("0123456789") != std::string::npos)
      fail("names no layer");
    const size_t il = std::stoul(index);
    // Products look pairs up by the model's own names ("blk.0.", never
    // "blk.00."): a name in another spelling would never apply.
    if (std::to_string(il) != index) fail("writes its layer number in a form GGUF names never use");
    if (il >= layers_.size()) fail("names layer " + index + " of a model with " + std::to_string(layers_.size()));
    const Layer& L = layers_[il];
    const std::string role = name.substr(dot + 1);
    const PackedMatrix* w = role == "attn_q.weight"        ? &L.wq
                            : role == "attn_k.weight"      ? &L.wk
                            : role == "attn_v.weight"      ? &L.wv
                            : role == "attn_output.weight" ? &L.wo
                            : role == "ffn_gate.weight"    ? &L.gate
                            : role == "ffn_up.weight"      ? &L.up
                            : role == "ffn_down.weight"    ? &L.down
                                                           : nullptr;
    if (!w) fail("adapts no matrix this model multiplies by");
    if (pair.a.n_in() != w->n_in() || pair.b.n_out() != w->n_out())
      fail("maps " + std::to_string(pair.a.n_in()) + " inputs to " + std::to_string(pair.b.n_out()) +
           " outputs; the model's matrix maps " + std::to_string(w->n_in()) + " to " + std::to_string(w->n_out()));
  }
}

}  // namespace

bool is_transformer_arch(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "gemma3";
}

std::unique_ptr<Model> load_transformer(const gguf::File& file) {
  return std::make_unique<Transformer>(file);
}

}  // namespace reprise
