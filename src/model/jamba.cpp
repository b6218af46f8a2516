#include "model/jamba.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "gguf/gguf_file.h"
#include "model/for_tokens.h"
#include "model/layer_attention.h"
#include "model/output_head.h"
#include "model/mamba.h"
#include "model/pass_segments.h"
#include "model/team_step.h"
#include "model/weights.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/scratch_allocator.h"
#include "util/error.h"

namespace reprise {
namespace {

// A pass's scratch, once per pool (ThreadPool::caller_local): fresh vectors
// per layer were mapped and faulted in anew on every prompt chunk. Every
// element is written before it is read; large ones are huge pages
// (scratch_allocator.h).
struct PassScratch {
  ScratchVector<float> x, h, tmp;
};
struct AttentionScratch {
  ScratchVector<float> q, k, v, attn;
};
struct FfnScratch {
  ScratchVector<float> g, u;
};
struct MoeScratch {
  ScratchVector<float> expert_out, xs, g, u, d;
};

// A hyper-parameter given either once for all layers or as one entry per layer.
std::vector<int64_t> per_layer(const gguf::File& file, const std::string& key, int64_t n_layer,
                               std::optional<int64_t> fallback) {
  const gguf::Value* v = file.find(key);
  if (!v) {
    if (!fallback) file.fail("missing metadata key '" + key + "'");
    return std::vector<int64_t>(n_layer, *fallback);
  }
  if (v->type == gguf::ValueType::ARRAY) {
    if (!v->elems || v->elem_type == gguf::ValueType::F32 || v->elem_type == gguf::ValueType::F64)
      file.fail("metadata key '" + key + "' is not an integer array");
    std::vector<int64_t> out = v->int_array(key);
    if (static_cast<int64_t>(out.size()) != n_layer)
      file.fail("metadata key '" + key + "' has " + std::to_string(out.size()) + " entries for " +
                std::to_string(n_layer) + " layers");
    return out;
  }
  return std::vector<int64_t>(n_layer, file.require_int(key));
}

struct Ffn {
  PackedMatrix gate, up, down;  // dense
  PackedMatrix router;          // MoE: ffn_gate_inp [n_embd, n_expert] (empty = dense FFN)
  std::vector<PackedMatrix> gate_exps, up_exps, down_exps;
};

struct Layer {
  std::vector<float> attn_norm, ffn_norm;
  bool recurrent = false;
  Mamba1Layer ssm;
  int64_t n_head_kv = 0;
  PackedMatrix wq, wk, wv, wo;
  Ffn ffn;
};

// Slices a 3-D expert tensor [n_in, n_out, n_expert] into per-expert matrices.
std::vector<PackedMatrix> expert_matrices(const WeightLoader& w, const std::string& name, int64_t n_in,
                                        int64_t n_out, int64_t n_expert) {
  const gguf::File& file = w.file();
  const gguf::TensorInfo& t = w.tensor(name);
  const std::vector<uint64_t> want = {static_cast<uint64_t>(n_in), static_cast<uint64_t>(n_out),
                                      static_cast<uint64_t>(n_expert)};
  if (t.shape != want)
    file.fail("tensor '" + name + "' has the wrong shape for [" + std::to_string(n_in) + ", " +
              std::to_string(n_out) + ", " + std::to_string(n_expert) + "]");
  if (!dtype_supported(t.type))
    file.fail("tensor '" + name + "' has unsupported type " + dtype_name(t.raw_type));
  std::vector<PackedMatrix> out;
  const size_t row_bytes = dtype_row_bytes(t.type, n_in);
  for (int64_t e = 0; e < n_expert; ++e) {
    MatrixView m;
    m.type = t.type;
    m.n_in = n_in;
    m.n_out = n_out;
    m.row_bytes = row_bytes;
    m.data = t.data + static_cast<size_t>(e) * static_cast<size_t>(n_out) * row_bytes;
    out.emplace_back(m);
  }
  return out;
}

// Routing (llama.cpp build_moe_ffn with softmax gating, no renormalization
// of the selected weights): softmax over all experts of each of n rows of
// `probs` (in place), then the top k: sel / weight [row * k + j].
void route_tokens(float* probs, int64_t n, int64_t ne, int64_t k, int32_t* sel, float* weight) {
  std::vector<int32_t> order(ne);
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs + t * ne;
    softmax_inplace(p, ne);
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [p](int32_t a, int32_t b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    for (int64_t j = 0; j < k; ++j) {
      sel[t * k + j] = order[j];
      weight[t * k + j] = p[order[j]];
    }
  }
}

// The (row, choice) slots routed to expert e, in order.
void slots_of(const std::vector<int32_t>& sel, int64_t e, std::vector<int64_t>& slots) {
  slots.clear();
  for (int64_t i = 0; i < static_cast<int64_t>(sel.size()); ++i)
    if (sel[i] == e) slots.push_back(i);
}

// out row t = sum over choices j in selection order of expert_out[t, j] *
// weight[t, j]: ((e0 * w0) + (e1 * w1)) + ...
void weighted_expert_sum(const float* expert_out, const float* weight, int64_t n, int64_t k, int64_t n_embd,
                         float* out) {
  for (int64_t t = 0; t < n; ++t) {
    float* o = out + t * n_embd;
    for (int64_t j = 0; j < k; ++j) {
      const float* eo = expert_out + (t * k + j) * n_embd;
      const float wj = weight[t * k + j];
      if (j == 0) {
        for (int64_t i = 0; i < n_embd; ++i) o[i] = eo[i] * wj;
      } else {
        for (int64_t i = 0; i < n_embd; ++i) o[i] += eo[i] * wj;
      }
    }
  }
}

// What a jamba team step's members share besides the mixers' buffers: the
// attention layers' and the FFN products' outputs.
struct JambaTeamBuffers {
  std::vector<float> q, k, v, attn, out, g, u, probs;
};

class Jamba final : public SegmentedModel {
 public:
  explicit Jamba(const gguf::File& file);
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return spec_; }

 private:
  void run(std::span<const PassSegment> segments, ThreadPool& pool) override;
  void attention(const Layer& L, int il, std::span<const PassSegment> segments, const float* h, float* out,
                 ThreadPool& pool) const;
  void feed_forward(const Ffn& f, const float* h, int64_t n, float* out, ThreadPool& pool) const;

  // A decode step (decode_team_may_run, where team_attention_takes every
  // attention layer) by every thread of the pool inside one dispatch
  // (tensor/decode_team.h): the same operations as run, the same bits.
  // Recurrent layers run mamba1_team_mix; a mixture-of-experts layer runs
  // each routed expert's products as team products over its rows.
  bool team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const;
  void run_team_step(std::span<const PassSegment> segments, ThreadPool& pool);
  // Member m's parts of a team step's attention layer and feed-forward:
  // `h` is the member's normalized rows, `b` what the members share; they
  // return the rows the residual adds (shared, or the member's own).
  const float* team_attention_layer(const Layer& L, int il, std::span<const PassSegment> segments, const float* h,
                                    JambaTeamBuffers& b, DecodeTeam::Member& m, TeamStepPlan& plan,
                                    int& product) const;
  const float* team_feed_forward(const Ffn& f, const float* h, int64_t n, JambaTeamBuffers& b, DecodeTeam::Member& m,
                                 TeamStepPlan& plan, int& product) const;

  ModelInfo info_;
  StateSpec spec_;
  Mamba1Dims d_;
  int64_t n_embd_ = 0, n_head_ = 0, head_dim_ = 0, n_ff_ = 0, n_expert_ = 0, n_expert_used_ = 0;
  float eps_ = 1e-5f;
  MatrixView token_embd_;  // row lookups
  PackedMatrix output_;
  std::vector<float> output_norm_;
  std::vector<Layer> layers_;
};

Jamba::Jamba(const gguf::File& file) {
  const std::string arch = file.require_string("general.architecture");
  if (!is_jamba_arch(arch)) file.fail("not a jamba architecture: '" + arch + "'");
  auto key = [&](const char* k) { return arch + "." + k; };
  n_embd_ = file.require_int(key("embedding_length"));
  const int64_t n_layer = file.require_int(key("block_count"));
  if (n_embd_ <= 0 || n_embd_ > (int64_t(1) << 20) || n_layer <= 0 || n_layer > 1024)
    file.fail("invalid embedding_length or block_count");
  d_ = read_mamba1_dims(file, arch, n_embd_);
  eps_ = d_.eps;

  const std::vector<int64_t> n_head = per_layer(file, key("attention.head_count"), n_layer, std::nullopt);
  const std::vector<int64_t> n_head_kv = per_layer(file, key("attention.head_count_kv"), n_layer, std::nullopt);
  const std::vector<int64_t> n_ff = per_layer(file, key("feed_forward_length"), n_layer, std::nullopt);
  n_head_ = n_head[0];
  n_ff_ = n_ff[0];
  for (int64_t il = 0; il < n_layer; ++il) {
    if (n_head[il] != n_head_ || n_ff[il] != n_ff_)
      file.fail("per-layer head_count / feed_forward_length must be uniform");
    if (n_head_kv[il] < 0 || (n_head_kv[il] > 0 && (n_head_ <= 0 || n_head_ % n_head_kv[il] != 0)))
      file.fail("layer " + std::to_string(il) + ": attention.head_count_kv " + std::to_string(n_head_kv[il]) +
                " does not divide head_count " + std::to_string(n_head_));
  }
  if (n_ff_ <= 0 || n_ff_ > (int64_t(1) << 24)) file.fail("invalid feed_forward_length");
  if (n_head_ > 0) {
    head_dim_ = file.get_int(key("attention.key_length")).value_or(n_embd_ / n_head_);
    const int64_t head_dim_v = file.get_int(key("attention.value_length")).value_or(head_dim_);
    if (head_dim_v != head_dim_ || head_dim_ <= 0 || head_dim_ > 1024)
      file.fail("unsupported head dimensions");
  }
  n_expert_ = file.get_int(key("expert_count")).value_or(0);
  n_expert_used_ = file.get_int(key("expert_used_count")).value_or(0);

  WeightLoader w(file);
  const int64_t n_vocab = load_embedding_and_head(w, n_embd_, token_embd_, output_, output_norm_);

  std::string layout = "jamba/v1/" + std::to_string(n_embd_) + "/" + std::to_string(n_layer) + "/" +
                       std::to_string(n_head_) + "/" + std::to_string(head_dim_) + "/" + std::to_string(n_ff_) +
                       "/" + std::to_string(d_.d_inner) + "/" + std::to_string(d_.d_state) + "/" +
                       std::to_string(d_.d_conv) + "/" + std::to_string(d_.dt_rank) + "/" +
                       std::to_string(n_expert_) + "/" + std::to_string(n_expert_used_) + "/" +
                       std::to_string(eps_) + "/";
  layers_.resize(n_layer);
  for (int64_t il = 0; il < n_layer; ++il) {
    Layer& L = layers_[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    L.attn_norm = w.vector(p + "attn_norm.weight", n_embd_);
    LayerStateSpec s;
    if (n_head_kv[il] == 0) {
      L.recurrent = true;
      L.ssm = load_mamba1_layer(w, il, d_, /*with_bc_norms=*/true);
      s.kind = LayerStateKind::Recurrent;
      s.conv_state_floats = d_.conv_state_floats();
      s.ssm_state_floats = d_.ssm_state_floats();
    } else {
      L.n_head_kv = n_head_kv[il];
      const int64_t q_dim = n_head_ * head_dim_, kv_dim = L.n_head_kv * head_dim_;
      L.wq = PackedMatrix(w.matrix(p + "attn_q.weight", n_embd_, q_dim));
      L.wk = PackedMatrix(w.matrix(p + "attn_k.weight", n_embd_, kv_dim));
      L.wv = PackedMatrix(w.matrix(p + "attn_v.weight", n_embd_, kv_dim));
      L.wo = PackedMatrix(w.matrix(p + "attn_output.weight", q_dim, n_embd_));
      s.kind = LayerStateKind::Attention;
      s.n_kv_heads = static_cast<int>(L.n_head_kv);
      s.head_dim_k = s.head_dim_v = static_cast<int>(head_dim_);
    }
    spec_.layers.push_back(s);

    L.ffn_norm = w.vector(p + "ffn_norm.weight", n_embd_);
    if (w.has(p + "ffn_gate_inp.weight")) {
      if (n_expert_ <= 0 || n_expert_ > 4096 || n_expert_used_ <= 0 || n_expert_used_ > n_expert_)
        file.fail("layer " + std::to_string(il) + " has experts but expert_count = " + std::to_string(n_expert_) +
                  ", expert_used_count = " + std::to_string(n_expert_used_));
      L.ffn.router = PackedMatrix(w.matrix(p + "ffn_gate_inp.weight", n_embd_, n_expert_));
      L.ffn.gate_exps = expert_matrices(w, p + "ffn_gate_exps.weight", n_embd_, n_ff_, n_expert_);
      L.ffn.up_exps = expert_matrices(w, p + "ffn_up_exps.weight", n_embd_, n_ff_, n_expert_);
      L.ffn.down_exps = expert_matrices(w, p + "ffn_down_exps.weight", n_ff_, n_embd_, n_expert_);
    } else {
      L.ffn.gate = PackedMatrix(w.matrix(p + "ffn_gate.weight", n_embd_, n_ff_));
      L.ffn.up = PackedMatrix(w.matrix(p + "ffn_up.weight", n_embd_, n_ff_));
      L.ffn.down = PackedMatrix(w.matrix(p + "ffn_down.weight", n_ff_, n_embd_));
    }
    layout += (L.recurrent ? "M" : "A" + std::to_string(L.n_head_kv)) + (L.ffn.router.empty() ? "d" : "e");
  }

  info_.arch = arch;
  info_.name = file.get_string("general.name").value_or("");
  info_.n_vocab = n_vocab;
  info_.n_ctx_train = file.get_int(key("context_length")).value_or(1048576);
  info_.n_embd = n_embd_;
  info_.n_layer = n_layer;
  info_.attention_scale = 1.0f / std::sqrt(static_cast<float>(head_dim_));
  for (const auto& t : file.tensors()) {
    info_.n_params += static_cast<int64_t>(t.n_elements());
    info_.weight_bytes += t.n_bytes;
  }
  w.refuse_unknown_tensors();
  info_.fingerprint = fingerprint_weights(file, layout);
}

void Jamba::attention(const Layer& L, int il, std::span<const PassSegment> segments, const float* h, float* out,
                      ThreadPool& pool) const {
  const int64_t n = pass_rows(segments);
  const int64_t q_dim = n_head_ * head_dim_, kv_dim = L.n_head_kv * head_dim_;
  auto& [q, k, v, attn] = pool.caller_local<AttentionScratch>();
  q.resize(n * q_dim);
  k.resize(n * kv_dim);
  v.resize(n * kv_dim);
  attn.resize(n * q_dim);
  prefetch_kv_slots(segments, il, L.n_head_kv, head_dim_);
  const MatmulOutput qkv[] = {{&L.wq, q.data()}, {&L.wk, k.data()}, {&L.wv, v.data()}};
  matmul_many(qkv, h, n, pool);
  // No RoPE: positions enter only through the causal mask.
  store_kv(segments, il, L.n_head_kv, head_dim_, k.data(), v.data(), pool);
  std::vector<SequenceAttention> per_sequence;
  for (const PassSegment& seg : segments) {
    per_sequence.push_back({&seg.batch, seg.memory, q.data() + seg.row0 * q_dim, attn.data() + seg.row0 * q_dim});
  }
  const LayerAttentionShape shape{n_head_, L.n_head_kv, head_dim_, 0, info_.attention_scale};
  attend_layer_many(per_sequence, il, shape, pool);
  matmul(L.wo, attn.data(), n, out, pool);
}

void Jamba::feed_forward(const Ffn& f, const float* h, int64_t n, float* out, ThreadPool& pool) const {
  if (f.router.empty()) {
    auto& [g, u] = pool.caller_local<FfnScratch>();
    g.resize(n * n_ff_);
    u.resize(n * n_ff_);
    const MatmulOutput gu[] = {{&f.gate, g.data()}, {&f.up, u.data()}};
    matmul_many(gu, h, n, pool);
    silu_mul(g.data(), u.data(), n * n_ff_);
    matmul(f.down, g.data(), n, out, pool);
    return;
  }
  const int64_t ne = n_expert_, k = n_expert_used_;
  std::vector<float> probs(n * ne);
  matmul(f.router, h, n, probs.data(), pool);
  std::vector<int32_t> sel(n * k);
  std::vector<float> weight(n * k);
  route_tokens(probs.data(), n, ne, k, sel.data(), weight.data());
  // Each expert runs once over the tokens routed to it (rows are independent,
  // so grouping never changes a token's result).
  auto& [expert_out, xs, g, u, d] = pool.caller_local<MoeScratch>();
  expert_out.resize(n * k * n_embd_);  // every (token, choice) row is written below
  std::vector<int64_t> slots;
  for (int64_t e = 0; e < ne; ++e) {
    slots_of(sel, e, slots);
    if (slots.empty()) continue;
    const int64_t m = static_cast<int64_t>(slots.size());
    xs.resize(m * n_embd_);
    g.resize(m * n_ff_);
    u.resize(m * n_ff_);
    d.resize(m * n_embd_);
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(xs.data() + r * n_embd_, h + (slots[r] / k) * n_embd_, n_embd_ * sizeof(float));
    const MatmulOutput gu[] = {{&f.gate_exps[e], g.data()}, {&f.up_exps[e], u.data()}};
    matmul_many(gu, xs.data(), m, pool);
    silu_mul(g.data(), u.data(), m * n_ff_);
    matmul(f.down_exps[e], g.data(), m, d.data(), pool);
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(expert_out.data() + slots[r] * n_embd_, d.data() + r * n_embd_, n_embd_ * sizeof(float));
  }
  weighted_expert_sum(expert_out.data(), weight.data(), n, k, n_embd_, out);
}

bool Jamba::team_step_takes(std::span<const PassSegment> segments, ThreadPool& pool) const {
  if (!decode_team_may_run(segments, pool)) return false;
  for (const Layer& L : layers_) {
    if (L.recurrent) continue;
    for (const PassSegment& seg : segments)
      if (!team_attention_takes(head_dim_, n_head_, L.n_head_kv, seg.batch.pos0 + 1)) return false;
  }
  return pool.caller_local<TeamStepState>().ready();
}

const float* Jamba::team_attention_layer(const Layer& L, int il, std::span<const PassSegment> segments,
                                         const float* h, JambaTeamBuffers& b, DecodeTeam::Member& m,
                                         TeamStepPlan& plan, int& product) const {
  const auto n = static_cast<int64_t>(segments.size());
  const int64_t q_dim = n_head_ * head_dim_, kv_dim = L.n_head_kv * head_dim_;
  const MatmulOutput qkv[] = {{&L.wq, b.q.data()}, {&L.wk, b.k.data()}, {&L.wv, b.v.data()}};
  team_matmul_many(qkv, h, m, plan, product++);
  thread_local std::vector<AttentionRows> rows;
  thread_local std::vector<AttentionBatch> batches;
  if (static_cast<int64_t>(rows.size()) < n) rows.resize(n);
  batches.resize(n);
  const LayerAttentionShape shape{n_head_, L.n_head_kv, head_dim_, 0, info_.attention_scale};
  for (int64_t r = 0; r < n; ++r)
    batches[r] = one_token_attention(segments[r].batch, *segments[r].memory, il, shape, b.q.data() + r * q_dim,
                                     b.attn.data() + r * q_dim, rows[r]);
  // A task's KV heads are stored before it attends them (no RoPE: positions
  // enter only through the causal mask).
  struct Prepare {
    std::span<const PassSegment> segments;
    int layer;
    int64_t group, head_dim, kv_dim;
    const float *k, *v;
  } prep{segments, il, n_head_ / L.n_head_kv, head_dim_, kv_dim, b.k.data(), b.v.data()};
  auto prepare = [](void* ctx, size_t r, int64_t h0, int64_t h1) {
    const Prepare& p = *static_cast<const Prepare*>(ctx);
    const PassSegment& seg = p.segments[r];
    const auto row = static_cast<int64_t>(r);
    store_kv_heads(*seg.memory, p.layer, seg.batch.pos0, h0 / p.group, h1 / p.group, p.head_dim,
                   p.k + row * p.kv_dim, p.v + row * p.kv_dim);
  };
  team_attention(std::span<const AttentionBatch>(batches.data(), n), m, prepare, &prep, plan);
  const MatmulOutput o[] = {{&L.wo, b.out.data()}};
  team_matmul_many(o, b.attn.data(), m, plan, product++);
  return b.out.data();
}

const float* Jamba::team_feed_forward(const Ffn& f, const float* h, int64_t n, JambaTeamBuffers& b,
                                      DecodeTeam::Member& m, TeamStepPlan& plan, int& product) const {
  thread_local std::vector<float> act;
  if (f.router.empty()) {
    const MatmulOutput gu[] = {{&f.gate, b.g.data()}, {&f.up, b.u.data()}};
    team_matmul_many(gu, h, m, plan, product++);
    act.assign(b.g.begin(), b.g.begin() + n * n_ff_);
    silu_mul(act.data(), b.u.data(), n * n_ff_);
    const MatmulOutput down[] = {{&f.down, b.out.data()}};
    team_matmul_many(down, act.data(), m, plan, product++);
    return b.out.data();
  }
  // Every member routes every row itself (the same bits), then each expert
  // with rows takes its products as team products over them, in expert
  // order, as feed_forward runs them; an expert without rows skips its two.
  const int64_t ne = n_expert_, k = n_expert_used_;
  const MatmulOutput router[] = {{&f.router, b.probs.data()}};
  team_matmul_many(router, h, m, plan, product++);
  thread_local std::vector<float> probs, weight, xs, expert_out, out;
  thread_local std::vector<int32_t> sel;
  thread_local std::vector<int64_t> slots;
  probs.assign(b.probs.begin(), b.probs.begin() + n * ne);
  sel.resize(n * k);
  weight.resize(n * k);
  route_tokens(probs.data(), n, ne, k, sel.data(), weight.data());
  expert_out.resize(n * k * n_embd_);
  for (int64_t e = 0; e < ne; ++e) {
    slots_of(sel, e, slots);
    if (slots.empty()) {
      // Its products are planned but not run: no time to report.
      if (m.index() == 0) plan.plans[product].timed = plan.plans[product + 1].timed = false;
      product += 2;
      continue;
    }
    const auto rows = static_cast<int64_t>(slots.size());
    xs.resize(rows * n_embd_);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(xs.data() + r * n_embd_, h + (slots[r] / k) * n_embd_, n_embd_ * sizeof(float));
    const MatmulOutput gu[] = {{&f.gate_exps[e], b.g.data()}, {&f.up_exps[e], b.u.data()}};
    team_matmul_many(gu, xs.data(), m, plan, product++, rows);
    act.assign(b.g.begin(), b.g.begin() + rows * n_ff_);
    silu_mul(act.data(), b.u.data(), rows * n_ff_);
    const MatmulOutput down[] = {{&f.down_exps[e], b.out.data()}};
    team_matmul_many(down, act.data(), m, plan, product++, rows);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(expert_out.data() + slots[r] * n_embd_, b.out.data() + r * n_embd_, n_embd_ * sizeof(float));
  }
  out.resize(n * n_embd_);
  weighted_expert_sum(expert_out.data(), weight.data(), n, k, n_embd_, out.data());
  return out.data();
}

void Jamba::run_team_step(std::span<const PassSegment> segments, ThreadPool& pool) {
  const auto n = static_cast<int64_t>(segments.size());  // one token (row) per sequence
  const int64_t n_vocab = info_.n_vocab;
  std::vector<std::vector<RecurrentRun>> runs(layers_.size());
  for (size_t il = 0; il < layers_.size(); ++il)
    if (layers_[il].recurrent) runs[il] = recurrent_runs(segments, static_cast<int>(il), spec_.layers[il]);

  TeamStepState& st = pool.caller_local<TeamStepState>();
  st.firsts.clear();
  for (const Layer& L : layers_) {
    if (L.recurrent)
      st.firsts.insert(st.firsts.end(), {&L.ssm.in, &L.ssm.x_proj, &L.ssm.dt_proj, &L.ssm.out});
    else
      st.firsts.insert(st.firsts.end(), {&L.wq, &L.wo});
    if (L.ffn.router.empty()) {
      st.firsts.insert(st.firsts.end(), {&L.ffn.gate, &L.ffn.down});
    } else {
      st.firsts.push_back(&L.ffn.router);
      for (int64_t e = 0; e < n_expert_; ++e)
        st.firsts.insert(st.firsts.end(), {&L.ffn.gate_exps[e], &L.ffn.down_exps[e]});
    }
  }
  st.firsts.push_back(&output_);
  std::vector<float>& logits = st.begin(segments, n_vocab, pool);

  Mamba1TeamBuffers& mixer = pool.caller_local<Mamba1TeamBuffers>();
  mixer.size_for_team(d_, n);
  JambaTeamBuffers& b = pool.caller_local<JambaTeamBuffers>();
  const int64_t q_dim = n_head_ * head_dim_;
  int64_t kv_dim = 0;
  for (const Layer& L : layers_) kv_dim = std::max(kv_dim, L.n_head_kv * head_dim_);
  b.q.resize(n * q_dim);
  b.attn.resize(n * q_dim);
  b.k.resize(n * kv_dim);
  b.v.resize(n * kv_dim);
  b.out.resize(n * n_embd_);
  b.g.resize(n * n_ff_);
  b.u.resize(n * n_ff_);
  b.probs.resize(n * std::max<int64_t>(1, n_expert_));

  st.team->run([&](DecodeTeam::Member& m) {
    // This member's residual stream and norms: every member computes them
    // all (the same bits), so reading them needs no barrier.
    thread_local std::vector<float> x, h;
    x.resize(n * n_embd_);
    h.resize(n * n_embd_);
    for (int64_t r = 0; r < n; ++r) dequantize_row(token_embd_, segments[r].batch.tokens[0], x.data() + r * n_embd_);
    auto add_rows = [&](const float* t) {
      for (int64_t i = 0; i < n * n_embd_; ++i) x[i] += t[i];
    };
    int product = 0;
    for (int il = 0; il < static_cast<int>(layers_.size()); ++il) {
      const Layer& L = layers_[il];
      for (int64_t t = 0; t < n; ++t)
        rms_norm(x.data() + t * n_embd_, L.attn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
      if (L.recurrent) {
        mamba1_team_mix(L.ssm, d_, h.data(), runs[il], b.out.data(), mixer, m, st.plan, product);
        add_rows(b.out.data());
      } else {
        add_rows(team_attention_layer(L, il, segments, h.data(), b, m, st.plan, product));
      }
      for (int64_t t = 0; t < n; ++t)
        rms_norm(x.data() + t * n_embd_, L.ffn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
      add_rows(team_feed_forward(L.ffn, h.data(), n, b, m, st.plan, product));
    }
    for (int64_t t = 0; t < n; ++t)
      rms_norm(x.data() + t * n_embd_, output_norm_.data(), eps_, n_embd_, h.data() + t * n_embd_);
    const MatmulOutput out[] = {{&output_, logits.data()}};
    team_matmul_many(out, h.data(), m, st.plan, product++);
  });
  st.end(segments, n_vocab, pool);
}

void Jamba::run(std::span<const PassSegment> segments, ThreadPool& pool) {
  if (team_step_takes(segments, pool)) return run_team_step(segments, pool);
  const int64_t n = pass_rows(segments);

  auto& [x, h, tmp] = pool.caller_local<PassScratch>();
  x.resize(n * n_embd_);
  h.resize(n * n_embd_);
  tmp.resize(n * n_embd_);
  for (const PassSegment& seg : segments)
    for (size_t i = 0; i < seg.batch.tokens.size(); ++i) {
      const int32_t tok = seg.batch.tokens[i];
      dequantize_row(token_embd_, tok, x.data() + (seg.row0 + static_cast<int64_t>(i)) * n_embd_);
    }

  // Every recurrent layer's state is looked up before any advances: a pass
  // that fails leaves all of it as it was.
  std::vector<std::vector<RecurrentRun>> runs(layers_.size());
  for (size_t il = 0; il < layers_.size(); ++il)
    if (layers_[il].recurrent) runs[il] = recurrent_runs(segments, static_cast<int>(il), spec_.layers[il]);
  for (int il = 0; il < static_cast<int>(layers_.size()); ++il) {
    const Layer& L = layers_[il];
    const int64_t r0 = il + 1 == static_cast<int>(layers_.size()) ? last_layer_first_row(segments) : 0;
    for_tokens(n, pool, [&](int64_t t) {
      rms_norm(x.data() + t * n_embd_, L.attn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    });
    if (L.recurrent) {
      mamba1_mix(L.ssm, d_, h.data(), runs[il], tmp.data(), pool, r0);
    } else {
      attention(L, il, segments, h.data(), tmp.data(), pool);
    }
    if (r0 == n) break;
    // The residual add, then the FFN's norm, row by row.
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      float* xt = x.data() + t * n_embd_;
      for (int64_t i = 0; i < n_embd_; ++i) xt[i] += tmp[t * n_embd_ + i];
      rms_norm(xt, L.ffn_norm.data(), eps_, n_embd_, h.data() + t * n_embd_);
    });
    feed_forward(L.ffn, h.data() + r0 * n_embd_, n - r0, tmp.data() + r0 * n_embd_, pool);
    for_tokens_from(r0, n, pool, [&](int64_t t) {
      for (int64_t i = t * n_embd_; i < (t + 1) * n_embd_; ++i) x[i] += tmp[i];
    });
  }

  output_logits(x.data(), segments, n_embd_, output_norm_, eps_, output_, info_.n_vocab, h.data(), pool);
}

}  // namespace

bool is_jamba_arch(const std::string& arch) { return arch == "jamba"; }

std::unique_ptr<Model> load_jamba(const gguf::File& file) { return std::make_unique<Jamba>(file); }

}  // namespace reprise
