#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/error.h"

namespace reprise::gguf {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;
constexpr int kMaxArrayDepth = 4;

size_t scalar_size(ValueType t) {
  switch (t) {
    case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
    case ValueType::U16: case ValueType::I16: return 2;
    case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
    case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
    default: return 0;
  }
}

// Bounds-checked little-endian cursor over the file image.
class Cursor {
 public:
  Cursor(const File& file, const uint8_t* base, uint64_t size)
      : file_(file), base_(base), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const char* what) {
    if (n > remaining())
      file_.fail(std::string("truncated file while reading ") + what + " at offset " +
                 std::to_string(pos_));
  }
  template <typename T>
  T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view read_string(const char* what) {
    uint64_t len = read<uint64_t>(what);
    need(len, what);
    std::string_view s(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return s;
  }
  const uint8_t* take(uint64_t n, const char* what) {
    need(n, what);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const File& file_;
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool valid_value_type(uint32_t t) { return t <= 12; }

void read_value(const File& file, Cursor& cur, ValueType type, Value& out, int depth,
                const std::string& key) {
  out.type = type;
  switch (type) {
    case ValueType::U8: out.u = cur.read<uint8_t>("value"); break;
    case ValueType::I8: out.i = cur.read<int8_t>("value"); break;
    case ValueType::U16: out.u = cur.read<uint16_t>("value"); break;
    case ValueType::I16: out.i = cur.read<int16_t>("value"); break;
    case ValueType::U32: out.u = cur.read<uint32_t>("value"); break;
    case ValueType::I32: out.i = cur.read<int32_t>("value"); break;
    case ValueType::U64: out.u = cur.read<uint64_t>("value"); break;
    case ValueType::I64: out.i = cur.read<int64_t>("value"); break;
    case ValueType::F32: out.f = cur.read<float>("value"); break;
    case ValueType::F64: out.f = cur.read<double>("value"); break;
    case ValueType::BOOL: {
      uint8_t b = cur.read<uint8_t>("value");
      if (b > 1) file.fail("metadata key '" + key + "': invalid bool value " + std::to_string(b));
      out.u = b;
      break;
    }
    case ValueType::STRING: out.str = cur.read_string("string value"); break;
    case ValueType::ARRAY: {
      if (depth >= kMaxArrayDepth) file.fail("metadata key '" + key + "': arrays nested too deeply");
      uint32_t et = cur.read<uint32_t>("array type");
      if (!valid_value_type(et))
        file.fail("metadata key '" + key + "': unknown array element type " + std::to_string(et));
      out.elem_type = static_cast<ValueType>(et);
      out.count = cur.read<uint64_t>("array length");
      if (size_t es = scalar_size(out.elem_type)) {
        if (out.count > cur.remaining() / es)
          file.fail("metadata key '" + key + "': array length " + std::to_string(out.count) +
                    " exceeds the file");
        out.elems = cur.take(out.count * es, "array data");
      } else if (out.elem_type == ValueType::STRING) {
        if (out.count > cur.remaining() / 8)
          file.fail("metadata key '" + key + "': array length " + std::to_string(out.count) +
                    " exceeds the file");
        out.strings.reserve(out.count);
        for (uint64_t k = 0; k < out.count; ++k) out.strings.push_back(cur.read_string("array string"));
      } else {  // nested arrays
        if (out.count > cur.remaining() / 12)
          file.fail("metadata key '" + key + "': array length " + std::to_string(out.count) +
                    " exceeds the file");
        // Grown as elements parse (not sized from the untrusted count), so a
        // lying count cannot make the reader allocate far more than the file.
        for (uint64_t k = 0; k < out.count; ++k) {
          Value inner;
          read_value(file, cur, ValueType::ARRAY, inner, depth + 1, key);
          out.nested.push_back(std::move(inner));
        }
      }
      break;
    }
  }
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

int64_t elem_as_int(ValueType t, const uint8_t* p) {
  switch (t) {
    case ValueType::U8: return load<uint8_t>(p);
    case ValueType::I8: return load<int8_t>(p);
    case ValueType::U16: return load<uint16_t>(p);
    case ValueType::I16: return load<int16_t>(p);
    case ValueType::U32: return load<uint32_t>(p);
    case ValueType::I32: return load<int32_t>(p);
    case ValueType::U64: return static_cast<int64_t>(load<uint64_t>(p));
    case ValueType::I64: return load<int64_t>(p);
    case ValueType::BOOL: return load<uint8_t>(p);
    case ValueType::F32: return static_cast<int64_t>(load<float>(p));
    case ValueType::F64: return static_cast<int64_t>(load<double>(p));
    default: return 0;
  }
}

double elem_as_double(ValueType t, const uint8_t* p) {
  if (t == ValueType::F32) return load<float>(p);
  if (t == ValueType::F64) return load<double>(p);
  return static_cast<double>(elem_as_int(t, p));
}

}  // namespace

const char* value_type_name(ValueType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                "bool", "string", "array", "u64", "i64", "f64"};
  auto i = static_cast<uint32_t>(t);
  return i <= 12 ? names[i] : "unknown";
}

bool Value::is_integer() const {
  switch (type) {
    case ValueType::U8: case ValueType::I8: case ValueType::U16: case ValueType::I16:
    case ValueType::U32: case ValueType::I32: case ValueType::U64: case ValueType::I64:
    case ValueType::BOOL:
      return true;
    default:
      return false;
  }
}

bool Value::is_float() const { return type == ValueType::F32 || type == ValueType::F64; }

int64_t Value::as_int(std::string_view key) const {
  switch (type) {
    case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
    case ValueType::BOOL:
      return static_cast<int64_t>(u);
    case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
      return i;
    default:
      throw Error("metadata key '" + std::string(key) + "' is " + value_type_name(type) +
                  ", expected an integer");
  }
}

double Value::as_double(std::string_view key) const {
  if (is_float()) return f;
  if (is_integer()) return static_cast<double>(as_int(key));
  throw Error("metadata key '" + std::string(key) + "' is " + value_type_name(type) +
              ", expected a number");
}

std::vector<int64_t> Value::int_array(std::string_view key) const {
  if (type != ValueType::ARRAY || !elems || elem_type == ValueType::F32 || elem_type == ValueType::F64)
    throw Error("metadata key '" + std::string(key) + "' is not an integer array");
  std::vector<int64_t> out(count);
  size_t es = scalar_size(elem_type);
  for (uint64_t k = 0; k < count; ++k) out[k] = elem_as_int(elem_type, elems + k * es);
  return out;
}

std::vector<float> Value::float_array(std::string_view key) const {
  if (type != ValueType::ARRAY || !elems)
    throw Error("metadata key '" + std::string(key) + "' is not a numeric array");
  std::vector<float> out(count);
  size_t es = scalar_size(elem_type);
  for (uint64_t k = 0; k < count; ++k) out[k] = static_cast<float>(elem_as_double(elem_type, elems + k * es));
  return out;
}

uint64_t TensorInfo::n_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

void File::fail(const std::string& what) const { throw Error(path_ + ": " + what); }

std::unique_ptr<File> File::open(const std::string& path) {
  std::unique_ptr<File> f(new File());  // private constructor
  f->path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) f->fail(std::string("cannot open: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    f->fail("not a regular file");
  }
  f->size_ = static_cast<uint64_t>(st.st_size);
  if (f->size_ == 0) {
    ::close(fd);
    f->fail("empty file (not a GGUF file)");
  }
  void* m = ::mmap(nullptr, f->size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED) f->fail(std::string("mmap failed: ") + std::strerror(errno));
  f->base_ = static_cast<const uint8_t*>(m);
  f->mapped_ = true;
  f->parse();
  return f;
}

std::unique_ptr<File> File::from_bytes(std::span<const uint8_t> bytes, const std::string& name) {
  std::unique_ptr<File> f(new File());
  f->path_ = name;
  // Over-align the copy (a vector only guarantees malloc alignment) so tensor
  // data aligned in the file is also aligned in memory, as with a mapping.
  constexpr size_t kCopyAlignment = 64;
  f->owned_.resize(bytes.size() + kCopyAlignment);
  const auto addr = reinterpret_cast<uintptr_t>(f->owned_.data());
  uint8_t* base = f->owned_.data() + (kCopyAlignment - addr % kCopyAlignment) % kCopyAlignment;
  if (!bytes.empty()) std::memcpy(base, bytes.data(), bytes.size());
  f->base_ = base;
  f->size_ = bytes.size();
  f->parse();
  return f;
}

File::~File() {
  if (mapped_ && base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

void File::release_resident() const {
  // A read-only file mapping: MADV_DONTNEED only unmaps the pages, whose
  // contents stay the file's. Best effort: a failure leaves them resident.
  if (mapped_ && base_) ::madvise(const_cast<uint8_t*>(base_), size_, MADV_DONTNEED);
}

void File::parse() {
  Cursor cur(*this, base_, size_);
  if (size_ < 4) fail("file too small to be GGUF (" + std::to_string(size_) + " bytes)");
  uint32_t magic = cur.read<uint32_t>("magic");
  if (magic != kMagic) fail("bad magic: not a GGUF file");
  version_ = cur.read<uint32_t>("version");
  if (version_ != 2 && version_ != 3)
    fail("unsupported GGUF version " + std::to_string(version_) + " (supported: 2, 3)");
  uint64_t n_tensors = cur.read<uint64_t>("tensor count");
  uint64_t n_kv = cur.read<uint64_t>("metadata count");
  // Each KV needs at least 8 (key length) + 4 (type) + 1 bytes; each tensor info 8+4+8+4+8.
  if (n_kv > cur.remaining() / 13) fail("metadata count " + std::to_string(n_kv) + " exceeds the file");
  if (n_tensors > cur.remaining() / 32) fail("tensor count " + std::to_string(n_tensors) + " exceeds the file");

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key(cur.read_string("metadata key"));
    uint32_t t = cur.read<uint32_t>("metadata type");
    if (!valid_value_type(t)) fail("metadata key '" + key + "': unknown value type " + std::to_string(t));
    Value v;
    read_value(*this, cur, static_cast<ValueType>(t), v, 0, key);
    if (!kv_.emplace(key, std::move(v)).second) fail("duplicate metadata key '" + key + "'");
  }

  if (const Value* a = find("general.alignment")) {
    if (!a->is_integer() || a->type == ValueType::BOOL)
      fail(std::string("general.alignment must be an integer, not ") + value_type_name(a->type));
    int64_t al = a->as_int("general.alignment");
    if (al <= 0 || al > (1 << 20) || (al & (al - 1)) != 0)
      fail("invalid general.alignment " + std::to_string(al));
    alignment_ = static_cast<uint64_t>(al);
  }

  tensors_.resize(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    TensorInfo& t = tensors_[k];
    t.name = std::string(cur.read_string("tensor name"));
    uint32_t n_dims = cur.read<uint32_t>("tensor dims");
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("tensor '" + t.name + "': invalid number of dimensions " + std::to_string(n_dims));
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t dim = cur.read<uint64_t>("tensor shape");
      if (dim == 0 || dim > (uint64_t(1) << 40))
        fail("tensor '" + t.name + "': invalid dimension " + std::to_string(dim));
      if (elems > (uint64_t(1) << 50) / dim) fail("tensor '" + t.name + "': element count overflows");
      elems *= dim;
      t.shape.push_back(dim);
    }
    t.raw_type = cur.read<uint32_t>("tensor type");
    auto info = dtype_info(t.raw_type);
    if (!info) fail("tensor '" + t.name + "': unknown tensor type " + std::to_string(t.raw_type));
    t.type = static_cast<DType>(t.raw_type);
    if (t.shape[0] % info->block_elems != 0)
      fail("tensor '" + t.name + "': row length " + std::to_string(t.shape[0]) +
           " is not a multiple of the " + info->name + " block size");
    t.n_bytes = elems / info->block_elems * info->block_bytes;
    t.offset = cur.read<uint64_t>("tensor offset");
    if (t.offset % alignment_ != 0)
      fail("tensor '" + t.name + "': data offset " + std::to_string(t.offset) + " is misaligned");
    if (!tensor_index_.emplace(t.name, k).second) fail("duplicate tensor name '" + t.name + "'");
  }

  uint64_t data_start = (cur.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (n_tensors > 0 && data_start > size_) fail("truncated file: data section missing");
  uint64_t data_size = size_ - std::min(data_start, size_);
  for (TensorInfo& t : tensors_) {
    if (t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail("tensor '" + t.name + "': data [" + std::to_string(t.offset) + ", +" +
           std::to_string(t.n_bytes) + ") lies outside the file (truncated?)");
    t.data = base_ + data_start + t.offset;
  }
}

const Value* File::find(std::string_view key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<std::string> File::get_string(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::STRING)
    fail("metadata key '" + std::string(key) + "' is " + value_type_name(v->type) + ", expected string");
  return std::string(v->str);
}

std::optional<int64_t> File::get_int(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer())
    fail("metadata key '" + std::string(key) + "' is " + value_type_name(v->type) + ", expected integer");
  return v->as_int(key);
}

std::optional<double> File::get_float(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_float() && !v->is_integer())
    fail("metadata key '" + std::string(key) + "' is " + value_type_name(v->type) + ", expected number");
  return v->as_double(key);
}

std::optional<bool> File::get_bool(std::string_view key) const {
  const Value* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != ValueType::BOOL)
    fail("metadata key '" + std::string(key) + "' is " + value_type_name(v->type) + ", expected bool");
  return v->u != 0;
}

std::string File::require_string(std::string_view key) const {
  auto v = get_string(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  return *v;
}

int64_t File::require_int(std::string_view key) const {
  auto v = get_int(key);
  if (!v) fail("missing metadata key '" + std::string(key) + "'");
  return *v;
}

const TensorInfo* File::tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& File::require_tensor(std::string_view name) const {
  const TensorInfo* t = tensor(name);
  if (!t) fail("missing tensor '" + std::string(name) + "'");
  return *t;
}

}  // namespace reprise::gguf
