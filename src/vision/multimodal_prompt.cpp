#include "vision/multimodal_prompt.h"

#include <algorithm>

#include "util/error.h"

namespace reprise {

ImageMarkers image_markers_for(const VisionEncoderInfo& encoder) {
  if (encoder.projector == "gemma3") return {"<start_of_image>", "<end_of_image>", true};
  throw Error("no image markers known for projector '" + encoder.projector + "'");
}

std::vector<PromptPiece> split_at_media_markers(std::string_view text, std::span<const ImageEmbeddingPtr> images,
                                                std::string_view marker) {
  if (marker.empty()) throw Error("empty media marker");
  std::vector<PromptPiece> pieces;
  size_t next_image = 0, from = 0;
  for (;;) {
    const size_t at = text.find(marker, from);
    const std::string_view chunk = text.substr(from, at == std::string_view::npos ? std::string_view::npos : at - from);
    if (!chunk.empty()) pieces.push_back(PromptPiece::of_text(std::string(chunk)));
    if (at == std::string_view::npos) break;
    if (next_image >= images.size())
      throw Error("the prompt has more " + std::string(marker) + " markers than images (" +
                  std::to_string(images.size()) + ")");
    pieces.push_back(PromptPiece::of_image(images[next_image++]));
    from = at + marker.size();
  }
  if (next_image != images.size())
    throw Error("the prompt has " + std::to_string(next_image) + " " + std::string(marker) + " markers but " +
                std::to_string(images.size()) + " images");
  return pieces;
}

const PromptImage* MultimodalPrompt::image_at(int64_t pos) const {
  auto it = std::upper_bound(images.begin(), images.end(), pos,
                             [](int64_t p, const PromptImage& img) { return p < img.begin; });
  if (it == images.begin()) return nullptr;
  --it;
  return pos < it->end ? &*it : nullptr;
}

ForwardBatch MultimodalPrompt::batch(int64_t begin, int64_t end, LogitsFor logits_for) const {
  if (begin < 0 || end > static_cast<int64_t>(tokens.size()) || begin >= end) throw Error("batch out of range");
  ForwardBatch b;
  b.tokens = std::span<const int32_t>(tokens).subspan(begin, end - begin);
  b.pos0 = begin;
  b.logits_for = logits_for;
  const PromptImage* img = image_at(begin);
  if (img) {
    if (img->begin != begin || img->end != end) throw Error("a batch must hold exactly one whole image");
    b.embeddings = img->embedding->values.data();
    b.embd_begin = 0;
    b.embd_end = end - begin;
    if (bidirectional_images) {
      b.bidir_begin = 0;
      b.bidir_end = end - begin;
    }
    return b;
  }
  // Text only: no image may start inside the range.
  auto next = std::lower_bound(images.begin(), images.end(), begin,
                               [](const PromptImage& i, int64_t p) { return i.begin < p; });
  if (next != images.end() && next->begin < end) throw Error("a text batch may not contain image positions");
  return b;
}

MultimodalPrompt build_multimodal_prompt(const Tokenizer& tokenizer, std::span<const PromptPiece> pieces,
                                         const MultimodalPromptOptions& options, int64_t n_embd) {
  MultimodalPrompt out;
  out.bidirectional_images = options.markers.bidirectional;
  auto append_text = [&](std::string_view text) {
    if (text.empty()) return;
    const std::vector<int32_t> ids = tokenizer.encode(text, /*add_special=*/false, options.parse_special);
    out.tokens.insert(out.tokens.end(), ids.begin(), ids.end());
  };
  if (options.add_bos && tokenizer.add_bos() && tokenizer.bos_id() >= 0) out.tokens.push_back(tokenizer.bos_id());
  for (const PromptPiece& piece : pieces) {
    if (!piece.image) {
      append_text(piece.text);
      continue;
    }
    if (!piece.text.empty()) throw Error("a prompt piece is either text or an image");
    const ImageEmbedding& e = *piece.image;
    if (e.n_tokens <= 0 || e.values.size() != static_cast<size_t>(e.n_tokens * e.n_embd))
      throw Error("invalid image embedding");
    if (n_embd > 0 && e.n_embd != n_embd)
      throw Error("image embedding width " + std::to_string(e.n_embd) + " does not match the model's " +
                  std::to_string(n_embd));
    append_text(options.markers.begin);
    out.keys.resize(out.tokens.size());
    PromptImage img;
    img.begin = static_cast<int64_t>(out.tokens.size());
    img.end = img.begin + e.n_tokens;
    img.embedding = piece.image;
    out.tokens.insert(out.tokens.end(), e.n_tokens, kImagePlaceholderToken);
    out.keys.insert(out.keys.end(), e.n_tokens, e.digest);
    out.images.push_back(std::move(img));
    append_text(options.markers.end);
  }
  out.keys.resize(out.tokens.size());
  if (out.images.empty()) out.keys.clear();  // text only: no extra keys at all
  return out;
}

}  // namespace reprise
