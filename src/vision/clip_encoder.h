// The vision encoder of an mmproj GGUF (`clip` architecture): a SigLIP-style
// ViT followed by the gemma3 projector, producing the soft tokens the text
// model reads in place of token embeddings.
//
// ViT: patch embedding (a stride-patch convolution, done as a matmul over
// patch vectors), learned position embeddings, pre-norm blocks (layer norm,
// bidirectional multi-head attention, layer norm, GELU MLP), post layer norm.
// gemma3 projector: average pooling of the patch grid by the GGUF's scale
// factor, RMS norm with the soft-embedding weight, input projection into the
// text model's width. Weights may be any supported type (dtype_supported;
// the projection F32/F16/BF16: it is used transposed).
//
// Numerics follow llama.cpp's CPU graph: activations are rounded to the
// weight type for matmuls, attention is plain f32 (llama.cpp's non-flash
// path), GELU goes through f16 as ggml's table does. This random-weight test
// encoder amplifies any rounding difference to ~3e-3 mean / 2e-2 max on
// outputs of magnitude ~4, and that is how close it tracks the reference
// (docs/vision.md).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/matrix.h"
#include "tensor/thread_pool.h"
#include "vision/image_preprocess.h"

namespace reprise {

namespace gguf { class File; }

struct VisionEncoderInfo {
  std::string projector;        // "gemma3"
  int64_t image_size = 0;       // square input side, pixels
  int64_t patch_size = 0;
  int64_t patches_per_side = 0;
  int64_t n_embd = 0;           // ViT width
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_ff = 0;
  int64_t pool = 1;             // average-pooling kernel and stride (scale factor)
  int64_t n_tokens = 0;         // soft tokens per image
  int64_t n_embd_out = 0;       // text model width the projection targets
  float eps = 1e-6f;
  std::array<float, 3> mean{}, std{};
  // 128-bit hash of hyper-parameters, preprocessing and every tensor's
  // bytes: the encoder's execution identity for cache keys.
  std::array<uint64_t, 2> fingerprint{};
};

class ClipEncoder {
 public:
  // Validates the file (architecture, projector type, shapes, dtypes) and
  // throws reprise::Error naming what is wrong. The file must outlive this.
  explicit ClipEncoder(const gguf::File& file);
  ~ClipEncoder();
  ClipEncoder(const ClipEncoder&) = delete;
  ClipEncoder& operator=(const ClipEncoder&) = delete;

  const VisionEncoderInfo& info() const { return info_; }

  // How images must be resized and normalized for this encoder (what
  // llama.cpp's mtmd does for the projector type).
  const PreprocessParams& preprocess_params() const { return preprocess_; }

  // Encodes one preprocessed image (image_size x image_size, as
  // preprocess_image() makes it) into n_tokens x n_embd_out floats.
  //
  // `pool` is used one layer at a time under `pool_mutex` when given, so a
  // pool shared with text generation interleaves with it rather than being
  // entered twice (ThreadPool is not reentrant). Thread-safe otherwise: the
  // encoder holds no mutable state.
  std::vector<float> encode(const PreprocessedImage& image, ThreadPool& pool,
                            std::mutex* pool_mutex = nullptr) const;

 private:
  struct Layer;
  void run_layer(const Layer& L, std::vector<float>& x, ThreadPool& pool) const;

  VisionEncoderInfo info_;
  PreprocessParams preprocess_;
  PackedMatrix patch_embd_;           // [3 * patch * patch, n_embd]
  std::vector<float> patch_bias_;     // optional
  std::vector<float> position_embd_;  // n_patches * n_embd
  std::vector<float> pre_ln_w_, pre_ln_b_;    // optional
  std::vector<float> post_ln_w_, post_ln_b_;  // optional
  std::vector<Layer> layers_;
  std::vector<float> soft_emb_norm_;
  std::vector<uint8_t> projection_storage_;  // the input projection, transposed
  PackedMatrix projection_;           // [n_embd, n_embd_out] (packed from the transposed copy)
};

}  // namespace reprise
