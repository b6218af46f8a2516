#include "model/lora_adapter.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "gguf/gguf_file.h"
#include "model/weights.h"
#include "util/error.h"

namespace reprise {

namespace {

constexpr const char* kSuffixA = ".lora_a";
constexpr const char* kSuffixB = ".lora_b";

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

}  // namespace

LoraAdapter::LoraAdapter(Key) {}
LoraAdapter::~LoraAdapter() = default;

std::shared_ptr<const LoraAdapter> LoraAdapter::load(const std::string& path) {
  return from_file(gguf::File::open(path));
}

std::shared_ptr<const LoraAdapter> LoraAdapter::from_file(std::unique_ptr<gguf::File> file) {
  const gguf::File& f = *file;
  if (f.get_string("general.type").value_or("") != "adapter")
    f.fail("not a LoRA adapter (general.type is not \"adapter\"; a model is loaded with -m or --model)");
  const std::string type = f.get_string("adapter.type").value_or("");
  if (type != "lora")
    f.fail("adapter type '" + type + "' is not supported (only \"lora\")");
  auto adapter = std::make_shared<LoraAdapter>(Key{});
  adapter->arch_ = f.require_string("general.architecture");
  const double alpha = f.get_float("adapter.lora.alpha").value_or(0.0);
  // (A double beyond float's range would become an infinite factor.)
  if (!std::isfinite(alpha) || std::fabs(alpha) > 1e30) f.fail("adapter.lora.alpha is not a finite float");
  adapter->alpha_ = static_cast<float>(alpha);
  adapter->path_ = f.path();
  adapter->file_bytes_ = f.file_size();
  if (f.find("adapter.alora.invocation_tokens"))
    f.fail("activated LoRA (aLoRA) adapters are not supported");

  WeightLoader w(f);
  for (const gguf::TensorInfo& t : f.tensors()) {
    if (!ends_with(t.name, kSuffixA)) continue;
    const std::string base = t.name.substr(0, t.name.size() - std::strlen(kSuffixA));
    const std::string name_b = base + kSuffixB;
    const gguf::TensorInfo* b = f.tensor(name_b);
    if (!b) f.fail("tensor '" + t.name + "' has no '" + name_b + "'");
    if (t.shape.size() != 2 || b->shape.size() != 2)
      f.fail("LoRA tensors of '" + base + "' must be 2-D");
    // llama.cpp's order: A is [n_in, rank], B is [rank, n_out]. The
    // "finetune" example's older files stored A transposed.
    if (t.shape[1] != b->shape[0])
      f.fail("LoRA tensors of '" + base + "' do not chain (lora_a has rank " + std::to_string(t.shape[1]) +
             ", lora_b " + std::to_string(b->shape[0]) + "; transposed lora_a files are not supported)");
    const auto n_in = static_cast<int64_t>(t.shape[0]), rank = static_cast<int64_t>(t.shape[1]),
               n_out = static_cast<int64_t>(b->shape[1]);
    if (rank <= 0 || rank > 4096) f.fail("LoRA rank of '" + base + "' is out of range");
    LoraPair pair;
    const MatrixView a = w.matrix(t.name, n_in, rank), b_view = w.matrix(name_b, rank, n_out);
    // A NaN or infinity would turn every logit of the sequences using the
    // adapter into NaN: refuse the file instead.
    std::vector<float> row;
    for (const MatrixView* m : {&a, &b_view}) {
      row.resize(static_cast<size_t>(m->n_in));
      for (int64_t r = 0; r < m->n_out; ++r) {
        dequantize_row(*m, r, row.data());
        for (float v : row)
          if (!std::isfinite(v)) f.fail("LoRA tensors of '" + base + "' hold values that are not finite");
      }
    }
    pair.a = PackedMatrix(a);
    pair.b = PackedMatrix(b_view);
    pair.factor = adapter->alpha_ != 0.0f ? adapter->alpha_ / static_cast<float>(rank) : 1.0f;
    adapter->packed_bytes_ += pair.a.packed_bytes() + pair.b.packed_bytes();
    adapter->pairs_.emplace(base, std::move(pair));
  }
  // A lone lora_b, or any other tensor, would be ignored: refuse the file.
  w.refuse_unknown_tensors();
  if (adapter->pairs_.empty()) f.fail("the adapter holds no LoRA tensors");

  // alpha by its bits: printed with a few decimals, adapters whose alphas
  // differ beyond them (or none and a tiny one) would share cached state.
  uint32_t alpha_bits = 0;
  std::memcpy(&alpha_bits, &adapter->alpha_, sizeof alpha_bits);
  const auto digest = fingerprint_weights(f, "lora/v2/" + std::to_string(alpha_bits));
  char hex[33];
  std::snprintf(hex, sizeof hex, "%016llx%016llx", static_cast<unsigned long long>(digest[1]),
                static_cast<unsigned long long>(digest[0]));
  adapter->fingerprint_hex_ = hex;
  f.release_resident();
  adapter->file_ = std::move(file);
  return adapter;
}

const LoraPair* LoraAdapter::find(const std::string& name) const {
  auto it = pairs_.find(name);
  return it == pairs_.end() ? nullptr : &it->second;
}

std::string lora_identity(const std::vector<LoraUse>& loras) {
  std::string id;
  for (const LoraUse& use : loras) {
    uint32_t bits = 0;
    std::memcpy(&bits, &use.scale, sizeof bits);
    char scale[16];
    std::snprintf(scale, sizeof scale, "%08x", bits);
    id += use.adapter->fingerprint_hex() + "*" + scale + ";";
  }
  return id;
}

}  // namespace reprise
