// `reprise run --mmproj FILE --image FILE...`: prompts with images, kept out
// of run_command.cpp so the text path stays small. Each prompt may place the
// images with <__media__> markers; without markers they go before the text.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/prefix_cache.h"
#include "engine/model_bundle.h"
#include "engine/sampler.h"
#include "tensor/thread_pool.h"

namespace reprise::cli {

struct VisionRunOptions {
  std::string mmproj;
  std::vector<std::string> images;
  std::vector<std::string> prompts;
  int64_t n_predict = 64;
  SamplingParams sampling;
  std::string cache_salt;
  double mm_cache_mib = 256;  // encoder-output cache budget (0 disables)
  bool verbose = false;
};

// Streams each prompt's continuation to stdout; reports to stderr.
void run_with_images(ModelBundle& bundle, ThreadPool& pool, PrefixCache& cache, const VisionRunOptions& options);

}  // namespace reprise::cli
