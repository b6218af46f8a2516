// jamba: a hybrid of attention layers (no RoPE) and Mamba-1 layers (with RMS
// norms on dt, B and C), each followed by a dense SwiGLU FFN or, on layers
// that have experts, a softmax-routed top-k MoE FFN. Follows llama.cpp's jamba
// graph: a layer is recurrent exactly when its attention.head_count_kv entry
// is 0, and MoE exactly when it has ffn_gate_inp.
//
// State: attention layers keep f16 K/V rows per position (as the dense
// transformers do); recurrent layers keep the Mamba-1 conv and SSM state
// described in mamba.h. Batch-split invariance holds as for both parents: the
// MoE routes each token on its own and every expert matmul is per row.
#pragma once
#include <memory>
#include <string>

#include "model/model.h"

namespace reprise {

bool is_jamba_arch(const std::string& arch);
std::unique_ptr<Model> load_jamba(const gguf::File& file);

}  // namespace reprise
