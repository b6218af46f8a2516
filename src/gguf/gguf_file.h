// Validated, memory-mapped GGUF (v2/v3) reader with zero-copy tensor views.
//
// Everything is checked before use: magic, version, counts, string and array
// lengths, tensor shapes, types, alignment and data bounds. Any problem raises
// reprise::Error whose message names the file and the problem. Once open()
// returns, every tensor view points inside the mapping.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace reprise::gguf {

enum class ValueType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars are held decoded; arrays keep a view of their
// raw little-endian elements (strings are decoded into views).
struct Value {
  ValueType type = ValueType::U8;
  uint64_t u = 0;          // unsigned scalars and BOOL
  int64_t i = 0;           // signed scalars
  double f = 0;            // float scalars
  std::string_view str;    // STRING
  ValueType elem_type = ValueType::U8;   // ARRAY element type
  uint64_t count = 0;                    // ARRAY element count
  const uint8_t* elems = nullptr;        // ARRAY raw elements (non-string)
  std::vector<std::string_view> strings; // ARRAY of STRING
  std::vector<Value> nested;             // ARRAY of ARRAY

  bool is_integer() const;
  bool is_float() const;
  // Numeric conversions; throw reprise::Error naming `key` on type mismatch.
  int64_t as_int(std::string_view key) const;
  double as_double(std::string_view key) const;
  // Array elements converted to the requested type.
  std::vector<int64_t> int_array(std::string_view key) const;
  std::vector<float> float_array(std::string_view key) const;
};

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> shape;  // ggml order: shape[0] is the contiguous dim
  uint32_t raw_type = 0;
  DType type = DType::F32;
  uint64_t offset = 0;          // relative to the data section
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // inside the mapping

  uint64_t n_elements() const;
  uint64_t rows() const { return n_elements() / (shape.empty() ? 1 : shape[0]); }
};

class File {
 public:
  // Maps and validates `path`.
  static std::unique_ptr<File> open(const std::string& path);
  // Validates an in-memory image (copied); `name` is used in messages. Used by
  // fuzz tests and for files read from non-mappable sources.
  static std::unique_ptr<File> from_bytes(std::span<const uint8_t> bytes,
                                          const std::string& name);
  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }

  const std::map<std::string, Value, std::less<>>& metadata() const { return kv_; }
  const Value* find(std::string_view key) const;
  // Typed accessors: nullopt when absent; throw when present with a wrong type.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  // Required variants throw "<file>: missing metadata key <key>".
  std::string require_string(std::string_view key) const;
  int64_t require_int(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* tensor(std::string_view name) const;
  const TensorInfo& require_tensor(std::string_view name) const;

  // The file's bytes (mapping), e.g. for content fingerprints.
  std::span<const uint8_t> bytes() const { return {base_, size_}; }

  // Drops this process's resident pages of the mapping, for after loading:
  // the weights have been copied into packed form, so keeping the file's
  // pages mapped would count the model twice against the machine's memory.
  // Bytes read later (embedding rows) fault back in from the file, usually
  // still in the page cache. No effect on in-memory images.
  void release_resident() const;

  // Formats "<path>: <what>" for errors raised by users of this file.
  [[noreturn]] void fail(const std::string& what) const;

 private:
  File() = default;
  void parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  std::vector<uint8_t> owned_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::map<std::string, Value, std::less<>> kv_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace reprise::gguf
