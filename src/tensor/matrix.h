// A read-only view of a 2-D weight matrix stored in a GGUF dtype.
#pragma once
#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace reprise {

// Row-major in the ggml sense: each of the n_out rows holds n_in contiguous
// elements (ggml shape [n_in, n_out]). Points into the mapped model file.
struct MatrixView {
  DType type = DType::F32;
  const uint8_t* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  size_t row_bytes = 0;

  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

}  // namespace reprise
