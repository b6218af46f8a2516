// Deterministic synthetic GGUF models for tests and benchmarks.
//
// The files use exactly the tensor names, shapes, types and metadata keys
// llama.cpp's converters write for each architecture (checked against the
// fixtures in ../shared), so the same loader reads synthetic and real models.
// Weights are seeded pseudo-random values scaled so activations stay
// well-conditioned (matrices ~ 1/sqrt(fan_in), norms around but never exactly
// 1, SSM parameters in their usual ranges); a SentencePiece-style vocabulary
// makes the model usable offline. Same spec => byte-identical file.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace reprise {

struct SyntheticModelSpec {
  // llama, qwen2, qwen3, gemma3, mamba, mamba2 or jamba.
  std::string arch = "llama";
  std::string name = "synthetic";  // general.name
  int64_t n_embd = 128;
  int64_t n_layer = 2;
  int64_t n_head = 4;       // attention heads (0 for pure SSM archs)
  int64_t n_head_kv = 2;
  int64_t head_dim = 0;     // 0: n_embd / n_head
  int64_t n_ff = 256;
  int64_t n_vocab = 1024;   // at least 260 (3 specials + 256 bytes + pieces)
  // > 0: the tokenizer lists only this many tokens, the rest of the model's
  // n_vocab rows being padding (as Qwen2.5's files have).
  int64_t tokenizer_tokens = 0;
  int64_t n_ctx = 2048;
  // Type of the weight matrices. Norms, biases, SSM conv/A/D and MoE routers
  // stay F32, and mamba's small ssm_x/ssm_dt matrices stay F16 when quantized,
  // as in llama.cpp files. Matrices whose rows do not fit the block size fall
  // back to F16, as llama-quantize does.
  DType dtype = DType::F16;
  // token_embd type when it should differ from dtype (llama-quantize's Q4_0
  // files keep a tied token_embd in Q8_0); unset = dtype.
  std::optional<DType> embd_dtype;
  // llama-quantize's _M mixes (Q4_K_M, Q5_K_M: dtype Q4_K or Q5_K, this
  // Q6_K): the output matrix, and attn_v and ffn_down in the layers it gives
  // more bits (the first and last eighth, and every third layer between),
  // take this type; unset = dtype everywhere. The files users run most are
  // these mixes, so benchmarks can measure what they read.
  std::optional<DType> more_bits_dtype;
  bool tied_output = false;  // no output.weight: logits use token_embd
  uint64_t seed = 1;
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  // > 0: rope.scaling.type "linear" with this factor (positions divided by it).
  float rope_linear_scaling = 0.0f;
  // llama: `rope_freqs.weight` (head_dim / 2 factors dividing each rotation
  // pair's frequency), as Llama 3.1 and later files carry; empty = none.
  std::vector<float> rope_freq_factors;
  // Pieces written as the vocabulary's last tokens, typed USER_DEFINED (as
  // converters type added tokens such as Qwen's <tool_call>): tests make a
  // model write exactly this text with logit_bias.
  std::vector<std::string> user_defined_tokens;
  // Likewise typed CONTROL (as Mistral's [TOOL_CALLS]), before those.
  std::vector<std::string> control_tokens;

  // gemma3: every `sliding_window_pattern`-th layer is global, the rest use a
  // window of `sliding_window` tokens.
  int64_t sliding_window = 512;
  int64_t sliding_window_pattern = 6;

  // mamba family (0 = derived: d_inner 2*n_embd, dt_rank ceil(n_embd/16)).
  int64_t d_inner = 0;
  int64_t d_state = 16;
  int64_t d_conv = 4;
  int64_t dt_rank = 0;
  int64_t n_group = 1;      // mamba2 B/C groups
  int64_t ssm_n_head = 8;   // mamba2 heads (written as ssm.time_step_rank)

  // jamba: per layer, true = attention, false = mamba (empty = Jamba's own
  // pattern: attention every 8th layer from layer 4, or layer 1 if shallower).
  std::vector<bool> attention_layers;
  // jamba MoE: layers with experts (empty = every odd layer when n_expert>0).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  std::vector<bool> moe_layers;
};

// Named shapes: "tiny" (llama, ~1M params, F32: fast tests), "60m" (llama
// dim 512, 8 layers, 8/8 heads, head dim 64, ff 1536, vocab 32000, untied,
// ctx 2048, F16: the shape llama.cpp was benchmarked at), "jamba-small"
// (8 hybrid layers with MoE) and "tiny-<arch>" for qwen2, qwen3, gemma3,
// mamba, mamba2 and jamba (same dimensions as the ../shared fixtures).
// Throws reprise::Error for an unknown name.
SyntheticModelSpec synthetic_preset(const std::string& name);

// Llama 3.1's RoPE frequency factors (Hugging Face's rope_type "llama3", as
// llama.cpp's converter writes them to rope_freqs.weight): pairs whose
// wavelength exceeds original_context / low_freq_factor are slowed by
// `factor`, those shorter than original_context / high_freq_factor are kept,
// and those between are interpolated.
std::vector<float> llama3_rope_freq_factors(int64_t n_rot, float freq_base, float factor, float low_freq_factor,
                                            float high_freq_factor, int64_t original_context);
std::vector<std::string> synthetic_preset_names();

// Throws reprise::Error naming the problem when the spec is inconsistent.
void validate_synthetic_spec(const SyntheticModelSpec& spec);

// Writes the model to out_path (streamed: weights are generated row by row).
void make_synthetic_model(const SyntheticModelSpec& spec, const std::string& out_path);

// The SentencePiece-style vocabulary the maker writes (pieces, in id order):
// <unk>, <s>, </s>, <0x00>..<0xFF>, then ▁-prefixed and plain English pieces.
std::vector<std::string> synthetic_vocab(int64_t n_vocab);

}  // namespace reprise
