// GGUF v3 writer: metadata of every GGUF value type (arrays of numbers,
// strings and nested arrays included) and tensors of any ggml type.
//
// Tensors are declared up front and their bytes are produced only while the
// file is written, one row at a time where possible, so a large model is never
// held in memory twice (the synthetic model maker generates weights row by
// row straight into the output file). Layout follows ggml: header, metadata,
// tensor infos, padding to general.alignment (default 32), then each tensor's
// data padded to the alignment.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "tensor/dtype.h"

namespace reprise::gguf {

class ByteSink;  // where emitted bytes go (file or memory); see gguf_writer.cpp

// An owned metadata value to write. Build with the named factories.
class MetaValue {
 public:
  static MetaValue u8(uint8_t v);
  static MetaValue i8(int8_t v);
  static MetaValue u16(uint16_t v);
  static MetaValue i16(int16_t v);
  static MetaValue u32(uint32_t v);
  static MetaValue i32(int32_t v);
  static MetaValue u64(uint64_t v);
  static MetaValue i64(int64_t v);
  static MetaValue f32(float v);
  static MetaValue f64(double v);
  static MetaValue boolean(bool v);
  static MetaValue string(std::string v);

  // Arrays of scalars; element type from T (bool arrays via bool_array).
  static MetaValue array(std::span<const uint8_t> v);
  static MetaValue array(std::span<const int8_t> v);
  static MetaValue array(std::span<const uint16_t> v);
  static MetaValue array(std::span<const int16_t> v);
  static MetaValue array(std::span<const uint32_t> v);
  static MetaValue array(std::span<const int32_t> v);
  static MetaValue array(std::span<const uint64_t> v);
  static MetaValue array(std::span<const int64_t> v);
  static MetaValue array(std::span<const float> v);
  static MetaValue array(std::span<const double> v);
  static MetaValue bool_array(const std::vector<bool>& v);
  static MetaValue string_array(std::vector<std::string> v);
  // An array whose elements are themselves arrays (each may have its own
  // element type, as the format allows). Throws if an element is not an array.
  static MetaValue array_of_arrays(std::vector<MetaValue> v);
  // A copy of a value read by gguf::File, same type and bytes (to rewrite or
  // edit an existing model's metadata).
  static MetaValue copy_of(const Value& v);

  ValueType type() const { return type_; }
  ValueType element_type() const { return elem_type_; }
  uint64_t element_count() const;
  // Exact number of bytes this value occupies after its type tag.
  uint64_t encoded_size() const;
  // Appends the value's encoding (without its own type tag) to out.
  void encode(std::vector<uint8_t>& out) const;

 private:
  template <typename T>
  static MetaValue make_scalar(ValueType type, T v);
  template <typename T>
  static MetaValue make_array(std::span<const T> v);

  ValueType type_ = ValueType::U8;
  std::vector<uint8_t> scalar_;          // little-endian scalar bytes
  std::string str_;                      // STRING
  ValueType elem_type_ = ValueType::U8;  // ARRAY
  uint64_t count_ = 0;                   // ARRAY of scalars: element count
  std::vector<uint8_t> raw_elems_;       // ARRAY of scalars: packed elements
  std::vector<std::string> strings_;     // ARRAY of STRING
  std::vector<MetaValue> arrays_;        // ARRAY of ARRAY
};

// Fills `out` (shape[0] floats) with row `row` of a tensor; rows are numbered
// over all dimensions above the first, in file order.
using RowGenerator = std::function<void(int64_t row, std::span<float> out)>;

class Writer {
 public:
  Writer();
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  // Sets or replaces a key (a replaced key keeps its original position).
  // "general.alignment" must be an unsigned power of two; it sets the layout.
  void set(const std::string& key, MetaValue value);
  void set_string(const std::string& key, std::string v) { set(key, MetaValue::string(std::move(v))); }
  void set_u32(const std::string& key, uint32_t v) { set(key, MetaValue::u32(v)); }
  void set_i32(const std::string& key, int32_t v) { set(key, MetaValue::i32(v)); }
  void set_f32(const std::string& key, float v) { set(key, MetaValue::f32(v)); }
  void set_bool(const std::string& key, bool v) { set(key, MetaValue::boolean(v)); }
  bool has(const std::string& key) const;

  // Tensors, written in the order added. `shape` is in ggml order (shape[0]
  // is the contiguous dimension), 1 to 4 dims; names must be unique.
  //
  // Raw bytes in `type`'s layout, taken over (no copy when moved in).
  void add_tensor(const std::string& name, std::vector<uint64_t> shape, DType type,
                  std::vector<uint8_t> bytes);
  // Raw bytes the caller keeps alive until write() returns (no copy at all).
  void add_tensor_view(const std::string& name, std::vector<uint64_t> shape, DType type,
                       std::span<const uint8_t> bytes);
  // f32 values converted to `type` (any quantize_supported type) row by row while
  // writing.
  void add_tensor_f32(const std::string& name, std::vector<uint64_t> shape, DType type,
                      std::vector<float> values);
  // Rows produced on demand while writing and converted to `type`: nothing of
  // the tensor is held in memory beyond one row.
  void add_tensor_rows(const std::string& name, std::vector<uint64_t> shape, DType type,
                       RowGenerator generate);

  uint64_t alignment() const { return alignment_; }
  size_t tensor_count() const;

  // Writes the file (through a temporary renamed into place, so a failed write
  // never leaves a half-written model under `path`). Throws reprise::Error.
  void write(const std::string& path) const;
  // The same bytes in memory (tests, small files).
  std::vector<uint8_t> to_bytes() const;

 private:
  struct Tensor;
  void add(std::unique_ptr<Tensor> t);
  void emit(ByteSink& sink) const;

  std::vector<std::pair<std::string, MetaValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::map<std::string, size_t> tensor_index_;
  uint64_t alignment_ = 32;
};

}  // namespace reprise::gguf
