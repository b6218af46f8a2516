#include "model/weights.h"

#include <xxhash.h>

#include "tensor/kernels.h"
#include "util/error.h"

namespace reprise {

namespace {
std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

const gguf::TensorInfo& WeightLoader::tensor(const std::string& name) const {
  const gguf::TensorInfo& t = file_.require_tensor(name);
  read_.insert(name);
  return t;
}

void WeightLoader::refuse_unknown_tensors() const {
  std::vector<std::string> unknown;
  for (const auto& t : file_.tensors())
    if (!read_.count(t.name)) unknown.push_back(t.name);
  if (unknown.empty()) return;
  std::string names;
  for (size_t i = 0; i < unknown.size() && i < 5; ++i) names += (i ? ", " : "") + unknown[i];
  if (unknown.size() > 5) names += " and " + std::to_string(unknown.size() - 5) + " more";
  file_.fail("the file holds tensors this architecture does not use here (" + names +
             "): they would be ignored and the model would run wrong, so it is refused");
}

const gguf::TensorInfo& WeightLoader::checked(const std::string& name,
                                              const std::vector<int64_t>& shape) const {
  const gguf::TensorInfo& t = tensor(name);
  bool ok = t.shape.size() <= shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    uint64_t have = i < t.shape.size() ? t.shape[i] : 1;
    ok = have == static_cast<uint64_t>(shape[i]);
  }
  if (!ok) {
    std::vector<uint64_t> want(shape.begin(), shape.end());
    file_.fail("tensor '" + name + "' has shape " + shape_str(t.shape) + ", expected " + shape_str(want));
  }
  if (!dtype_supported(t.type))
    file_.fail("tensor '" + name + "' has unsupported type " + dtype_name(t.raw_type) +
               " (supported: " + supported_dtype_names() + ")");
  return t;
}

MatrixView WeightLoader::matrix(const std::string& name, int64_t n_in, int64_t n_out) const {
  const gguf::TensorInfo& t = checked(name, {n_in, n_out});
  MatrixView m;
  m.type = t.type;
  m.data = t.data;
  m.n_in = n_in;
  m.n_out = n_out;
  m.row_bytes = dtype_row_bytes(t.type, n_in);
  return m;
}

std::vector<float> WeightLoader::dense(const std::string& name, const std::vector<int64_t>& shape) const {
  const gguf::TensorInfo& t = checked(name, shape);
  MatrixView m{t.type, t.data, static_cast<int64_t>(t.shape[0]), static_cast<int64_t>(t.rows()),
               dtype_row_bytes(t.type, t.shape[0])};
  std::vector<float> out(t.n_elements());
  for (int64_t r = 0; r < m.n_out; ++r) dequantize_row(m, r, out.data() + r * m.n_in);
  return out;
}

std::vector<float> WeightLoader::vector(const std::string& name, int64_t n) const {
  return dense(name, {n});
}

std::vector<float> WeightLoader::optional_vector(const std::string& name, int64_t n) const {
  if (!has(name)) return {};
  return vector(name, n);
}

int64_t load_embedding_and_head(const WeightLoader& w, int64_t n_embd, MatrixView& token_embd, PackedMatrix& output,
                                std::vector<float>& output_norm) {
  const gguf::File& file = w.file();
  const gguf::TensorInfo& embd = w.tensor("token_embd.weight");
  if (embd.shape.size() != 2) file.fail("token_embd.weight must be 2-D");
  const int64_t n_vocab = static_cast<int64_t>(embd.shape[1]);
  token_embd = w.matrix("token_embd.weight", n_embd, n_vocab);
  output = PackedMatrix(w.has("output.weight") ? w.matrix("output.weight", n_embd, n_vocab) : token_embd);
  output_norm = w.vector("output_norm.weight", n_embd);
  return n_vocab;
}

std::array<uint64_t, 2> fingerprint_weights(const gguf::File& file, const std::string& layout_tag) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, layout_tag.data(), layout_tag.size());
  for (const auto& t : file.tensors()) {
    // Lengths before what varies in length, so that no two files give one stream.
    const uint64_t name_size = t.name.size(), dims = t.shape.size();
    XXH3_128bits_update(state, &name_size, sizeof name_size);
    XXH3_128bits_update(state, t.name.data(), t.name.size());
    uint32_t type = t.raw_type;
    XXH3_128bits_update(state, &type, sizeof type);
    XXH3_128bits_update(state, &dims, sizeof dims);
    for (uint64_t d : t.shape) XXH3_128bits_update(state, &d, sizeof d);
    XXH3_128bits_update(state, t.data, t.n_bytes);
  }
  XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return {h.low64, h.high64};
}

std::future<std::array<uint64_t, 2>> fingerprint_weights_async(const gguf::File& file, std::string layout_tag) {
  return std::async(std::launch::async,
                    [&file, tag = std::move(layout_tag)] { return fingerprint_weights(file, tag); });
}

}  // namespace reprise
