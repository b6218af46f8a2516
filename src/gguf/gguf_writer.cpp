#include "gguf/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "tensor/quantize.h"
#include "util/error.h"

namespace reprise::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint32_t kVersion = 3;
constexpr size_t kMaxTensorName = 63;  // ggml's GGML_MAX_NAME (64) minus the NUL
constexpr size_t kMaxDims = 4;

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));  // x86-64 is little-endian, as GGUF v3 is
}

void put_string(std::vector<uint8_t>& out, std::string_view s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

uint64_t align_up(uint64_t n, uint64_t alignment) { return (n + alignment - 1) / alignment * alignment; }

template <typename T>
constexpr ValueType value_type_of() {
  if constexpr (std::is_same_v<T, uint8_t>) return ValueType::U8;
  else if constexpr (std::is_same_v<T, int8_t>) return ValueType::I8;
  else if constexpr (std::is_same_v<T, uint16_t>) return ValueType::U16;
  else if constexpr (std::is_same_v<T, int16_t>) return ValueType::I16;
  else if constexpr (std::is_same_v<T, uint32_t>) return ValueType::U32;
  else if constexpr (std::is_same_v<T, int32_t>) return ValueType::I32;
  else if constexpr (std::is_same_v<T, uint64_t>) return ValueType::U64;
  else if constexpr (std::is_same_v<T, int64_t>) return ValueType::I64;
  else if constexpr (std::is_same_v<T, float>) return ValueType::F32;
  else return ValueType::F64;
}

size_t scalar_bytes(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    default: return 8;  // U64, I64, F64
  }
}

std::string shape_string(const std::vector<uint64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

// ---------------------------------------------------------------- MetaValue

template <typename T>
MetaValue MetaValue::make_scalar(ValueType type, T v) {
  MetaValue m;
  m.type_ = type;
  put<T>(m.scalar_, v);
  return m;
}

MetaValue MetaValue::u8(uint8_t v) { return make_scalar(ValueType::U8, v); }
MetaValue MetaValue::i8(int8_t v) { return make_scalar(ValueType::I8, v); }
MetaValue MetaValue::u16(uint16_t v) { return make_scalar(ValueType::U16, v); }
MetaValue MetaValue::i16(int16_t v) { return make_scalar(ValueType::I16, v); }
MetaValue MetaValue::u32(uint32_t v) { return make_scalar(ValueType::U32, v); }
MetaValue MetaValue::i32(int32_t v) { return make_scalar(ValueType::I32, v); }
MetaValue MetaValue::u64(uint64_t v) { return make_scalar(ValueType::U64, v); }
MetaValue MetaValue::i64(int64_t v) { return make_scalar(ValueType::I64, v); }
MetaValue MetaValue::f32(float v) { return make_scalar(ValueType::F32, v); }
MetaValue MetaValue::f64(double v) { return make_scalar(ValueType::F64, v); }

MetaValue MetaValue::boolean(bool v) {
  MetaValue m;
  m.type_ = ValueType::BOOL;
  m.scalar_.push_back(v ? 1 : 0);
  return m;
}

MetaValue MetaValue::string(std::string v) {
  MetaValue m;
  m.type_ = ValueType::STRING;
  m.str_ = std::move(v);
  return m;
}

template <typename T>
MetaValue MetaValue::make_array(std::span<const T> v) {
  MetaValue m;
  m.type_ = ValueType::ARRAY;
  m.elem_type_ = value_type_of<T>();
  m.count_ = v.size();
  m.raw_elems_.resize(v.size_bytes());
  if (!v.empty()) std::memcpy(m.raw_elems_.data(), v.data(), v.size_bytes());
  return m;
}

MetaValue MetaValue::array(std::span<const uint8_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const int8_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const uint16_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const int16_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const uint32_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const int32_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const uint64_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const int64_t> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const float> v) { return make_array(v); }
MetaValue MetaValue::array(std::span<const double> v) { return make_array(v); }

MetaValue MetaValue::bool_array(const std::vector<bool>& v) {
  MetaValue m;
  m.type_ = ValueType::ARRAY;
  m.elem_type_ = ValueType::BOOL;
  m.count_ = v.size();
  for (bool b : v) m.raw_elems_.push_back(b ? 1 : 0);
  return m;
}

MetaValue MetaValue::string_array(std::vector<std::string> v) {
  MetaValue m;
  m.type_ = ValueType::ARRAY;
  m.elem_type_ = ValueType::STRING;
  m.count_ = v.size();
  m.strings_ = std::move(v);
  return m;
}

MetaValue MetaValue::array_of_arrays(std::vector<MetaValue> v) {
  for (const MetaValue& e : v)
    if (e.type_ != ValueType::ARRAY)
      throw Error(std::string("array_of_arrays: element is ") + value_type_name(e.type_) +
                  ", expected an array");
  MetaValue m;
  m.type_ = ValueType::ARRAY;
  m.elem_type_ = ValueType::ARRAY;
  m.count_ = v.size();
  m.arrays_ = std::move(v);
  return m;
}

MetaValue MetaValue::copy_of(const Value& v) {
  switch (v.type) {
    case ValueType::U8: return u8(static_cast<uint8_t>(v.u));
    case ValueType::I8: return i8(static_cast<int8_t>(v.i));
    case ValueType::U16: return u16(static_cast<uint16_t>(v.u));
    case ValueType::I16: return i16(static_cast<int16_t>(v.i));
    case ValueType::U32: return u32(static_cast<uint32_t>(v.u));
    case ValueType::I32: return i32(static_cast<int32_t>(v.i));
    case ValueType::U64: return u64(v.u);
    case ValueType::I64: return i64(v.i);
    case ValueType::F32: return f32(static_cast<float>(v.f));
    case ValueType::F64: return f64(v.f);
    case ValueType::BOOL: return boolean(v.u != 0);
    case ValueType::STRING: return string(std::string(v.str));
    case ValueType::ARRAY: break;
  }
  if (v.elem_type == ValueType::STRING)
    return string_array(std::vector<std::string>(v.strings.begin(), v.strings.end()));
  if (v.elem_type == ValueType::ARRAY) {
    std::vector<MetaValue> inner;
    inner.reserve(v.nested.size());
    for (const Value& n : v.nested) inner.push_back(copy_of(n));
    return array_of_arrays(std::move(inner));
  }
  MetaValue m;
  m.type_ = ValueType::ARRAY;
  m.elem_type_ = v.elem_type;
  m.count_ = v.count;
  // Scalar elements are kept as raw little-endian bytes by the reader too.
  const size_t elem_size = scalar_bytes(v.elem_type);
  if (v.count > 0) m.raw_elems_.assign(v.elems, v.elems + v.count * elem_size);
  return m;
}

uint64_t MetaValue::element_count() const { return type_ == ValueType::ARRAY ? count_ : 0; }

uint64_t MetaValue::encoded_size() const {
  switch (type_) {
    case ValueType::STRING: return 8 + str_.size();
    case ValueType::ARRAY: {
      uint64_t n = 4 + 8;
      if (elem_type_ == ValueType::STRING) {
        for (const std::string& s : strings_) n += 8 + s.size();
      } else if (elem_type_ == ValueType::ARRAY) {
        for (const MetaValue& a : arrays_) n += a.encoded_size();
      } else {
        n += raw_elems_.size();
      }
      return n;
    }
    default: return scalar_.size();
  }
}

void MetaValue::encode(std::vector<uint8_t>& out) const {
  switch (type_) {
    case ValueType::STRING: put_string(out, str_); return;
    case ValueType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(elem_type_));
      put<uint64_t>(out, count_);
      if (elem_type_ == ValueType::STRING) {
        for (const std::string& s : strings_) put_string(out, s);
      } else if (elem_type_ == ValueType::ARRAY) {
        for (const MetaValue& a : arrays_) a.encode(out);
      } else {
        out.insert(out.end(), raw_elems_.begin(), raw_elems_.end());
      }
      return;
    default: out.insert(out.end(), scalar_.begin(), scalar_.end()); return;
  }
}

// ---------------------------------------------------------------- sinks

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, size_t n) = 0;
  void zeros(uint64_t n) {
    static const uint8_t kZeros[256] = {};
    while (n > 0) {
      size_t k = static_cast<size_t>(std::min<uint64_t>(n, sizeof(kZeros)));
      write(kZeros, k);
      n -= k;
    }
  }
};

namespace {

class VectorSink final : public ByteSink {
 public:
  explicit VectorSink(std::vector<uint8_t>& out) : out_(out) {}
  void write(const void* data, size_t n) override {
    auto* p = static_cast<const uint8_t*>(data);
    out_.insert(out_.end(), p, p + n);
  }

 private:
  std::vector<uint8_t>& out_;
};

// Buffered file output; errors carry the file name.
class FileSink final : public ByteSink {
 public:
  explicit FileSink(std::string path) : path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "wb");
    if (!file_) fail("cannot create");
    buffer_.resize(1 << 20);
    std::setvbuf(file_, buffer_.data(), _IOFBF, buffer_.size());
  }
  ~FileSink() override {
    if (file_) std::fclose(file_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  void write(const void* data, size_t n) override {
    if (n > 0 && std::fwrite(data, 1, n, file_) != n) fail("write failed");
  }
  // Flushes and closes, reporting errors a destructor could not.
  void close() {
    std::FILE* f = file_;
    file_ = nullptr;
    if (std::fflush(f) != 0) {
      int err = errno;
      std::fclose(f);
      errno = err;
      fail("write failed");
    }
    if (std::fclose(f) != 0) fail("close failed");
  }

 private:
  [[noreturn]] void fail(const char* what) const {
    throw Error(path_ + ": " + what + ": " + std::strerror(errno));
  }
  std::string path_;
  std::FILE* file_ = nullptr;
  std::vector<char> buffer_;
};

}  // namespace

// ---------------------------------------------------------------- Writer

struct Writer::Tensor {
  enum class Source { Bytes, View, F32, Rows };
  std::string name;
  std::vector<uint64_t> shape;
  DType type = DType::F32;
  uint64_t n_bytes = 0;
  Source source = Source::Bytes;
  std::vector<uint8_t> bytes;
  std::span<const uint8_t> view;
  std::vector<float> values;
  RowGenerator generate;

  uint64_t n_elements() const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return n;
  }
};

Writer::Writer() = default;
Writer::~Writer() = default;

void Writer::set(const std::string& key, MetaValue value) {
  if (key.empty()) throw Error("gguf writer: empty metadata key");
  if (key == "general.alignment") {
    if (value.type() != ValueType::U32)
      throw Error("gguf writer: general.alignment must be a u32 (ggml requires it)");
    std::vector<uint8_t> enc;
    value.encode(enc);
    uint32_t a;
    std::memcpy(&a, enc.data(), 4);
    if (a == 0 || (a & (a - 1)) != 0)
      throw Error("gguf writer: general.alignment " + std::to_string(a) + " is not a power of two");
    alignment_ = a;
  }
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kv_[it->second].second = std::move(value);
    return;
  }
  kv_index_.emplace(key, kv_.size());
  kv_.emplace_back(key, std::move(value));
}

bool Writer::has(const std::string& key) const { return kv_index_.count(key) != 0; }

size_t Writer::tensor_count() const { return tensors_.size(); }

void Writer::add(std::unique_ptr<Tensor> t) {
  const std::string where = "gguf writer: tensor '" + t->name + "'";
  if (t->name.empty()) throw Error("gguf writer: empty tensor name");
  if (t->name.size() > kMaxTensorName)
    throw Error(where + ": name longer than " + std::to_string(kMaxTensorName) + " bytes");
  if (tensor_index_.count(t->name)) throw Error(where + ": added twice");
  if (t->shape.empty() || t->shape.size() > kMaxDims)
    throw Error(where + ": needs 1 to 4 dimensions, got " + std::to_string(t->shape.size()));
  for (uint64_t d : t->shape)
    if (d == 0) throw Error(where + ": zero dimension in shape " + shape_string(t->shape));
  auto info = dtype_info(static_cast<uint32_t>(t->type));
  if (!info) throw Error(where + ": unknown type " + dtype_name(static_cast<uint32_t>(t->type)));
  if (t->shape[0] % info->block_elems != 0)
    throw Error(where + ": row length " + std::to_string(t->shape[0]) + " is not a multiple of the " +
                info->name + " block size " + std::to_string(info->block_elems));
  t->n_bytes = t->n_elements() / info->block_elems * info->block_bytes;

  switch (t->source) {
    case Tensor::Source::Bytes:
    case Tensor::Source::View: {
      uint64_t have = t->source == Tensor::Source::Bytes ? t->bytes.size() : t->view.size();
      if (have != t->n_bytes)
        throw Error(where + ": " + std::to_string(have) + " bytes given, " + info->name + " " +
                    shape_string(t->shape) + " needs " + std::to_string(t->n_bytes));
      break;
    }
    case Tensor::Source::F32:
      if (t->values.size() != t->n_elements())
        throw Error(where + ": " + std::to_string(t->values.size()) + " values given, shape " +
                    shape_string(t->shape) + " has " + std::to_string(t->n_elements()));
      [[fallthrough]];
    case Tensor::Source::Rows:
      if (!quantize_supported(t->type))
        throw Error(where + ": cannot convert f32 data to " + info->name);
      if (t->source == Tensor::Source::Rows && !t->generate)
        throw Error(where + ": no row generator");
      break;
  }
  tensor_index_.emplace(t->name, tensors_.size());
  tensors_.push_back(std::move(t));
}

void Writer::add_tensor(const std::string& name, std::vector<uint64_t> shape, DType type,
                        std::vector<uint8_t> bytes) {
  auto t = std::make_unique<Tensor>();
  t->name = name;
  t->shape = std::move(shape);
  t->type = type;
  t->source = Tensor::Source::Bytes;
  t->bytes = std::move(bytes);
  add(std::move(t));
}

void Writer::add_tensor_view(const std::string& name, std::vector<uint64_t> shape, DType type,
                             std::span<const uint8_t> bytes) {
  auto t = std::make_unique<Tensor>();
  t->name = name;
  t->shape = std::move(shape);
  t->type = type;
  t->source = Tensor::Source::View;
  t->view = bytes;
  add(std::move(t));
}

void Writer::add_tensor_f32(const std::string& name, std::vector<uint64_t> shape, DType type,
                            std::vector<float> values) {
  auto t = std::make_unique<Tensor>();
  t->name = name;
  t->shape = std::move(shape);
  t->type = type;
  t->source = Tensor::Source::F32;
  t->values = std::move(values);
  add(std::move(t));
}

void Writer::add_tensor_rows(const std::string& name, std::vector<uint64_t> shape, DType type,
                             RowGenerator generate) {
  auto t = std::make_unique<Tensor>();
  t->name = name;
  t->shape = std::move(shape);
  t->type = type;
  t->source = Tensor::Source::Rows;
  t->generate = std::move(generate);
  add(std::move(t));
}

void Writer::emit(ByteSink& sink) const {
  // Everything before the tensor data is small (the vocabulary is the bulk),
  // so it is assembled in memory and written at once.
  std::vector<uint8_t> header;
  put<uint32_t>(header, kMagic);
  put<uint32_t>(header, kVersion);
  put<uint64_t>(header, tensors_.size());
  put<uint64_t>(header, kv_.size());
  for (const auto& [key, value] : kv_) {
    put_string(header, key);
    put<uint32_t>(header, static_cast<uint32_t>(value.type()));
    value.encode(header);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(header, t->name);
    put<uint32_t>(header, static_cast<uint32_t>(t->shape.size()));
    for (uint64_t d : t->shape) put<uint64_t>(header, d);
    put<uint32_t>(header, static_cast<uint32_t>(t->type));
    put<uint64_t>(header, offset);
    offset += align_up(t->n_bytes, alignment_);
  }
  header.resize(align_up(header.size(), alignment_), 0);
  sink.write(header.data(), header.size());
  header = {};

  std::vector<float> row;
  std::vector<uint8_t> converted;
  for (const auto& t : tensors_) {
    const uint64_t row_len = t->shape[0];
    const uint64_t rows = t->n_elements() / row_len;
    switch (t->source) {
      case Tensor::Source::Bytes: sink.write(t->bytes.data(), t->bytes.size()); break;
      case Tensor::Source::View: sink.write(t->view.data(), t->view.size()); break;
      case Tensor::Source::F32:
      case Tensor::Source::Rows: {
        const size_t row_bytes = dtype_row_bytes(t->type, row_len);
        converted.resize(row_bytes);
        row.resize(row_len);
        for (uint64_t r = 0; r < rows; ++r) {
          const float* src;
          if (t->source == Tensor::Source::F32) {
            src = t->values.data() + r * row_len;
          } else {
            t->generate(static_cast<int64_t>(r), std::span<float>(row));
            src = row.data();
          }
          quantize_row(t->type, src, converted.data(), static_cast<int64_t>(row_len));
          sink.write(converted.data(), row_bytes);
        }
        break;
      }
    }
    sink.zeros(align_up(t->n_bytes, alignment_) - t->n_bytes);
  }
}

void Writer::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  try {
    FileSink sink(tmp);
    emit(sink);
    sink.close();
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    throw Error(path + ": cannot rename the finished file into place: " + why);
  }
}

std::vector<uint8_t> Writer::to_bytes() const {
  std::vector<uint8_t> out;
  VectorSink sink(out);
  emit(sink);
  return out;
}

}  // namespace reprise::gguf
