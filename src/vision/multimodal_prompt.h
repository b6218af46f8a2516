// A prompt of text and images laid out as the text model sees it: token ids
// (placeholders at image positions), per-position prefix-cache keys, and
// where each image's soft tokens go.
//
// Tokenization follows llama.cpp's mtmd so the ids match its reference: every
// text piece and every image marker is tokenized on its own (no BOS, special
// tokens parsed), one BOS goes at the very start, and each image becomes
// begin-marker + image tokens + end-marker (for gemma3 the markers are
// "<start_of_image>" / "<end_of_image>"; with a vocabulary lacking those
// special tokens they are ordinary text). Text before the first image is
// tokenized the same whether or not images follow, so adding an image later
// in a conversation keeps the earlier prefix (and its cached blocks).
//
// Cache keys: every image position carries the image's digest (its
// encoder-cache key), text positions carry none. Block hashes chain, so each
// cached block depends on every image before it: a changed image invalidates
// exactly the blocks from its first token on.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cache/cache_key.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "vision/clip_encoder.h"
#include "vision/encoder_cache.h"

namespace reprise {

// What clients put where an image goes in rendered text (llama.cpp's default).
inline constexpr std::string_view kMediaMarker = "<__media__>";

// Token id stored at image positions. The model reads the embedding instead;
// the id only keeps the token vector dense (the digest keys tell images apart).
inline constexpr int32_t kImagePlaceholderToken = 0;

struct ImageMarkers {
  std::string begin;  // text placed before each image's tokens
  std::string end;    // and after
  bool bidirectional = true;  // image tokens attend to each other both ways
};

// The markers and attention rule llama.cpp uses for the encoder's projector.
ImageMarkers image_markers_for(const VisionEncoderInfo& encoder);

// One piece of a prompt: text, or an image (exactly one of the two is set).
struct PromptPiece {
  std::string text;
  ImageEmbeddingPtr image;
  static PromptPiece of_text(std::string t) { return {std::move(t), nullptr}; }
  static PromptPiece of_image(ImageEmbeddingPtr e) { return {{}, std::move(e)}; }
};

// Splits rendered text at each `marker` and puts images[i] at the i-th one.
// Throws reprise::Error when the counts differ.
std::vector<PromptPiece> split_at_media_markers(std::string_view text, std::span<const ImageEmbeddingPtr> images,
                                                std::string_view marker = kMediaMarker);

struct PromptImage {
  int64_t begin = 0;  // first token position of the image's soft tokens
  int64_t end = 0;    // one past the last
  ImageEmbeddingPtr embedding;
};

struct MultimodalPrompt {
  std::vector<int32_t> tokens;
  std::vector<Hash128> keys;        // per position; zero on text
  std::vector<PromptImage> images;  // in position order, never overlapping
  bool bidirectional_images = true;

  // The image whose soft tokens cover `pos`, or null.
  const PromptImage* image_at(int64_t pos) const;
  // A batch over [begin, end): text only, or exactly one whole image
  // (embeddings and the bidirectional range set). Throws if the range
  // mixes text and image or cuts an image.
  ForwardBatch batch(int64_t begin, int64_t end, LogitsFor logits_for) const;
};

struct MultimodalPromptOptions {
  ImageMarkers markers;
  bool add_bos = true;        // when the vocabulary asks for one
  bool parse_special = true;  // special tokens written in the text are recognised
};

// Throws reprise::Error when an image's width is not `n_embd` (when n_embd > 0).
MultimodalPrompt build_multimodal_prompt(const Tokenizer& tokenizer, std::span<const PromptPiece> pieces,
                                         const MultimodalPromptOptions& options, int64_t n_embd = 0);

}  // namespace reprise
