// Vision benchmarks: what the encoder-output cache and image-aware prefix keys
// save in a multimodal agent session.
//
//   BM_ImageMiss   decode + preprocess + encode a new image (encoder-cache miss)
//   BM_ImageHit    the same image again (hit: decode + preprocess + key only)
//   BM_AgentReplay a scripted session: a long system prompt, text turns with
//                  a new image every third turn, every request resending the
//                  whole conversation with all its images (as a stateless
//                  chat API does). Counters: prefix reuse against the
//                  script's ideal, encoder runs against images sent, encoder
//                  time spent against time without the cache, TTFT.
//
// Models: REPRISE_VISION_MODEL and REPRISE_VISION_MMPROJ when set (e.g. the
// ../shared gemma3 pair), else synthetic ones (a gemma3 text model and a
// 64x64-input projector) written to a temp directory.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>

#include "cache/prefix_cache.h"
#include "engine/model_bundle.h"
#include "gguf/gguf_file.h"
#include "model/synthetic_model.h"
#include "util/scratch_dir.h"
#include "vision/clip_encoder.h"
#include "vision/encoder_cache.h"
#include "vision/image_embedder.h"
#include "vision/multimodal_generate.h"
#include "vision/multimodal_prompt.h"
#include "vision/synthetic_mmproj.h"

using namespace reprise;

namespace {

struct Pair {
  std::unique_ptr<ModelBundle> text;
  std::unique_ptr<gguf::File> mmproj;
  std::unique_ptr<ClipEncoder> encoder;
};

Pair& pair() {
  static Pair p = [] {
    Pair out;
    std::string text_path, mmproj_path;
    if (const char* t = std::getenv("REPRISE_VISION_MODEL")) text_path = t;
    if (const char* m = std::getenv("REPRISE_VISION_MMPROJ")) mmproj_path = m;
    if (text_path.empty() || mmproj_path.empty()) {
      const ScratchDir& dir = process_scratch_dir("reprise-vision-bench-");
      text_path = dir.file("gemma3.gguf");
      mmproj_path = dir.file("mmproj.gguf");
      make_synthetic_model(synthetic_preset("tiny-gemma3"), text_path);
      SyntheticMmprojSpec spec;
      spec.image_size = 64;
      spec.patch_size = 4;  // 256 patches
      spec.n_layer = 4;
      spec.n_ff = 512;
      make_synthetic_mmproj(spec, mmproj_path);
    }
    out.text = load_model_bundle(text_path);
    out.mmproj = gguf::File::open(mmproj_path);
    out.encoder = std::make_unique<ClipEncoder>(*out.mmproj);
    return out;
  }();
  return p;
}

// A distinct, deterministic picture per seed (as raw RGB: the decode cost is
// part of a hit, so hits and misses both start from pixels).
DecodedImage picture(uint32_t seed, int64_t w = 320, int64_t h = 240) {
  DecodedImage img;
  img.width = w;
  img.height = h;
  img.rgb.resize(w * h * 3);
  std::mt19937 rng(seed);
  for (auto& b : img.rgb) b = static_cast<uint8_t>(rng());
  return img;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_ImageMiss(benchmark::State& state) {
  Pair& p = pair();
  ThreadPool pool(static_cast<int>(state.range(0)));
  EncoderCache cache(256 << 20);
  ImageEmbedder embedder(*p.encoder, p.text->model->info(), &cache, pool);
  uint32_t seed = 0;
  for (auto _ : state) {
    state.PauseTiming();
    const DecodedImage img = picture(++seed);
    state.ResumeTiming();
    benchmark::DoNotOptimize(embedder.embed(img));
  }
  state.counters["encoder_runs"] = static_cast<double>(embedder.encoder_runs());
}
BENCHMARK(BM_ImageMiss)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ImageHit(benchmark::State& state) {
  Pair& p = pair();
  ThreadPool pool(static_cast<int>(state.range(0)));
  EncoderCache cache(256 << 20);
  ImageEmbedder embedder(*p.encoder, p.text->model->info(), &cache, pool);
  const DecodedImage img = picture(1);
  embedder.embed(img);
  for (auto _ : state) benchmark::DoNotOptimize(embedder.embed(img));
  state.counters["encoder_runs"] = static_cast<double>(embedder.encoder_runs());
}
BENCHMARK(BM_ImageHit)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// The encoder alone at a mid size (448x448 input, 14-pixel patches: 1024
// patches; width 768, 12 heads, FFN 3072, 4 layers, Q8_0), where a layer's
// activations and attention scores run to tens of megabytes.
void BM_EncodeMidSize(benchmark::State& state) {
  static const std::unique_ptr<gguf::File> file = [] {
    const std::string path = process_scratch_dir("reprise-vision-bench-").file("mid.gguf");
    SyntheticMmprojSpec spec;
    spec.image_size = 448;
    spec.patch_size = 14;
    spec.n_embd = 768;
    spec.n_layer = 4;
    spec.n_head = 12;
    spec.n_ff = 3072;
    spec.pool = 4;
    make_synthetic_mmproj(spec, path);
    return gguf::File::open(path);
  }();
  static const ClipEncoder encoder(*file);
  ThreadPool pool(static_cast<int>(state.range(0)));
  PreprocessedImage image;
  image.width = image.height = encoder.info().image_size;
  image.pixels.resize(static_cast<size_t>(image.width * image.height * 3));
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : image.pixels) v = dist(rng);
  for (auto _ : state) benchmark::DoNotOptimize(encoder.encode(image, pool));
}
BENCHMARK(BM_EncodeMidSize)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

// Reuse an ideal cache gets: the common prefix (tokens and image keys) with
// everything computed before, at most all but the last token, never ending
// inside an image.
int64_t ideal_reuse(const std::vector<int32_t>& computed, const std::vector<Hash128>& computed_keys,
                    const MultimodalPrompt& now) {
  const size_t n = std::min(computed.size(), now.tokens.size());
  size_t common = 0;
  auto key = [&](size_t i) { return now.keys.empty() ? Hash128{} : now.keys[i]; };
  while (common < n && computed[common] == now.tokens[common] && computed_keys[common] == key(common)) ++common;
  int64_t reuse = std::min<int64_t>(common, static_cast<int64_t>(now.tokens.size()) - 1);
  if (const PromptImage* img = now.image_at(reuse); img && img->begin < reuse) reuse = img->begin;
  return reuse;
}

void BM_AgentReplay(benchmark::State& state) {
  Pair& p = pair();
  const int turns = static_cast<int>(state.range(0));
  ThreadPool pool(2);
  for (auto _ : state) {
    EncoderCache encoder_cache(256 << 20);
    ImageEmbedder embedder(*p.encoder, p.text->model->info(), &encoder_cache, pool);
    PrefixCache prefix(p.text->model->state_spec(), PrefixCacheConfig{32, 512ull << 20});
    MultimodalGenerator gen(*p.text->model, pool, &prefix);
    MultimodalPromptOptions options;
    options.markers = image_markers_for(p.encoder->info());

    std::string system = "You are a field assistant. ";
    for (int i = 0; i < 40; ++i) system += "Report what each photo shows, note hazards, keep answers short. ";
    std::vector<PromptPiece> history = {PromptPiece::of_text(system)};
    std::vector<uint32_t> image_seeds;  // images in the conversation, in order
    std::vector<int32_t> computed;      // previous request's prompt + answer
    std::vector<Hash128> computed_keys;
    int64_t reused = 0, ideal = 0, prompt_tokens = 0, images_sent = 0;
    double ttft = 0, encode_wall = 0;
    std::printf("| turn | prompt | images | reused | ideal | encoder runs | TTFT (s) |\n");
    for (int turn = 0; turn < turns; ++turn) {
      if (turn % 3 == 0) image_seeds.push_back(1000 + turn);
      const auto t0 = std::chrono::steady_clock::now();
      // Stateless API: the request carries every image of the conversation.
      std::vector<ImageEmbeddingPtr> images;
      for (uint32_t seed : image_seeds) images.push_back(embedder.embed(picture(seed)));
      encode_wall += seconds_since(t0);
      images_sent += static_cast<int64_t>(images.size());
      std::vector<PromptPiece> pieces;
      size_t next_image = 0;
      for (const PromptPiece& piece : history) pieces.push_back(piece.image ? PromptPiece::of_image(images[next_image++]) : piece);
      if (turn % 3 == 0) {
        pieces.push_back(PromptPiece::of_image(images.back()));
        history.push_back(PromptPiece::of_image(images.back()));
      }
      const std::string user = "Turn " + std::to_string(turn) + ": anything new compared to before?";
      pieces.push_back(PromptPiece::of_text(user));
      history.push_back(PromptPiece::of_text(user));
      const MultimodalPrompt prompt = build_multimodal_prompt(*p.text->tokenizer, pieces, options);
      const int64_t want = turn == 0 ? 0 : ideal_reuse(computed, computed_keys, prompt);

      GenerateRequest req;
      req.sampling.temperature = 0;
      req.max_tokens = 16;
      const GenerateResult r = gen.generate(prompt, req);
      ttft += seconds_since(t0) - r.decode_seconds;
      reused += r.cached_tokens;
      ideal += want;
      prompt_tokens += static_cast<int64_t>(prompt.tokens.size());
      std::printf("| %4d | %6zu | %6zu | %6lld | %5lld | %12llu | %8.4f |\n", turn, prompt.tokens.size(), images.size(),
                  static_cast<long long>(r.cached_tokens), static_cast<long long>(want),
                  static_cast<unsigned long long>(embedder.encoder_runs()),
                  seconds_since(t0) - r.decode_seconds);
      computed = prompt.tokens;
      computed.insert(computed.end(), r.tokens.begin(), r.tokens.end());
      computed_keys = prompt.keys;
      computed_keys.resize(computed.size());
      history.push_back(PromptPiece::of_text(p.text->tokenizer->detokenize(r.tokens)));
    }
    const EncoderCacheStats s = encoder_cache.stats();
    const double per_miss = s.misses ? s.encode_seconds / s.misses : 0;
    state.counters["prompt_tokens"] = static_cast<double>(prompt_tokens);
    state.counters["reused_tokens"] = static_cast<double>(reused);
    state.counters["efficiency_vs_ideal"] = ideal ? static_cast<double>(reused) / ideal : 1.0;
    state.counters["images_sent"] = static_cast<double>(images_sent);
    state.counters["encoder_runs"] = static_cast<double>(embedder.encoder_runs());
    state.counters["encode_s"] = s.encode_seconds;
    state.counters["encode_s_without_cache"] = per_miss * images_sent;
    state.counters["encoder_time_saved_s"] = s.saved_seconds();
    state.counters["image_wall_s"] = encode_wall;
    state.counters["ttft_total_s"] = ttft;
    std::printf("efficiency %.3f of ideal (%lld/%lld reused); encoder ran %llu times for %lld images sent: "
                "%.3f s encoding instead of %.3f s\n",
                ideal ? static_cast<double>(reused) / ideal : 1.0, static_cast<long long>(reused),
                static_cast<long long>(ideal), static_cast<unsigned long long>(embedder.encoder_runs()),
                static_cast<long long>(images_sent), s.encode_seconds, per_miss * images_sent);
  }
}
BENCHMARK(BM_AgentReplay)->Arg(12)->Iterations(1)->Unit(benchmark::kSecond)->UseRealTime();

}  // namespace
