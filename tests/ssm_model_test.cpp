// mamba, mamba2 and jamba without the oracle: the invariants the cache relies
// on (batch-split invariance, state round trips, no hidden state in the
// model), the declared state layout, the synthetic presets, and clear errors
// for malformed metadata.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "engine/flat_memory.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model_fixtures.h"
#include "test_support.h"
#include "util/error.h"

using namespace reprise;

namespace {

const char* const kPresets[] = {"tiny-mamba", "tiny-mamba2", "tiny-jamba"};

Model& preset_model(const std::string& preset) {
  return *test::synthetic_model("ssm-" + preset, synthetic_preset(preset)).model;
}

std::vector<int32_t> random_tokens(size_t n, int64_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(3, static_cast<int32_t>(n_vocab - 1));
  std::vector<int32_t> t(n);
  for (auto& x : t) x = dist(rng);
  return t;
}

// Runs tokens[begin, end) as one batch at position `begin`.
std::vector<float> run(Model& model, SequenceMemory& memory, const std::vector<int32_t>& tokens, size_t begin,
                       size_t end, ThreadPool& pool, LogitsFor which = LogitsFor::All) {
  ForwardBatch b;
  b.tokens = std::span<const int32_t>(tokens.data() + begin, end - begin);
  b.pos0 = static_cast<int64_t>(begin);
  b.logits_for = which;
  std::vector<float> logits;
  model.forward(b, memory, logits, pool);
  return logits;
}

bool same_bits(const void* a, const void* b, size_t bytes) { return std::memcmp(a, b, bytes) == 0; }

// Everything the model left in memory for positions [0, n): recurrent buffers
// and attention rows, compared bit for bit.
void expect_same_state(const StateSpec& spec, FlatMemory& a, FlatMemory& b, int64_t n) {
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerStateSpec& s = spec.layers[l];
    const int il = static_cast<int>(l);
    if (s.kind == LayerStateKind::Recurrent) {
      EXPECT_TRUE(same_bits(a.conv_state(il), b.conv_state(il), s.conv_state_floats * sizeof(float)))
          << "conv state of layer " << l;
      EXPECT_TRUE(same_bits(a.ssm_state(il), b.ssm_state(il), s.ssm_state_floats * sizeof(float)))
          << "ssm state of layer " << l;
    } else if (s.kind == LayerStateKind::Attention) {
      for (int64_t p = 0; p < n; ++p) {
        EXPECT_TRUE(same_bits(a.key(il, p), b.key(il, p), s.key_floats() * 2)) << "key " << l << "/" << p;
        EXPECT_TRUE(same_bits(a.value(il, p), b.value(il, p), s.value_floats() * 2)) << "value " << l << "/" << p;
      }
    }
  }
}

// Copies the state after n positions from `from` into a fresh memory `to`.
void copy_state(const StateSpec& spec, FlatMemory& from, FlatMemory& to, int64_t n) {
  to.prepare(0, n);
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const LayerStateSpec& s = spec.layers[l];
    const int il = static_cast<int>(l);
    if (s.kind == LayerStateKind::Recurrent) {
      std::memcpy(to.conv_state(il), from.conv_state(il), s.conv_state_floats * sizeof(float));
      std::memcpy(to.ssm_state(il), from.ssm_state(il), s.ssm_state_floats * sizeof(float));
    } else if (s.kind == LayerStateKind::Attention) {
      for (int64_t p = 0; p < n; ++p) {
        std::memcpy(to.key(il, p), from.key(il, p), s.key_floats() * 2);
        std::memcpy(to.value(il, p), from.value(il, p), s.value_floats() * 2);
      }
    }
  }
}

class SsmPresetTest : public ::testing::TestWithParam<const char*> {};

// One batch of 48 == the same 48 tokens in irregular chunks (1 token, a few,
// many), on 1 or 2 threads: logits and all state bit-identical.
TEST_P(SsmPresetTest, BatchSplitInvariance) {
  Model& model = preset_model(GetParam());
  const auto& spec = model.state_spec();
  const int64_t nv = model.info().n_vocab;
  const std::vector<int32_t> tokens = random_tokens(48, nv, 7);
  ThreadPool pool2(2), pool1(1);

  FlatMemory whole(spec);
  const std::vector<float> want = run(model, whole, tokens, 0, tokens.size(), pool2);
  ASSERT_EQ(want.size(), tokens.size() * nv);

  const std::vector<std::vector<size_t>> splits = {
      {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
       28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47},
      {3, 10, 11, 30, 47},
      {17},
      {2, 33}};
  for (size_t si = 0; si < splits.size(); ++si) {
    for (ThreadPool* pool : {&pool1, &pool2}) {
      SCOPED_TRACE("split " + std::to_string(si) + ", threads " + std::to_string(pool->size()));
      FlatMemory mem(spec);
      std::vector<float> got;
      size_t begin = 0;
      std::vector<size_t> cuts = splits[si];
      cuts.push_back(tokens.size());
      for (size_t cut : cuts) {
        std::vector<float> part = run(model, mem, tokens, begin, cut, *pool);
        got.insert(got.end(), part.begin(), part.end());
        begin = cut;
      }
      ASSERT_EQ(got.size(), want.size());
      EXPECT_TRUE(same_bits(got.data(), want.data(), want.size() * sizeof(float))) << "logits differ";
      expect_same_state(spec, whole, mem, static_cast<int64_t>(tokens.size()));
    }
  }
}

// The state after k tokens, copied into a fresh memory (what a cache snapshot
// restore does), continues exactly like the uninterrupted sequence.
TEST_P(SsmPresetTest, StateRoundTrip) {
  Model& model = preset_model(GetParam());
  const auto& spec = model.state_spec();
  const int64_t nv = model.info().n_vocab;
  const std::vector<int32_t> tokens = random_tokens(40, nv, 11);
  ThreadPool pool(2);
  for (size_t k : {1u, 5u, 16u, 39u}) {
    SCOPED_TRACE("k = " + std::to_string(k));
    FlatMemory straight(spec), first(spec), restored(spec);
    run(model, straight, tokens, 0, k, pool);
    const std::vector<float> want = run(model, straight, tokens, k, tokens.size(), pool);

    run(model, first, tokens, 0, k, pool, LogitsFor::None);
    copy_state(spec, first, restored, static_cast<int64_t>(k));
    // Scribble on the original afterwards: the copy must not depend on it.
    first.clear();
    const std::vector<float> got = run(model, restored, tokens, k, tokens.size(), pool);
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(same_bits(got.data(), want.data(), want.size() * sizeof(float)));
    expect_same_state(spec, straight, restored, static_cast<int64_t>(tokens.size()));
  }
}

// The model holds no per-sequence state of its own: two sequences interleaved
// on one model instance give what each gives alone.
TEST_P(SsmPresetTest, NoHiddenStateBetweenSequences) {
  Model& model = preset_model(GetParam());
  const auto& spec = model.state_spec();
  const int64_t nv = model.info().n_vocab;
  const std::vector<int32_t> a = random_tokens(20, nv, 1), b = random_tokens(20, nv, 2);
  ThreadPool pool(2);
  FlatMemory alone_a(spec), alone_b(spec);
  const std::vector<float> want_a = run(model, alone_a, a, 0, a.size(), pool);
  const std::vector<float> want_b = run(model, alone_b, b, 0, b.size(), pool);

  FlatMemory ma(spec), mb(spec);
  std::vector<float> got_a, got_b;
  for (size_t t = 0; t < a.size(); t += 4) {
    std::vector<float> pa = run(model, ma, a, t, t + 4, pool);
    std::vector<float> pb = run(model, mb, b, t, t + 4, pool);
    got_a.insert(got_a.end(), pa.begin(), pa.end());
    got_b.insert(got_b.end(), pb.begin(), pb.end());
  }
  EXPECT_TRUE(same_bits(got_a.data(), want_a.data(), want_a.size() * sizeof(float)));
  EXPECT_TRUE(same_bits(got_b.data(), want_b.data(), want_b.size() * sizeof(float)));
}

// LogitsFor::Last is the last row of All; None returns no logits but leaves
// the same state.
TEST_P(SsmPresetTest, LogitsForModes) {
  Model& model = preset_model(GetParam());
  const auto& spec = model.state_spec();
  const int64_t nv = model.info().n_vocab;
  const std::vector<int32_t> tokens = random_tokens(9, nv, 3);
  ThreadPool pool(2);
  FlatMemory m_all(spec), m_last(spec), m_none(spec);
  const std::vector<float> all = run(model, m_all, tokens, 0, tokens.size(), pool, LogitsFor::All);
  const std::vector<float> last = run(model, m_last, tokens, 0, tokens.size(), pool, LogitsFor::Last);
  const std::vector<float> none = run(model, m_none, tokens, 0, tokens.size(), pool, LogitsFor::None);
  ASSERT_EQ(all.size(), tokens.size() * nv);
  ASSERT_EQ(last.size(), static_cast<size_t>(nv));
  EXPECT_TRUE(none.empty());
  EXPECT_TRUE(same_bits(last.data(), all.data() + (tokens.size() - 1) * nv, nv * sizeof(float)));
  for (float v : all) ASSERT_TRUE(std::isfinite(v));
  expect_same_state(spec, m_all, m_last, static_cast<int64_t>(tokens.size()));
  expect_same_state(spec, m_all, m_none, static_cast<int64_t>(tokens.size()));
}

INSTANTIATE_TEST_SUITE_P(Presets, SsmPresetTest, ::testing::ValuesIn(kPresets), [](const auto& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
});

// ------------------------------------------------------------ state layout

TEST(SsmStateSpec, DeclaresLlamaCppStateSizes) {
  {
    const StateSpec& s = preset_model("tiny-mamba").state_spec();  // d_inner 128, d_state 16, conv 4
    ASSERT_EQ(s.layers.size(), 3u);
    for (const auto& l : s.layers) {
      EXPECT_EQ(l.kind, LayerStateKind::Recurrent);
      EXPECT_EQ(l.conv_state_floats, 3 * 128);
      EXPECT_EQ(l.ssm_state_floats, 16 * 128);
    }
    EXPECT_FALSE(s.has_attention());
    EXPECT_EQ(s.kv_floats_per_token(), 0);
  }
  {
    // Mamba-2 convolves x, B and C: d_inner + 2 * n_group * d_state channels.
    const StateSpec& s = preset_model("tiny-mamba2").state_spec();
    ASSERT_EQ(s.layers.size(), 2u);
    for (const auto& l : s.layers) {
      EXPECT_EQ(l.kind, LayerStateKind::Recurrent);
      EXPECT_EQ(l.conv_state_floats, 3 * (128 + 2 * 16));
      EXPECT_EQ(l.ssm_state_floats, 16 * 128);
    }
  }
  {
    const StateSpec& s = preset_model("tiny-jamba").state_spec();  // M A M M
    ASSERT_EQ(s.layers.size(), 4u);
    for (int l : {0, 2, 3}) {
      EXPECT_EQ(s.layers[l].kind, LayerStateKind::Recurrent);
      EXPECT_EQ(s.layers[l].conv_state_floats, 3 * 128);
      EXPECT_EQ(s.layers[l].ssm_state_floats, 16 * 128);
    }
    EXPECT_EQ(s.layers[1].kind, LayerStateKind::Attention);
    EXPECT_EQ(s.layers[1].n_kv_heads, 2);
    EXPECT_EQ(s.layers[1].head_dim_k, 16);
    EXPECT_EQ(s.layers[1].head_dim_v, 16);
    EXPECT_EQ(s.layers[1].window, 0);
    EXPECT_EQ(s.kv_floats_per_token(), 2 * 2 * 16);
    EXPECT_EQ(s.recurrent_floats(), 3 * (3 * 128 + 16 * 128));
  }
}

TEST(SsmStateSpec, FixturesDeclareTheirState) {
  REPRISE_REQUIRE_SHARED(fixtures);
  for (const char* name : {"mamba-spm-f16", "mamba2-spm-f16", "jamba-spm-f16"}) {
    SCOPED_TRACE(name);
    auto file = gguf::File::open(fixtures + "/models/" + name + ".gguf");
    auto model = load_model(*file);
    EXPECT_TRUE(model->state_spec().has_recurrent());
    EXPECT_EQ(model->state_spec().has_attention(), std::string(name) == "jamba-spm-f16");
    EXPECT_EQ(model->info().n_vocab, 32000);
  }
}

// ------------------------------------------------------------ presets

TEST(SsmPresets, LoadAndRunInEveryWeightType) {
  ThreadPool pool(2);
  for (const char* preset : {"tiny-mamba", "tiny-mamba2", "tiny-jamba", "jamba-small"}) {
    for (DType dt : {DType::F16, DType::F32, DType::Q8_0, DType::Q4_0}) {
      SCOPED_TRACE(std::string(preset) + " " + dtype_name(static_cast<uint32_t>(dt)));
      SyntheticModelSpec spec = synthetic_preset(preset);
      spec.dtype = dt;
      if (std::string(preset) == "jamba-small" && dt != DType::F16) continue;  // one jamba-small is enough
      Model& model = *test::synthetic_model("ssm-run-" + std::string(preset) + "-" +
                                                dtype_name(static_cast<uint32_t>(dt)),
                                            spec)
                          .model;
      EXPECT_EQ(model.info().arch, spec.arch);
      EXPECT_EQ(model.info().n_layer, spec.n_layer);
      EXPECT_EQ(model.state_spec().layers.size(), static_cast<size_t>(spec.n_layer));
      const int64_t nv = model.info().n_vocab;
      const std::vector<int32_t> tokens = random_tokens(12, nv, 5);
      FlatMemory mem(model.state_spec());
      std::vector<float> logits = run(model, mem, tokens, 0, tokens.size(), pool, LogitsFor::All);
      ASSERT_EQ(logits.size(), tokens.size() * nv);
      float lo = INFINITY, hi = -INFINITY;
      for (float v : logits) {
        ASSERT_TRUE(std::isfinite(v));
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      EXPECT_GT(hi - lo, 1e-3f) << "logits are constant";
      // The recurrent state moved away from zero.
      const auto& s0 = model.state_spec().layers[0];
      if (s0.kind == LayerStateKind::Recurrent) {
        double mag = 0;
        for (int64_t i = 0; i < s0.ssm_state_floats; ++i) mag += std::fabs(mem.ssm_state(0)[i]);
        EXPECT_GT(mag, 0.0);
      }
    }
  }
}

TEST(SsmPresets, DistinctModelsHaveDistinctFingerprints) {
  const auto& a = preset_model("tiny-mamba").info().fingerprint;
  const auto& b = preset_model("tiny-mamba2").info().fingerprint;
  const auto& c = preset_model("tiny-jamba").info().fingerprint;
  EXPECT_NE(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(b, c);
}

// ------------------------------------------------------------ malformed files

// Rewrites a model with `mutate` applied to its metadata and the keys and
// tensors `drop` names left out (tensors are copied as they are; tokenizer keys
// are dropped: loading a model does not read them).
class Rewriter {
 public:
  Rewriter() {
    dir_ = std::filesystem::temp_directory_path() / ("reprise-ssm-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  ~Rewriter() { std::filesystem::remove_all(dir_); }

  std::string rewrite(const gguf::File& src, const std::function<void(gguf::Writer&)>& mutate,
                      const std::function<bool(const std::string&)>& drop = nullptr) {
    using gguf::MetaValue;
    using gguf::ValueType;
    gguf::Writer w;
    for (const auto& [key, v] : src.metadata()) {
      if (key.rfind("tokenizer.", 0) == 0 || (drop && drop(key))) continue;
      switch (v.type) {
        case ValueType::U32: w.set(key, MetaValue::u32(static_cast<uint32_t>(v.u))); break;
        case ValueType::I32: w.set(key, MetaValue::i32(static_cast<int32_t>(v.i))); break;
        case ValueType::U64: w.set(key, MetaValue::u64(v.u)); break;
        case ValueType::F32: w.set(key, MetaValue::f32(static_cast<float>(v.f))); break;
        case ValueType::BOOL: w.set(key, MetaValue::boolean(v.u != 0)); break;
        case ValueType::STRING: w.set(key, MetaValue::string(std::string(v.str))); break;
        case ValueType::ARRAY: {
          std::vector<int64_t> ints = v.int_array(key);
          std::vector<int32_t> i32(ints.begin(), ints.end());
          w.set(key, MetaValue::array(std::span<const int32_t>(i32)));
          break;
        }
        default: ADD_FAILURE() << "unexpected metadata type for " << key;
      }
    }
    for (const auto& t : src.tensors()) {
      if (drop && drop(t.name)) continue;
      w.add_tensor_view(t.name, t.shape, t.type, std::span<const uint8_t>(t.data, t.n_bytes));
    }
    mutate(w);
    const std::string path = (dir_ / ("m" + std::to_string(count_++) + ".gguf")).string();
    w.write(path);
    return path;
  }

 private:
  std::filesystem::path dir_;
  int count_ = 0;
};

// Loads the rewritten model and returns the error message (empty if it loaded).
std::string load_error(const std::string& path) {
  auto file = gguf::File::open(path);
  try {
    load_model(*file);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SsmMalformed, RewrittenButUnchangedFilesLoad) {
  Rewriter rw;
  for (const char* preset : kPresets) {
    const auto& m = test::synthetic_model("ssm-" + std::string(preset), synthetic_preset(preset));
    EXPECT_EQ(load_error(rw.rewrite(*m.file, [](gguf::Writer&) {})), "") << preset;
  }
}

TEST(SsmMalformed, InconsistentHyperParametersGiveClearErrors) {
  Rewriter rw;
  const auto& mamba = test::synthetic_model("ssm-tiny-mamba", synthetic_preset("tiny-mamba"));
  const auto& mamba2 = test::synthetic_model("ssm-tiny-mamba2", synthetic_preset("tiny-mamba2"));
  const auto& jamba = test::synthetic_model("ssm-tiny-jamba", synthetic_preset("tiny-jamba"));
  struct Case {
    const char* what;
    const test::LoadedModel* model;
    std::function<void(gguf::Writer&)> mutate;
    const char* expect;  // substring of the error message
  };
  const std::vector<Case> cases = {
      {"d_inner disagrees with the tensors", &mamba, [](gguf::Writer& w) { w.set_u32("mamba.ssm.inner_size", 96); },
       "blk.0.ssm_in.weight' has shape [64, 256], expected [64, 192]"},
      {"d_state disagrees with the tensors", &mamba, [](gguf::Writer& w) { w.set_u32("mamba.ssm.state_size", 8); },
       "ssm_x.weight' has shape"},
      {"zero d_state", &mamba, [](gguf::Writer& w) { w.set_u32("mamba.ssm.state_size", 0); },
       "mamba.ssm.state_size = 0 is out of range"},
      {"zero conv kernel", &mamba, [](gguf::Writer& w) { w.set_u32("mamba.ssm.conv_kernel", 0); },
       "mamba.ssm.conv_kernel = 0 is out of range"},
      {"dt_rank larger than d_inner", &mamba,
       [](gguf::Writer& w) { w.set_u32("mamba.ssm.time_step_rank", 1000); }, "exceeds mamba.ssm.inner_size"},
      {"d_inner of the wrong type", &mamba, [](gguf::Writer& w) { w.set_string("mamba.ssm.inner_size", "128"); },
       "mamba.ssm.inner_size' is string, expected integer"},
      {"mamba2 d_inner not a multiple of the heads", &mamba2,
       [](gguf::Writer& w) { w.set_u32("mamba2.ssm.time_step_rank", 7); }, "not a multiple of the head count"},
      {"mamba2 heads not a multiple of the groups", &mamba2,
       [](gguf::Writer& w) { w.set_u32("mamba2.ssm.group_count", 3); }, "not a multiple of mamba2.ssm.group_count"},
      {"mamba2 without group_count", &mamba2,
       [](gguf::Writer& w) { w.set_u32("mamba2.ssm.group_count", 0); }, "mamba2.ssm.group_count = 0 is out of range"},
      {"jamba d_inner disagrees with the tensors", &jamba,
       [](gguf::Writer& w) { w.set_u32("jamba.ssm.inner_size", 64); }, "blk.0.ssm_in.weight' has shape"},
      {"jamba head_count_kv array of the wrong length", &jamba,
       [](gguf::Writer& w) {
         const int32_t kv[3] = {0, 2, 0};
         w.set("jamba.attention.head_count_kv", gguf::MetaValue::array(std::span<const int32_t>(kv)));
       },
       "has 3 entries for 4 layers"},
      {"jamba head_count_kv that does not divide head_count", &jamba,
       [](gguf::Writer& w) {
         const int32_t kv[4] = {0, 3, 0, 0};
         w.set("jamba.attention.head_count_kv", gguf::MetaValue::array(std::span<const int32_t>(kv)));
       },
       "does not divide head_count"},
      {"jamba attention where the file has a mamba layer", &jamba,
       [](gguf::Writer& w) {
         const int32_t kv[4] = {2, 2, 0, 0};
         w.set("jamba.attention.head_count_kv", gguf::MetaValue::array(std::span<const int32_t>(kv)));
       },
       "blk.0.attn_q.weight"},
      {"jamba experts used > expert count", &jamba, [](gguf::Writer& w) { w.set_u32("jamba.expert_used_count", 5); },
       "expert_used_count = 5"},
      {"jamba expert count disagrees with the tensors", &jamba,
       [](gguf::Writer& w) { w.set_u32("jamba.expert_count", 8); }, "ffn_gate_inp.weight' has shape"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const std::string err = load_error(rw.rewrite(*c.model->file, c.mutate));
    ASSERT_FALSE(err.empty()) << "loaded without error";
    EXPECT_NE(err.find(c.expect), std::string::npos) << err;
  }
}

TEST(SsmMalformed, MissingKeysAndTensorsAreNamed) {
  Rewriter rw;
  const auto& mamba = test::synthetic_model("ssm-tiny-mamba", synthetic_preset("tiny-mamba"));
  const auto& mamba2 = test::synthetic_model("ssm-tiny-mamba2", synthetic_preset("tiny-mamba2"));
  const auto& jamba = test::synthetic_model("ssm-tiny-jamba", synthetic_preset("tiny-jamba"));
  const struct {
    const test::LoadedModel* model;
    const char* drop;  // a metadata key or tensor name left out of the file
  } cases[] = {
      {&mamba, "mamba.ssm.state_size"},        {&mamba, "mamba.ssm.conv_kernel"},
      {&mamba, "blk.1.ssm_a"},                 {&mamba, "blk.2.ssm_dt.bias"},
      {&mamba2, "mamba2.ssm.group_count"},     {&mamba2, "blk.1.ssm_norm.weight"},
      {&jamba, "jamba.attention.head_count_kv"}, {&jamba, "blk.2.ssm_b_norm.weight"},
      {&jamba, "blk.3.ffn_down_exps.weight"},  {&jamba, "blk.1.attn_k.weight"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.drop);
    const std::string drop = c.drop;
    const std::string err = load_error(
        rw.rewrite(*c.model->file, [](gguf::Writer&) {}, [&](const std::string& n) { return n == drop; }));
    EXPECT_NE(err.find(drop), std::string::npos) << err;
  }
}

}  // namespace
