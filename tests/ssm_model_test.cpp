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
#include "model/weights.h"
#include "model_fixtures.h"
#include "stored_key.h"
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
      for (int64_t p = 0; p < n; ++p)
        for (int64_t j = 0; j < s.n_kv_heads; ++j) {
          EXPECT_EQ(test::stored_key(a, il, p, j, s.head_dim_k), test::stored_key(b, il, p, j, s.head_dim_k))
              << "key " << l << "/" << p << " head " << j;
          EXPECT_TRUE(same_bits(a.value(il, p) + j * a.kv_head_stride(il), b.value(il, p) + j * b.kv_head_stride(il),
                                s.head_dim_v * 2))
              << "value " << l << "/" << p << " head " << j;
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
      for (int64_t p = 0; p < n; ++p)
        for (int64_t j = 0; j < s.n_kv_heads; ++j) {
          test::set_stored_key(to, il, p, j, test::stored_key(from, il, p, j, s.head_dim_k));
          std::memcpy(to.value(il, p) + j * to.kv_head_stride(il), from.value(il, p) + j * from.kv_head_stride(il),
                      s.head_dim_v * 2);
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

// ------------------------------------------------------------ reference

// A plain double-precision transcription of llama.cpp's mamba / mamba2 graphs
// (one token at a time), used to check shapes the fixtures do not cover:
// d_state not a multiple of 8, several B/C groups, other conv widths, tied
// output, unweighted dt/B/C norms. F32 weights, so activations are not rounded.
std::vector<double> reference_logits(const gguf::File& file, const std::vector<int32_t>& tokens) {
  WeightLoader w(file);
  const std::string arch = file.require_string("general.architecture");
  const bool v2 = arch == "mamba2";
  auto geti = [&](const std::string& k) { return file.require_int(arch + "." + k); };
  const int64_t E = geti("embedding_length"), NL = geti("block_count"), DI = geti("ssm.inner_size"),
                DS = geti("ssm.state_size"), K = geti("ssm.conv_kernel"), R = geti("ssm.time_step_rank");
  const int64_t NG = v2 ? geti("ssm.group_count") : 1, NH = v2 ? R : DI, HD = DI / NH;
  const bool bc_rms = file.get_bool(arch + ".ssm.dt_b_c_rms").value_or(false);
  const double eps = file.get_float(arch + ".attention.layer_norm_rms_epsilon").value_or(1e-5);
  const int64_t V = static_cast<int64_t>(file.require_tensor("token_embd.weight").shape[1]);
  const std::vector<float> embd = w.dense("token_embd.weight", {E, V});
  const std::vector<float> out_w = w.has("output.weight") ? w.dense("output.weight", {E, V}) : embd;
  const std::vector<float> out_norm = w.dense("output_norm.weight", {E});
  auto rms = [&](std::vector<double> v, const float* wt) {
    double ss = 0;
    for (double a : v) ss += a * a;
    const double sc = 1.0 / std::sqrt(ss / v.size() + eps);
    for (size_t i = 0; i < v.size(); ++i) v[i] = v[i] * sc * (wt ? wt[i] : 1.0);
    return v;
  };
  auto mv = [](const std::vector<float>& m, int64_t n_in, const std::vector<double>& x, int64_t row0 = 0,
               int64_t rows = -1) {
    if (rows < 0) rows = static_cast<int64_t>(m.size()) / n_in;
    std::vector<double> y(rows);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < n_in; ++i) y[r] += double(m[(row0 + r) * n_in + i]) * x[i];
    return y;
  };
  auto silu = [](double v) { return v / (1 + std::exp(-v)); };
  auto softplus = [](double v) { return v > 20 ? v : std::log1p(std::exp(v)); };

  const int64_t CC = v2 ? DI + 2 * NG * DS : DI;  // conv channels
  std::vector<std::vector<double>> conv(NL, std::vector<double>((K - 1) * CC)), ssm(NL, std::vector<double>(DS * DI));
  std::vector<double> logits;
  for (int32_t tok : tokens) {
    std::vector<double> x(embd.begin() + tok * E, embd.begin() + (tok + 1) * E);
    for (int64_t l = 0; l < NL; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      const std::vector<double> h = rms(x, w.dense(p + "attn_norm.weight", {E}).data());
      const std::vector<float> in_w = w.dense(p + "ssm_in.weight", {E, v2 ? 2 * DI + 2 * NG * DS + NH : 2 * DI});
      const std::vector<double> proj = mv(in_w, E, h);
      // z | conv input | (mamba2) dt
      const int64_t conv_off = v2 ? DI : 0, z_off = v2 ? 0 : DI;
      const std::vector<float> cw = w.dense(p + "ssm_conv1d.weight", {K, CC}), cb = w.dense(p + "ssm_conv1d.bias", {CC});
      std::vector<double> xc(CC);
      for (int64_t c = 0; c < CC; ++c) {
        double* st = conv[l].data() + c * (K - 1);
        double acc = 0;
        for (int64_t j = 0; j < K - 1; ++j) acc += st[j] * cw[c * K + j];
        acc += proj[conv_off + c] * cw[c * K + K - 1];
        for (int64_t j = 0; j + 1 < K - 1; ++j) st[j] = st[j + 1];
        if (K > 1) st[K - 2] = proj[conv_off + c];
        xc[c] = silu(acc + cb[c]);
      }
      std::vector<double> y(DI);
      const std::vector<float> D = v2 ? w.dense(p + "ssm_d", {1, NH}) : w.dense(p + "ssm_d", {DI});
      if (!v2) {
        std::vector<double> xdb = mv(w.dense(p + "ssm_x.weight", {DI, R + 2 * DS}), DI, xc);
        std::vector<double> dt(xdb.begin(), xdb.begin() + R), B(xdb.begin() + R, xdb.begin() + R + DS),
            C(xdb.begin() + R + DS, xdb.end());
        if (bc_rms) dt = rms(dt, nullptr), B = rms(B, nullptr), C = rms(C, nullptr);
        std::vector<double> dtf = mv(w.dense(p + "ssm_dt.weight", {R, DI}), R, dt);
        const std::vector<float> dtb = w.dense(p + "ssm_dt.bias", {DI}), A = w.dense(p + "ssm_a", {DS, DI});
        for (int64_t c = 0; c < DI; ++c) {
          const double sp = softplus(dtf[c] + dtb[c]);
          double acc = 0;
          for (int64_t k = 0; k < DS; ++k) {
            double& st = ssm[l][c * DS + k];
            st = st * std::exp(sp * A[c * DS + k]) + B[k] * xc[c] * sp;
            acc += st * C[k];
          }
          y[c] = (acc + xc[c] * D[c]) * silu(proj[z_off + c]);
        }
      } else {
        const std::vector<float> dtb = w.dense(p + "ssm_dt.bias", {NH}), A = w.dense(p + "ssm_a", {1, NH});
        const std::vector<float> nw = w.dense(p + "ssm_norm.weight", {DI / NG, NG});
        for (int64_t hh = 0; hh < NH; ++hh) {
          const double sp = softplus(proj[2 * DI + 2 * NG * DS + hh] + dtb[hh]);
          const double dA = std::exp(sp * A[hh]);
          const int64_t g = hh / (NH / NG);
          for (int64_t i = 0; i < HD; ++i) {
            const int64_t c = hh * HD + i;
            double acc = 0;
            for (int64_t k = 0; k < DS; ++k) {
              double& st = ssm[l][c * DS + k];
              st = st * dA + xc[DI + g * DS + k] * xc[c] * sp;
              acc += st * xc[DI + NG * DS + g * DS + k];
            }
            y[c] = (acc + xc[c] * D[hh]) * silu(proj[z_off + c]);
          }
        }
        const int64_t gs = DI / NG;
        for (int64_t g = 0; g < NG; ++g) {
          std::vector<double> part(y.begin() + g * gs, y.begin() + (g + 1) * gs);
          part = rms(part, nw.data() + g * gs);
          std::copy(part.begin(), part.end(), y.begin() + g * gs);
        }
      }
      const std::vector<double> o = mv(w.dense(p + "ssm_out.weight", {DI, E}), DI, y);
      for (int64_t i = 0; i < E; ++i) x[i] += o[i];
    }
    const std::vector<double> lg = mv(out_w, E, rms(x, out_norm.data()));
    logits.insert(logits.end(), lg.begin(), lg.end());
  }
  return logits;
}

TEST(SsmReference, OddShapesMatchAPlainTranscription) {
  SyntheticModelSpec m1 = synthetic_preset("tiny-mamba");
  m1.dtype = DType::F32;
  m1.n_embd = 40; m1.d_inner = 72; m1.d_state = 12; m1.d_conv = 2; m1.dt_rank = 3; m1.n_layer = 2;
  m1.n_vocab = 300; m1.tied_output = true;
  SyntheticModelSpec m1b = m1;
  m1b.d_state = 21; m1b.d_conv = 5; m1b.tied_output = false; m1b.seed = 3;
  // Many more conv taps than the usual 4, and d_inner not a multiple of
  // the scan's 16-channel blocks.
  SyntheticModelSpec m1c = m1;
  m1c.d_state = 16; m1c.d_conv = 18; m1c.d_inner = 40; m1c.seed = 4;
  SyntheticModelSpec m2 = synthetic_preset("tiny-mamba2");
  m2.dtype = DType::F32;
  m2.n_embd = 48; m2.d_inner = 96; m2.d_state = 12; m2.n_group = 2; m2.ssm_n_head = 6; m2.d_conv = 3;
  m2.n_vocab = 300;
  SyntheticModelSpec m2b = synthetic_preset("tiny-mamba2");
  m2b.dtype = DType::F32;
  m2b.n_vocab = 300;
  const std::vector<std::pair<std::string, SyntheticModelSpec>> specs = {
      {"ref-mamba-odd", m1}, {"ref-mamba-odd2", m1b}, {"ref-mamba-taps", m1c}, {"ref-mamba2-groups", m2},
      {"ref-mamba2", m2b}};
  ThreadPool pool(2);
  Rewriter rw;
  for (const auto& [tag, spec] : specs) {
    for (bool bc_rms : {false, true}) {
      if (bc_rms && spec.arch != "mamba") continue;
      SCOPED_TRACE(tag + (bc_rms ? " with ssm.dt_b_c_rms" : ""));
      const test::LoadedModel& lm = test::synthetic_model(tag, spec);
      std::unique_ptr<gguf::File> file;
      if (bc_rms)
        file = gguf::File::open(rw.rewrite(*lm.file, [](gguf::Writer& w) { w.set_bool("mamba.ssm.dt_b_c_rms", true); }));
      const gguf::File& f = bc_rms ? *file : *lm.file;
      auto model = load_model(f);
      const std::vector<int32_t> tokens = random_tokens(13, model->info().n_vocab, 17);
      FlatMemory mem(model->state_spec());
      // In two batches, so the state hand-over is part of what is checked.
      std::vector<float> got = run(*model, mem, tokens, 0, 6, pool);
      std::vector<float> rest = run(*model, mem, tokens, 6, tokens.size(), pool);
      got.insert(got.end(), rest.begin(), rest.end());
      const std::vector<double> want = reference_logits(f, tokens);
      ASSERT_EQ(got.size(), want.size());
      double max_diff = 0, max_abs = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        max_diff = std::max(max_diff, std::fabs(got[i] - want[i]));
        max_abs = std::max(max_abs, std::fabs(want[i]));
      }
      EXPECT_GT(max_abs, 0.1);
      EXPECT_LE(max_diff, 1e-5 * std::max(1.0, max_abs)) << "max |logit| " << max_abs;
    }
  }
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

// A file holding a tensor its architecture's loader does not read is
// refused, naming the tensor, as llama.cpp refuses it: run without it (a
// bias, Llama 3.1's rope_freqs before reprise read them), the model would
// give wrong output with no error.
TEST(ModelLoading, TensorsTheLoaderDoesNotReadAreRefused) {
  Rewriter rw;
  struct Case {
    const char* preset;
    const char* extra;
  };
  for (const Case& c : {Case{"tiny", "blk.0.attn_output.bias"}, Case{"tiny-qwen2", "output.bias"},
                        Case{"tiny-gemma3", "rope_freqs.weight"}, Case{"tiny-mamba", "blk.1.ssm_extra.weight"},
                        Case{"tiny-jamba", "blk.0.ffn_gate.bias"}}) {
    auto& m = test::synthetic_model(std::string("unknown-tensor-") + c.preset, synthetic_preset(c.preset));
    EXPECT_EQ(load_error(rw.rewrite(*m.file, [](gguf::Writer&) {})), "") << c.preset;
    const std::string error = load_error(rw.rewrite(*m.file, [&](gguf::Writer& w) {
      w.add_tensor_f32(c.extra, {16}, DType::F32, std::vector<float>(16, 1.0f));
    }));
    EXPECT_NE(error.find(c.extra), std::string::npos) << c.preset << ": " << error;
    EXPECT_NE(error.find("does not use"), std::string::npos) << c.preset << ": " << error;
  }
}

// RoPE scaling keys as llama.cpp reads them: a factor without a type is
// linear, and 2023 files carry it as rope.scale_linear. All three spellings
// of "linear, factor 4" give the same logits, and they differ from none.
TEST(ModelLoading, LinearRopeScalingInEverySpelling) {
  Rewriter rw;
  SyntheticModelSpec spec = synthetic_preset("tiny");
  spec.rope_linear_scaling = 4.0f;
  auto& m = test::synthetic_model("rope-linear-4", spec);
  auto logits_of = [](const std::string& path) {
    auto file = gguf::File::open(path);
    auto model = load_model(*file);
    ThreadPool pool(1);
    FlatMemory memory(model->state_spec());
    std::vector<int32_t> tokens;
    for (int i = 0; i < 40; ++i) tokens.push_back(5 + (i * 37) % 900);
    ForwardBatch batch;
    batch.tokens = tokens;
    batch.logits_for = LogitsFor::Last;
    std::vector<float> logits;
    model->forward(batch, memory, logits, pool);
    return logits;
  };
  auto without = [](const std::string& key) { return [key](const std::string& k) { return k == key; }; };
  const std::vector<float> typed = logits_of(rw.rewrite(*m.file, [](gguf::Writer&) {}));
  const std::vector<float> untyped = logits_of(rw.rewrite(*m.file, [](gguf::Writer&) {}, without("llama.rope.scaling.type")));
  const std::vector<float> legacy = logits_of(rw.rewrite(
      *m.file, [](gguf::Writer& w) { w.set_f32("llama.rope.scale_linear", 4.0f); },
      [](const std::string& k) { return k == "llama.rope.scaling.type" || k == "llama.rope.scaling.factor"; }));
  const std::vector<float> unscaled = logits_of(rw.rewrite(
      *m.file, [](gguf::Writer&) {},
      [](const std::string& k) { return k == "llama.rope.scaling.type" || k == "llama.rope.scaling.factor"; }));
  EXPECT_EQ(typed, untyped);
  EXPECT_EQ(typed, legacy);
  EXPECT_NE(typed, unscaled);
}

// Files this loader cannot run say why: a shard of a split GGUF, a
// mixture-of-experts llama.
TEST(ModelLoading, SplitShardsAndExpertLlamasAreRefusedClearly) {
  Rewriter rw;
  auto& m = test::synthetic_model("refusals-tiny", synthetic_preset("tiny"));
  const std::string shard = load_error(rw.rewrite(*m.file, [](gguf::Writer& w) {
    w.set("split.count", gguf::MetaValue::u16(3));
    w.set("split.no", gguf::MetaValue::u16(0));
  }));
  EXPECT_NE(shard.find("llama-gguf-split --merge"), std::string::npos) << shard;
  const std::string moe = load_error(rw.rewrite(*m.file, [](gguf::Writer& w) { w.set_u32("llama.expert_count", 8); }));
  EXPECT_NE(moe.find("mixture-of-experts"), std::string::npos) << moe;
}
