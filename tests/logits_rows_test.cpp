// The last layer computes only the rows that produce logits (llama.cpp's
// inp_out_ids): asking for the last row's logits or for none must give the
// bits of asking for all, and leave the same K/V, for every transformer
// architecture, with and without a bidirectional span that covers the last
// rows (gemma3 image tokens).
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "engine/flat_memory.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "stored_key.h"
#include "test_support.h"

using namespace reprise;

namespace {

std::vector<float> run(Model& model, FlatMemory& memory, const std::vector<int32_t>& tokens, size_t begin,
                       size_t end, LogitsFor which, int64_t bidir_begin, int64_t bidir_end, ThreadPool& pool) {
  ForwardBatch b;
  b.tokens = std::span<const int32_t>(tokens.data() + begin, end - begin);
  b.pos0 = static_cast<int64_t>(begin);
  b.logits_for = which;
  b.bidir_begin = bidir_begin;
  b.bidir_end = bidir_end;
  std::vector<float> logits;
  model.forward(b, memory, logits, pool);
  return logits;
}

bool same_bits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, n * sizeof(float)) == 0; }

class LogitsRows : public ::testing::TestWithParam<std::string> {};

TEST_P(LogitsRows, LastAndNoneEqualAll) {
  Model& model = *test::synthetic_model("logits-rows-" + GetParam(), synthetic_preset(GetParam())).model;
  const StateSpec& spec = model.state_spec();
  const int64_t nv = model.info().n_vocab;
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(90);  // past 64 positions: both attention numerics
  for (auto& t : tokens) t = std::uniform_int_distribution<int32_t>(3, static_cast<int32_t>(nv) - 1)(rng);
  const size_t n = tokens.size();
  ThreadPool pool(2);
  for (const auto& [bb, be] : {std::pair<int64_t, int64_t>{0, 0}, {80, 90}}) {
    SCOPED_TRACE("bidirectional span [" + std::to_string(bb) + ", " + std::to_string(be) + ")");
    FlatMemory m_all(spec), m_last(spec), m_none(spec);
    const auto all = run(model, m_all, tokens, 0, n - 1, LogitsFor::All, bb, std::min<int64_t>(be, n - 1), pool);
    const auto last = run(model, m_last, tokens, 0, n - 1, LogitsFor::Last, bb, std::min<int64_t>(be, n - 1), pool);
    const auto none = run(model, m_none, tokens, 0, n - 1, LogitsFor::None, bb, std::min<int64_t>(be, n - 1), pool);
    ASSERT_EQ(all.size(), (n - 1) * nv);
    ASSERT_EQ(last.size(), static_cast<size_t>(nv));
    EXPECT_TRUE(none.empty());
    EXPECT_TRUE(same_bits(last.data(), all.data() + (n - 2) * nv, nv)) << "last row differs from All's";
    // The same K/V: every layer, every position.
    for (size_t l = 0; l < spec.layers.size(); ++l) {
      const LayerStateSpec& s = spec.layers[l];
      if (s.kind != LayerStateKind::Attention) continue;
      const int il = static_cast<int>(l);
      auto key = [&](FlatMemory& m, int64_t p, int64_t j) { return test::stored_key(m, il, p, j, s.head_dim_k); };
      auto value = [&](FlatMemory& m, int64_t p, int64_t j) { return m.value(il, p) + j * m.kv_head_stride(il); };
      for (int64_t p = 0; p < static_cast<int64_t>(n) - 1; ++p)
        for (int64_t j = 0; j < s.n_kv_heads; ++j) {
          ASSERT_EQ(key(m_all, p, j), key(m_none, p, j)) << l << "/" << p;
          ASSERT_EQ(0, std::memcmp(value(m_all, p, j), value(m_none, p, j), s.head_dim_v * 2)) << l << "/" << p;
          ASSERT_EQ(key(m_all, p, j), key(m_last, p, j)) << l << "/" << p;
        }
    }
    // And the same next step from each.
    const auto next_all = run(model, m_all, tokens, n - 1, n, LogitsFor::Last, 0, 0, pool);
    const auto next_none = run(model, m_none, tokens, n - 1, n, LogitsFor::Last, 0, 0, pool);
    EXPECT_TRUE(same_bits(next_all.data(), next_none.data(), nv));
  }
}

INSTANTIATE_TEST_SUITE_P(Transformers, LogitsRows, ::testing::Values("tiny", "tiny-qwen2", "tiny-qwen3", "tiny-gemma3"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
