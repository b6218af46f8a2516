// A hybrid toy model (optionally one attention layer, then one recurrent
// layer) whose outputs depend on every earlier token through both kinds of
// state: cheap enough for thousands of cached-vs-cold comparisons.
#pragma once
#include <cmath>
#include <vector>

#include "model/model.h"
#include "tensor/fp16.h"
#include "tensor/thread_pool.h"

namespace reprise::testing_support {

class ToyHybrid final : public Model {
 public:
  explicit ToyHybrid(bool with_attention) {
    info_.arch = "toy-hybrid";
    info_.n_vocab = 64;
    info_.n_ctx_train = 4096;
    info_.fingerprint = {0x1234, with_attention ? 1u : 2u};
    if (with_attention) {
      LayerStateSpec a;
      a.kind = LayerStateKind::Attention;
      a.n_kv_heads = 1;
      a.head_dim_k = a.head_dim_v = 2;
      spec_.layers.push_back(a);
    }
    LayerStateSpec r;
    r.kind = LayerStateKind::Recurrent;
    r.conv_state_floats = 3;
    r.ssm_state_floats = 4;
    spec_.layers.push_back(r);
  }
  const ModelInfo& info() const override { return info_; }
  const StateSpec& state_spec() const override { return spec_; }
  void forward(const ForwardBatch& batch, SequenceMemory& memory, std::vector<float>& logits,
               ThreadPool&) override {
    const int64_t n = static_cast<int64_t>(batch.tokens.size());
    memory.prepare(batch.pos0, batch.pos0 + n);
    const int rl = static_cast<int>(spec_.layers.size()) - 1;
    float* conv = memory.conv_state(rl);
    float* ssm = memory.ssm_state(rl);
    logits.clear();
    for (int64_t t = 0; t < n; ++t) {
      const int64_t pos = batch.pos0 + t;
      const float x = static_cast<float>(batch.tokens[t]);
      conv[0] = conv[1];
      conv[1] = conv[2];
      conv[2] = x;
      for (int i = 0; i < 4; ++i) ssm[i] = ssm[i] * (0.5f + 0.1f * i) + (conv[0] + conv[1] * 0.5f + conv[2]) * (i + 1);
      float attn = 0;
      if (rl == 1) {
        uint16_t* k = memory.key(0, pos);
        k[0] = f32_to_f16(std::sin(x + pos));
        k[1] = f32_to_f16(std::cos(x));
        memory.value(0, pos)[0] = f32_to_f16(x / 64);
        memory.value(0, pos)[1] = 0;
        for (int64_t p = 0; p <= pos; ++p) attn += f16_to_f32(memory.key(0, p)[0]) * f16_to_f32(memory.value(0, p)[0]);
      }
      const bool want = batch.logits_for == LogitsFor::All || (batch.logits_for == LogitsFor::Last && t == n - 1);
      if (!want) continue;
      for (int v = 0; v < info_.n_vocab; ++v)
        logits.push_back(std::sin(v * 0.37f + ssm[v % 4] * 0.01f + attn));
    }
  }

 private:
  ModelInfo info_;
  StateSpec spec_;
};

}  // namespace reprise::testing_support
