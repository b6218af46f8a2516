#include "vision/clip_encoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gguf/gguf_file.h"
#include "model/for_tokens.h"
#include "model/weights.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "util/error.h"

namespace reprise {

struct ClipEncoder::Layer {
  std::vector<float> ln1_w, ln1_b, ln2_w, ln2_b;
  // Packed once at load, as the language models do (an unpacked view would
  // be repacked on every product).
  PackedMatrix wq, wk, wv, wo, up, down;
  std::vector<float> bq, bk, bv, bo, b_up, b_down;
};

namespace {

// ggml evaluates GELU through a table indexed by the f16 input holding f16
// outputs (saturating outside [-10, 10]); the same table here removes one
// source of rounding difference and is faster than tanh per element.
float gelu_like_ggml(float x) {
  static const std::vector<uint16_t> table = [] {
    std::vector<uint16_t> t(1 << 16);
    for (uint32_t i = 0; i < t.size(); ++i) t[i] = f32_to_f16(gelu_tanh(f16_to_f32(static_cast<uint16_t>(i))));
    return t;
  }();
  if (x <= -10.0f) return 0.0f;
  if (x >= 10.0f) return x;
  return f16_to_f32(table[f32_to_f16(x)]);
}

// row[i] += b[i] (nothing when the layer has no bias).
void add_bias_row(float* row, const std::vector<float>& b) {
  for (size_t i = 0; i < b.size(); ++i) row[i] += b[i];
}

void add_bias(std::vector<float>& m, const std::vector<float>& b, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) add_bias_row(m.data() + r * static_cast<int64_t>(b.size()), b);
}

}  // namespace

ClipEncoder::~ClipEncoder() = default;

ClipEncoder::ClipEncoder(const gguf::File& file) {
  const std::string arch = file.get_string("general.architecture").value_or("");
  if (arch != "clip") file.fail("not a vision projector (general.architecture is '" + arch + "', expected 'clip')");
  if (!file.get_bool("clip.has_vision_encoder").value_or(false)) file.fail("the projector has no vision encoder");
  info_.projector = file.get_string("clip.projector_type").value_or("");
  if (info_.projector.empty()) info_.projector = file.get_string("clip.vision.projector_type").value_or("");
  if (info_.projector != "gemma3")
    file.fail("projector type '" + info_.projector + "' is not supported (supported: gemma3)");

  auto req = [&](const char* key) {
    const int64_t v = file.require_int(key);
    if (v <= 0 || v > (1 << 20)) file.fail(std::string("metadata ") + key + " out of range");
    return v;
  };
  info_.image_size = req("clip.vision.image_size");
  info_.patch_size = req("clip.vision.patch_size");
  info_.n_embd = req("clip.vision.embedding_length");
  info_.n_layer = req("clip.vision.block_count");
  info_.n_head = req("clip.vision.attention.head_count");
  info_.n_ff = req("clip.vision.feed_forward_length");
  info_.eps = static_cast<float>(file.get_float("clip.vision.attention.layer_norm_epsilon").value_or(1e-6));
  info_.pool = file.get_int("clip.vision.projector.scale_factor").value_or(4);  // llama.cpp's gemma3 default
  if (!file.get_bool("clip.use_gelu").value_or(false) || file.get_bool("clip.use_silu").value_or(false))
    file.fail("only GELU vision encoders are supported (clip.use_gelu)");
  if (info_.image_size % info_.patch_size != 0) file.fail("image_size is not a multiple of patch_size");
  info_.patches_per_side = info_.image_size / info_.patch_size;
  if (info_.pool <= 0 || info_.patches_per_side % info_.pool != 0)
    file.fail("projector scale factor " + std::to_string(info_.pool) + " does not divide the " +
              std::to_string(info_.patches_per_side) + "-patch grid");
  if (info_.n_embd % info_.n_head != 0) file.fail("embedding width is not a multiple of the head count");
  const int64_t side_out = info_.patches_per_side / info_.pool;
  info_.n_tokens = side_out * side_out;

  auto read3 = [&](const char* key, std::array<float, 3>& out) {
    const gguf::Value* v = file.find(key);
    if (!v) file.fail(std::string("missing metadata key ") + key);
    std::vector<float> a = v->float_array(key);
    if (a.size() < 3) file.fail(std::string(key) + " has fewer than 3 values");
    for (int i = 0; i < 3; ++i) {
      if (!std::isfinite(a[i])) file.fail(std::string(key) + " is not finite");
      out[i] = a[i];
    }
  };
  read3("clip.vision.image_mean", info_.mean);
  read3("clip.vision.image_std", info_.std);
  for (float s : info_.std)
    if (s == 0.0f) file.fail("clip.vision.image_std has a zero");

  // gemma3 in llama.cpp: fixed-size bilinear resize, letterboxed on black.
  preprocess_.width = preprocess_.height = info_.image_size;
  preprocess_.filter = ResizeFilter::Bilinear;
  preprocess_.letterbox = true;
  preprocess_.mean = info_.mean;
  preprocess_.std = info_.std;

  WeightLoader w(file);
  const int64_t D = info_.n_embd, P = info_.patch_size;
  const int64_t n_patches = info_.patches_per_side * info_.patches_per_side;
  {
    // The conv kernel [P, P, 3, D] flattens to rows of (channel, ky, kx),
    // the order patch vectors are gathered in below.
    const gguf::TensorInfo& t = w.tensor("v.patch_embd.weight");
    if (t.shape.size() != 4 || t.shape[0] != static_cast<uint64_t>(P) || t.shape[1] != static_cast<uint64_t>(P) ||
        t.shape[2] != 3 || t.shape[3] != static_cast<uint64_t>(D))
      file.fail("tensor 'v.patch_embd.weight' has an unexpected shape");
    if (!dtype_supported(t.type)) file.fail("tensor 'v.patch_embd.weight' has an unsupported type");
    if ((3 * P * P) % static_cast<int64_t>(dtype_info(t.raw_type)->block_elems) != 0)
      file.fail("tensor 'v.patch_embd.weight' rows do not fill whole blocks");
    patch_embd_ = PackedMatrix(MatrixView{t.type, t.data, 3 * P * P, D, dtype_row_bytes(t.type, 3 * P * P)});
  }
  patch_bias_ = w.optional_vector("v.patch_embd.bias", D);
  position_embd_ = w.dense("v.position_embd.weight", {D, n_patches});
  pre_ln_w_ = w.optional_vector("v.pre_ln.weight", D);
  pre_ln_b_ = w.optional_vector("v.pre_ln.bias", D);
  post_ln_w_ = w.optional_vector("v.post_ln.weight", D);
  post_ln_b_ = w.optional_vector("v.post_ln.bias", D);
  for (int64_t il = 0; il < info_.n_layer; ++il) {
    const std::string p = "v.blk." + std::to_string(il) + ".";
    Layer L;
    L.ln1_w = w.vector(p + "ln1.weight", D);
    L.ln1_b = w.optional_vector(p + "ln1.bias", D);
    L.ln2_w = w.vector(p + "ln2.weight", D);
    L.ln2_b = w.optional_vector(p + "ln2.bias", D);
    L.wq = PackedMatrix(w.matrix(p + "attn_q.weight", D, D));
    L.wk = PackedMatrix(w.matrix(p + "attn_k.weight", D, D));
    L.wv = PackedMatrix(w.matrix(p + "attn_v.weight", D, D));
    L.wo = PackedMatrix(w.matrix(p + "attn_out.weight", D, D));
    L.bq = w.optional_vector(p + "attn_q.bias", D);
    L.bk = w.optional_vector(p + "attn_k.bias", D);
    L.bv = w.optional_vector(p + "attn_v.bias", D);
    L.bo = w.optional_vector(p + "attn_out.bias", D);
    L.up = PackedMatrix(w.matrix(p + "ffn_up.weight", D, info_.n_ff));
    L.down = PackedMatrix(w.matrix(p + "ffn_down.weight", info_.n_ff, D));
    L.b_up = w.optional_vector(p + "ffn_up.bias", info_.n_ff);
    L.b_down = w.optional_vector(p + "ffn_down.bias", D);
    if (w.has(p + "ffn_gate.weight")) file.fail("gated vision MLPs are not supported");
    layers_.push_back(std::move(L));
  }
  soft_emb_norm_ = w.vector("mm.soft_emb_norm.weight", D);
  {
    // Stored [n_embd_out, D] (ggml order); llama.cpp multiplies by its
    // transpose, so keep a transposed copy in the same dtype.
    const gguf::TensorInfo& t = w.tensor("mm.input_projection.weight");
    if (t.shape.size() != 2 || t.shape[1] != static_cast<uint64_t>(D) || t.shape[0] == 0 || t.shape[0] > (1u << 20))
      file.fail("tensor 'mm.input_projection.weight' has an unexpected shape");
    if (t.type != DType::F32 && t.type != DType::F16 && t.type != DType::BF16)
      file.fail("tensor 'mm.input_projection.weight' must be F32, F16 or BF16 (it is used transposed)");
    info_.n_embd_out = static_cast<int64_t>(t.shape[0]);
    const size_t elem = t.type == DType::F32 ? 4 : 2;
    const int64_t out = info_.n_embd_out;
    projection_storage_.resize(static_cast<size_t>(out * D) * elem);
    for (int64_t r = 0; r < D; ++r)      // source row: one ViT feature
      for (int64_t c = 0; c < out; ++c)  // source column: one output feature
        std::memcpy(projection_storage_.data() + (c * D + r) * elem, t.data + (r * out + c) * elem, elem);
    projection_ = PackedMatrix(MatrixView{t.type, projection_storage_.data(), D, out, static_cast<size_t>(D) * elem});
  }

  const std::string layout = "clip/v1/" + info_.projector + "/" + std::to_string(info_.image_size) + "/" +
                             std::to_string(P) + "/" + std::to_string(D) + "/" + std::to_string(info_.n_layer) +
                             "/" + std::to_string(info_.n_head) + "/" + std::to_string(info_.n_ff) + "/" +
                             std::to_string(info_.pool) + "/" + std::to_string(info_.eps) + "/" +
                             preprocess_.describe();
  w.refuse_unknown_tensors();
  info_.fingerprint = fingerprint_weights(file, layout);
}

namespace {
// A layer's scratch, once per pool (ThreadPool::caller_local; run_layer
// holds the pool): fresh vectors per layer, the scores alone n^2 floats,
// were mapped and faulted in anew for every layer of every image. Every
// element is written before it is read.
struct LayerScratch {
  std::vector<float> h, q, k, v, attn, tmp, qh, vt, scores, oh, u;
};
}  // namespace

void ClipEncoder::run_layer(const Layer& L, std::vector<float>& x, ThreadPool& pool) const {
  const int64_t D = info_.n_embd, H = info_.n_head, hd = D / H;
  const int64_t n = info_.patches_per_side * info_.patches_per_side;
  auto& [h, q, k, v, attn, tmp, qh, vt, scores, oh, u] = pool.caller_local<LayerScratch>();
  for (std::vector<float>* b : {&h, &q, &k, &v, &attn, &tmp}) b->resize(n * D);
  for_tokens(n, pool, [&](int64_t t) {
    layer_norm(x.data() + t * D, L.ln1_w.data(), L.ln1_b.empty() ? nullptr : L.ln1_b.data(), info_.eps, D,
               h.data() + t * D);
  });
  matmul(L.wq, h.data(), n, q.data(), pool);
  matmul(L.wk, h.data(), n, k.data(), pool);
  matmul(L.wv, h.data(), n, v.data(), pool);
  for_tokens(n, pool, [&](int64_t t) {
    add_bias_row(q.data() + t * D, L.bq);
    add_bias_row(k.data() + t * D, L.bk);
    add_bias_row(v.data() + t * D, L.bv);
  });

  // Every patch attends to every patch (no mask), in f32 as llama.cpp's
  // non-flash path computes it: per head, scores = Q K^T scaled, a softmax
  // per query, then out = scores V. Both products run as f32 matmuls.
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (std::vector<float>* b : {&qh, &vt, &oh}) b->resize(n * hd);
  scores.resize(n * n);
  for (int64_t head = 0; head < H; ++head) {
    for_tokens(n, pool, [&](int64_t t) {
      std::memcpy(&qh[t * hd], &q[t * D + head * hd], hd * sizeof(float));
      for (int64_t d = 0; d < hd; ++d) vt[d * n + t] = v[t * D + head * hd + d];
    });
    const MatrixView keys{DType::F32, reinterpret_cast<const uint8_t*>(k.data() + head * hd), hd, n,
                          static_cast<size_t>(D) * sizeof(float)};
    const MatrixView values{DType::F32, reinterpret_cast<const uint8_t*>(vt.data()), n, hd,
                            static_cast<size_t>(n) * sizeof(float)};
    matmul(keys, qh.data(), n, scores.data(), pool);
    pool.parallel_for(n, [&](int64_t t) {
      float* row = scores.data() + t * n;
      for (int64_t p = 0; p < n; ++p) row[p] *= scale;
      softmax_inplace(row, n);
    });
    matmul(values, scores.data(), n, oh.data(), pool);
    for_tokens(n, pool, [&](int64_t t) { std::memcpy(&attn[t * D + head * hd], &oh[t * hd], hd * sizeof(float)); });
  }
  matmul(L.wo, attn.data(), n, tmp.data(), pool);
  for_tokens(n, pool, [&](int64_t t) {
    float* xt = x.data() + t * D;
    float* tt = tmp.data() + t * D;
    add_bias_row(tt, L.bo);
    for (int64_t i = 0; i < D; ++i) xt[i] += tt[i];
    layer_norm(xt, L.ln2_w.data(), L.ln2_b.empty() ? nullptr : L.ln2_b.data(), info_.eps, D, h.data() + t * D);
  });
  const int64_t F = info_.n_ff;
  u.resize(n * F);
  matmul(L.up, h.data(), n, u.data(), pool);
  for_tokens(n, pool, [&](int64_t t) {
    float* ut = u.data() + t * F;
    add_bias_row(ut, L.b_up);
    for (int64_t i = 0; i < F; ++i) ut[i] = gelu_like_ggml(ut[i]);
  });
  matmul(L.down, u.data(), n, tmp.data(), pool);
  for_tokens(n, pool, [&](int64_t t) {
    float* xt = x.data() + t * D;
    float* tt = tmp.data() + t * D;
    add_bias_row(tt, L.b_down);
    for (int64_t i = 0; i < D; ++i) xt[i] += tt[i];
  });
}

std::vector<float> ClipEncoder::encode(const PreprocessedImage& image, ThreadPool& pool,
                                       std::mutex* pool_mutex) const {
  const int64_t S = info_.image_size, P = info_.patch_size, side = info_.patches_per_side;
  const int64_t D = info_.n_embd, n = side * side;
  if (image.width != S || image.height != S || image.pixels.size() != static_cast<size_t>(S * S * 3))
    throw Error("image is " + std::to_string(image.width) + "x" + std::to_string(image.height) +
                " but the encoder takes " + std::to_string(S) + "x" + std::to_string(S) + " preprocessed pixels");
  auto locked = [&](auto&& fn) {
    if (pool_mutex) {
      std::lock_guard<std::mutex> lock(*pool_mutex);
      fn();
    } else {
      fn();
    }
  };

  // Patch vectors (channel, ky, kx) -> patch embeddings + position embeddings.
  std::vector<float> patches(n * 3 * P * P), x(n * D);
  for (int64_t py = 0; py < side; ++py)
    for (int64_t px = 0; px < side; ++px) {
      float* dst = patches.data() + (py * side + px) * 3 * P * P;
      for (int c = 0; c < 3; ++c)
        for (int64_t ky = 0; ky < P; ++ky)
          for (int64_t kx = 0; kx < P; ++kx)
            dst[(c * P + ky) * P + kx] = image.pixels[((py * P + ky) * S + (px * P + kx)) * 3 + c];
    }
  locked([&] { matmul(patch_embd_, patches.data(), n, x.data(), pool); });
  add_bias(x, patch_bias_, n);
  for (int64_t i = 0; i < n * D; ++i) x[i] += position_embd_[i];
  if (!pre_ln_w_.empty())
    for (int64_t t = 0; t < n; ++t)
      layer_norm(x.data() + t * D, pre_ln_w_.data(), pre_ln_b_.empty() ? nullptr : pre_ln_b_.data(), info_.eps,
                 D, x.data() + t * D);

  for (const Layer& L : layers_) locked([&] { run_layer(L, x, pool); });

  if (!post_ln_w_.empty())
    for (int64_t t = 0; t < n; ++t)
      layer_norm(x.data() + t * D, post_ln_w_.data(), post_ln_b_.empty() ? nullptr : post_ln_b_.data(), info_.eps,
                 D, x.data() + t * D);

  // Average pooling over k x k patches (row-major output grid), then the
  // soft-embedding RMS norm.
  const int64_t k = info_.pool, side_out = side / k, n_out = info_.n_tokens;
  std::vector<float> pooled(n_out * D);
  for (int64_t oy = 0; oy < side_out; ++oy)
    for (int64_t ox = 0; ox < side_out; ++ox) {
      float* dst = pooled.data() + (oy * side_out + ox) * D;
      for (int64_t d = 0; d < D; ++d) {
        float acc = 0;
        for (int64_t ky = 0; ky < k; ++ky)
          for (int64_t kx = 0; kx < k; ++kx) acc += x[((oy * k + ky) * side + (ox * k + kx)) * D + d];
        dst[d] = acc / static_cast<float>(k * k);
      }
    }
  for (int64_t t = 0; t < n_out; ++t)
    rms_norm(pooled.data() + t * D, soft_emb_norm_.data(), info_.eps, D, pooled.data() + t * D);
  std::vector<float> out(n_out * info_.n_embd_out);
  locked([&] { matmul(projection_, pooled.data(), n_out, out.data(), pool); });
  return out;
}

}  // namespace reprise
