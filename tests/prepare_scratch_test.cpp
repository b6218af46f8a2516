// Model::prepare_scratch sizes a pass's scratch ahead of the first long
// prompt (a server calls it for the model it loads at start-up). It must
// map what such a pass needs and change nothing a pass computes.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "engine/flat_memory.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "tensor/scratch_allocator.h"
#include "tensor/thread_pool.h"

using namespace reprise;

namespace {

std::vector<float> prompt_logits(Model& model, const std::vector<int32_t>& tokens, ThreadPool& pool) {
  FlatMemory memory(model.state_spec());
  ForwardBatch b;
  b.tokens = tokens;
  b.pos0 = 0;
  b.logits_for = LogitsFor::All;
  std::vector<float> logits;
  model.forward(b, memory, logits, pool);
  return logits;
}

std::vector<int32_t> random_tokens(const Model& model, size_t n) {
  std::mt19937 rng(11);
  std::vector<int32_t> tokens(n);
  for (auto& t : tokens) t = std::uniform_int_distribution<int32_t>(3, static_cast<int32_t>(model.info().n_vocab) - 1)(rng);
  return tokens;
}

// A transformer's scratch for 4096 rows is mapped at once (its activation
// arrays are megabytes there), and a prompt run after it gives the bits of
// one run on a pool that was not prepared.
TEST(PrepareScratch, TransformersMapTheirPassScratchAndComputeTheSame) {
  Model& model = *test::synthetic_model("prepare-scratch-tiny", synthetic_preset("tiny")).model;
  const std::vector<int32_t> tokens = random_tokens(model, 300);
  ThreadPool plain(2);
  const std::vector<float> expected = prompt_logits(model, tokens, plain);

  ThreadPool prepared(2);
  const int64_t before = scratch_mapped_bytes();
  model.prepare_scratch(4096, prepared);
  // At least the residual stream's two arrays: 4096 rows of n_embd floats.
  const int64_t row_bytes = model.info().n_embd * static_cast<int64_t>(sizeof(float));
  EXPECT_GE(scratch_mapped_bytes() - before, 2 * 4096 * row_bytes);
  const std::vector<float> got = prompt_logits(model, tokens, prepared);
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(0, std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)));
}

// Architectures without such scratch map nothing.
TEST(PrepareScratch, RecurrentModelsMapNothing) {
  Model& model = *test::synthetic_model("prepare-scratch-mamba", synthetic_preset("tiny-mamba")).model;
  ThreadPool pool(2);
  const int64_t before = scratch_mapped_bytes();
  model.prepare_scratch(4096, pool);
  EXPECT_EQ(scratch_mapped_bytes(), before);
}

}  // namespace
