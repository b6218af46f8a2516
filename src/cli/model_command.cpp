// reprise model: make deterministic synthetic models and inspect GGUF files.
#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdio>

#include "cli/commands.h"
#include "gguf/gguf_file.h"
#include "model/synthetic_lora.h"
#include "model/synthetic_model.h"
#include "util/error.h"

namespace reprise::cli {

namespace {
DType parse_dtype(const std::string& s) {
  std::string upper = s;
  for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  for (DType t : supported_dtypes())
    if (upper == dtype_name(static_cast<uint32_t>(t))) return t;
  throw Error("unsupported dtype '" + s + "' (supported: " + supported_dtype_names() + ")");
}
}  // namespace

void register_model(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("model", "Make synthetic models, inspect GGUF files");
  cmd->require_subcommand(1);

  struct MakeOptions {
    std::string preset = "tiny", arch, dtype, out;
    int64_t n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, n_ff = 0, n_vocab = 0, n_ctx = 0;
    int64_t d_inner = 0, d_state = 0, dt_rank = 0, ssm_n_head = 0, n_group = 0;
    uint64_t seed = 0;
    bool tied = false;
  };
  auto mo = std::make_shared<MakeOptions>();
  CLI::App* make = cmd->add_subcommand("make", "Write a deterministic synthetic model");
  make->add_option("--preset", mo->preset, "Base shape (see 'reprise model presets')")->capture_default_str();
  make->add_option("--arch", mo->arch, "Architecture override");
  make->add_option("--dtype", mo->dtype,
                   "Weight type: " + supported_dtype_names() +
                       ", or the mixes Q4_K_M and Q5_K_M (Q6_K for the output, and for attn_v and ffn_down in "
                       "the layers llama-quantize gives more bits). K types: matrices whose rows are not whole "
                       "256-element blocks fall back as llama-quantize's do");
  make->add_option("--embd", mo->n_embd, "Embedding width");
  make->add_option("--layers", mo->n_layer, "Layers");
  make->add_option("--heads", mo->n_head, "Attention heads");
  make->add_option("--kv-heads", mo->n_head_kv, "KV heads");
  make->add_option("--ff", mo->n_ff, "Feed-forward width");
  make->add_option("--vocab", mo->n_vocab, "Vocabulary size");
  make->add_option("--ctx", mo->n_ctx, "Context length");
  make->add_option("--ssm-inner", mo->d_inner, "Recurrent layers: inner size (d_inner)");
  make->add_option("--ssm-state", mo->d_state, "Recurrent layers: state size per channel (d_state)");
  make->add_option("--ssm-dt-rank", mo->dt_rank, "Mamba/jamba: time step rank");
  make->add_option("--ssm-heads", mo->ssm_n_head, "Mamba-2: heads");
  make->add_option("--ssm-groups", mo->n_group, "Mamba-2: B/C groups");
  make->add_option("--seed", mo->seed, "Weight seed");
  make->add_flag("--tied", mo->tied, "Tie the output projection to the token embedding");
  make->add_option("-o,--output", mo->out, "Output GGUF path")->required();
  make->callback([mo] {
    SyntheticModelSpec s = synthetic_preset(mo->preset);
    if (!mo->arch.empty()) s.arch = mo->arch;
    if (!mo->dtype.empty()) {
      // Q4_K_M / Q5_K_M: llama-quantize's mixes (SyntheticModelSpec::more_bits_dtype).
      const std::string& d = mo->dtype;
      const bool mix = d.size() > 2 && (d.ends_with("_M") || d.ends_with("_m"));
      s.dtype = parse_dtype(mix ? d.substr(0, d.size() - 2) : d);
      if (mix) s.more_bits_dtype = DType::Q6_K;
    }
    if (mo->n_embd) s.n_embd = mo->n_embd;
    if (mo->n_layer) s.n_layer = mo->n_layer;
    if (mo->n_head) s.n_head = mo->n_head;
    if (mo->n_head_kv) s.n_head_kv = mo->n_head_kv;
    if (mo->n_ff) s.n_ff = mo->n_ff;
    if (mo->n_vocab) s.n_vocab = mo->n_vocab;
    if (mo->n_ctx) s.n_ctx = mo->n_ctx;
    if (mo->d_inner) s.d_inner = mo->d_inner;
    if (mo->d_state) s.d_state = mo->d_state;
    if (mo->dt_rank) s.dt_rank = mo->dt_rank;
    if (mo->ssm_n_head) s.ssm_n_head = mo->ssm_n_head;
    if (mo->n_group) s.n_group = mo->n_group;
    if (mo->seed) s.seed = mo->seed;
    if (mo->tied) s.tied_output = true;
    validate_synthetic_spec(s);
    std::fprintf(stderr, "writing %s %s model (embd %lld, %lld layers, vocab %lld, %s) to %s\n", s.arch.c_str(),
                 mo->preset.c_str(), (long long)s.n_embd, (long long)s.n_layer, (long long)s.n_vocab,
                 (dtype_name(static_cast<uint32_t>(s.dtype)) + (s.more_bits_dtype ? "_M" : "")).c_str(),
                 mo->out.c_str());
    make_synthetic_model(s, mo->out);
  });

  struct LoraOptions {
    std::string base, dtype = "F32", out;
    int64_t rank = 8;
    float alpha = 16.0f, strength = 0.5f;
    uint64_t seed = 1;
    std::vector<std::string> targets;
  };
  auto lo = std::make_shared<LoraOptions>();
  CLI::App* lora = cmd->add_subcommand("lora", "Write a deterministic synthetic LoRA adapter for a model file");
  lora->add_option("-m,--model", lo->base, "Base model GGUF (its architecture and shapes)")->required();
  lora->add_option("--rank", lo->rank, "Rank")->capture_default_str();
  lora->add_option("--alpha", lo->alpha, "adapter.lora.alpha (0 writes none)")->capture_default_str();
  lora->add_option("--strength", lo->strength, "Size of the weight change relative to the base weights")
      ->capture_default_str();
  lora->add_option("--dtype", lo->dtype, "Type of the A and B matrices")->capture_default_str();
  lora->add_option("--target", lo->targets,
                   "Matrices to adapt (repeatable; default all of attn_q, attn_k, attn_v, attn_output, ffn_gate, "
                   "ffn_up, ffn_down)");
  lora->add_option("--seed", lo->seed, "Seed")->capture_default_str();
  lora->add_option("-o,--output", lo->out, "Output GGUF path")->required();
  lora->callback([lo] {
    SyntheticLoraSpec s;
    s.rank = lo->rank;
    s.alpha = lo->alpha;
    s.strength = lo->strength;
    s.dtype = parse_dtype(lo->dtype);
    s.seed = lo->seed;
    if (!lo->targets.empty()) s.targets = lo->targets;
    make_synthetic_lora(lo->base, s, lo->out);
    std::fprintf(stderr, "wrote a rank-%lld LoRA adapter for %s to %s\n", (long long)s.rank, lo->base.c_str(),
                 lo->out.c_str());
  });

  CLI::App* presets = cmd->add_subcommand("presets", "List synthetic model presets");
  presets->callback([] {
    for (const auto& n : synthetic_preset_names()) std::printf("%s\n", n.c_str());
  });

  auto path = std::make_shared<std::string>();
  CLI::App* info = cmd->add_subcommand("info", "Print a GGUF file's metadata and tensors");
  info->add_option("-m,--model", *path, "GGUF file")->required();
  info->callback([path] {
    auto f = gguf::File::open(*path);
    std::printf("%s: GGUF v%u, %zu metadata keys, %zu tensors\n", path->c_str(), f->version(), f->metadata().size(),
                f->tensors().size());
    for (const auto& [k, v] : f->metadata()) {
      std::printf("  %s: ", k.c_str());
      if (v.type == gguf::ValueType::STRING) std::printf("%.80s\n", std::string(v.str).c_str());
      else if (v.type == gguf::ValueType::ARRAY) std::printf("[%s x %llu]\n", gguf::value_type_name(v.elem_type), (unsigned long long)v.count);
      else if (v.is_float()) std::printf("%g\n", v.f);
      else std::printf("%lld\n", (long long)v.as_int(k));
    }
    for (const auto& t : f->tensors()) {
      std::printf("  %-40s %-5s [", t.name.c_str(), dtype_name(t.raw_type).c_str());
      for (size_t i = 0; i < t.shape.size(); ++i) std::printf("%s%llu", i ? ", " : "", (unsigned long long)t.shape[i]);
      std::printf("]\n");
    }
  });
}

}  // namespace reprise::cli
