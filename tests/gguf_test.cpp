// GGUF reader validation, writer round trips, reference quantizers, mutation
// fuzzing of the reader and the synthetic model maker.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <set>

#include "engine/flat_memory.h"
#include "engine/model_bundle.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "model/model.h"
#include "model/synthetic_model.h"
#include "tensor/kernels.h"
#include "tensor/fp16.h"
#include "tensor/quantize.h"
#include "tensor/thread_pool.h"
#include "test_support.h"
#include "util/error.h"

using namespace reprise;
using gguf::File;
using gguf::MetaValue;
using gguf::ValueType;
using gguf::Writer;
namespace fs = std::filesystem;

namespace {

using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------- helpers

template <typename T>
T load_le(const Bytes& b, size_t pos) {
  T v;
  std::memcpy(&v, b.data() + pos, sizeof(T));
  return v;
}
template <typename T>
void store_le(Bytes& b, size_t pos, T v) {
  std::memcpy(b.data() + pos, &v, sizeof(T));
}

Bytes read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// A scratch directory removed at the end of the test.
class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("reprise-gguf-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

// Where every field of a (valid) GGUF image sits, so tests can corrupt a
// specific one. Built by an independent walker, not by the reader under test.
struct KvLayout {
  std::string key;
  size_t key_len_pos = 0;
  size_t type_pos = 0;
  size_t value_pos = 0;
  ValueType type = ValueType::U8;
};
struct TensorLayout {
  std::string name;
  size_t name_len_pos = 0;
  size_t n_dims_pos = 0;
  std::vector<size_t> dim_pos;
  size_t type_pos = 0;
  size_t offset_pos = 0;
};
struct Layout {
  size_t n_tensors_pos = 8, n_kv_pos = 16;
  std::vector<KvLayout> kv;
  std::vector<TensorLayout> tensors;
  std::vector<size_t> u64_fields;  // string lengths, array counts, dims, offsets, counts
  std::vector<size_t> u32_fields;  // value types, element types, n_dims, tensor types
  size_t tensor_infos_pos = 0;
  size_t header_end = 0;

  const KvLayout& key(const std::string& k) const {
    for (const KvLayout& kv_entry : kv)
      if (kv_entry.key == k) return kv_entry;
    throw std::runtime_error("no key " + k);
  }
  const TensorLayout& tensor(const std::string& n) const {
    for (const TensorLayout& t : tensors)
      if (t.name == n) return t;
    throw std::runtime_error("no tensor " + n);
  }
};

class LayoutWalker {
 public:
  explicit LayoutWalker(const Bytes& b) : b_(b) {}

  Layout walk() {
    Layout l;
    pos_ = 8;
    l.u64_fields.push_back(8);
    l.u64_fields.push_back(16);
    uint64_t n_tensors = u64(), n_kv = u64();
    for (uint64_t k = 0; k < n_kv; ++k) {
      KvLayout kv;
      kv.key_len_pos = pos_;
      kv.key = string(l);
      kv.type_pos = pos_;
      l.u32_fields.push_back(pos_);
      kv.type = static_cast<ValueType>(u32());
      kv.value_pos = pos_;
      value(kv.type, l);
      l.kv.push_back(kv);
    }
    l.tensor_infos_pos = pos_;
    for (uint64_t k = 0; k < n_tensors; ++k) {
      TensorLayout t;
      t.name_len_pos = pos_;
      t.name = string(l);
      t.n_dims_pos = pos_;
      l.u32_fields.push_back(pos_);
      uint32_t n_dims = u32();
      for (uint32_t d = 0; d < n_dims; ++d) {
        t.dim_pos.push_back(pos_);
        l.u64_fields.push_back(pos_);
        u64();
      }
      t.type_pos = pos_;
      l.u32_fields.push_back(pos_);
      u32();
      t.offset_pos = pos_;
      l.u64_fields.push_back(pos_);
      u64();
      l.tensors.push_back(t);
    }
    l.header_end = pos_;
    return l;
  }

 private:
  uint64_t u64() {
    uint64_t v = load_le<uint64_t>(b_, pos_);
    pos_ += 8;
    return v;
  }
  uint32_t u32() {
    uint32_t v = load_le<uint32_t>(b_, pos_);
    pos_ += 4;
    return v;
  }
  std::string string(Layout& l) {
    l.u64_fields.push_back(pos_);
    uint64_t n = u64();
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), n);
    pos_ += n;
    return s;
  }
  void value(ValueType t, Layout& l) {
    switch (t) {
      case ValueType::U8: case ValueType::I8: case ValueType::BOOL: pos_ += 1; break;
      case ValueType::U16: case ValueType::I16: pos_ += 2; break;
      case ValueType::U32: case ValueType::I32: case ValueType::F32: pos_ += 4; break;
      case ValueType::U64: case ValueType::I64: case ValueType::F64: pos_ += 8; break;
      case ValueType::STRING: string(l); break;
      case ValueType::ARRAY: {
        l.u32_fields.push_back(pos_);
        auto et = static_cast<ValueType>(u32());
        l.u64_fields.push_back(pos_);
        uint64_t n = u64();
        for (uint64_t i = 0; i < n; ++i) value(et, l);
        break;
      }
    }
  }
  const Bytes& b_;
  size_t pos_ = 0;
};

Layout layout_of(const Bytes& b) { return LayoutWalker(b).walk(); }

// Asserts that parsing fails with reprise::Error naming the file and every
// fragment of the expected problem.
void expect_rejected(const Bytes& image, const std::string& name,
                     const std::vector<std::string>& fragments) {
  try {
    File::from_bytes(image, name);
    ADD_FAILURE() << name << ": accepted, expected an error mentioning '" << fragments.at(0) << "'";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(name + ": ", 0), 0u) << "message does not start with the file name: " << msg;
    for (const std::string& f : fragments)
      EXPECT_NE(msg.find(f), std::string::npos) << "message '" << msg << "' lacks '" << f << "'";
  }
}

std::vector<float> bell_values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

Bytes quantized(DType t, const std::vector<float>& v) {
  Bytes out(dtype_row_bytes(t, v.size()));
  quantize_row(t, v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}

// A small image: metadata of several types and two tensors, the last of which
// ends exactly at the end of the file (32 bytes of F32), so that every
// truncation must be detected.
Bytes small_image(std::vector<std::pair<std::string, MetaValue>> extra_kv = {},
                  std::vector<std::string> tensor_names = {"tok.weight", "norm.weight"}) {
  Writer w;
  w.set_string("general.architecture", "llama");
  w.set_u32("llama.block_count", 2);
  w.set_f32("llama.rope.freq_base", 10000.0f);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  std::vector<std::string> tokens = {"<unk>", "a", "b"};
  w.set("tokenizer.ggml.tokens", MetaValue::string_array(tokens));
  std::vector<int32_t> types = {2, 1, 1};
  w.set("tokenizer.ggml.token_type", MetaValue::array(std::span<const int32_t>(types)));
  for (auto& [k, v] : extra_kv) w.set(k, std::move(v));
  std::vector<float> tok = bell_values(32 * 2, 7);
  w.add_tensor_f32(tensor_names.at(0), {32, 2}, DType::Q8_0, tok);
  std::vector<float> norm(8, 1.5f);
  w.add_tensor_f32(tensor_names.at(1), {8}, DType::F32, norm);
  return w.to_bytes();
}

// ---------------------------------------------------------------- reader validation

TEST(GgufReader, AcceptsTheSmallImage) {
  Bytes b = small_image();
  auto f = File::from_bytes(b, "small.gguf");
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->tensors().size(), 2u);
  EXPECT_EQ(f->require_string("general.architecture"), "llama");
  EXPECT_EQ(f->tensor("norm.weight")->data + 32, f->bytes().data() + f->bytes().size())
      << "the last tensor must end the file for the truncation test to be exhaustive";
}

TEST(GgufReader, RejectsBadMagic) {
  Bytes b = small_image();
  b[0] = 'X';
  expect_rejected(b, "magic.gguf", {"bad magic"});
  expect_rejected(Bytes{'G', 'G'}, "tiny.gguf", {"too small"});
  expect_rejected(Bytes{}, "empty.gguf", {"too small"});
}

TEST(GgufReader, RejectsUnsupportedVersions) {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    Bytes b = small_image();
    store_le<uint32_t>(b, 4, v);
    expect_rejected(b, "version.gguf", {"unsupported GGUF version " + std::to_string(v)});
  }
  Bytes b = small_image();
  store_le<uint32_t>(b, 4, 2);  // v2 has the v3 layout
  EXPECT_NO_THROW(File::from_bytes(b, "v2.gguf"));
}

TEST(GgufReader, RejectsTruncationAtEveryOffset) {
  const Bytes b = small_image();
  for (size_t len = 0; len < b.size(); ++len) {
    Bytes cut(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(len));
    const std::string name = "cut" + std::to_string(len) + ".gguf";
    try {
      File::from_bytes(cut, name);
      ADD_FAILURE() << "truncation to " << len << " of " << b.size() << " bytes was accepted";
    } catch (const Error& e) {
      const std::string msg = e.what();
      ASSERT_EQ(msg.rfind(name + ": ", 0), 0u) << msg;
      const bool says_why = msg.find("truncated") != std::string::npos ||
                            msg.find("too small") != std::string::npos ||
                            msg.find("exceeds the file") != std::string::npos ||
                            msg.find("outside the file") != std::string::npos;
      ASSERT_TRUE(says_why) << "at " << len << ": " << msg;
    }
  }
}

TEST(GgufReader, RejectsTensorDataOutsideTheFile) {
  const Bytes base = small_image();
  const Layout l = layout_of(base);
  const TensorLayout& norm = l.tensor("norm.weight");
  {
    Bytes b = base;
    store_le<uint64_t>(b, norm.offset_pos, 1 << 20);
    expect_rejected(b, "offset.gguf", {"tensor 'norm.weight'", "outside the file"});
  }
  {
    Bytes b = base;  // 8 -> 16 floats: runs 32 bytes past the end
    store_le<uint64_t>(b, norm.dim_pos[0], 16);
    expect_rejected(b, "size.gguf", {"tensor 'norm.weight'", "outside the file"});
  }
  {
    Bytes b = base;  // an offset so large that offset + size wraps around
    store_le<uint64_t>(b, norm.offset_pos, ~uint64_t(0) - 31);
    expect_rejected(b, "wrap.gguf", {"tensor 'norm.weight'"});
  }
}

TEST(GgufReader, RejectsOverflowingCounts) {
  const Bytes base = small_image();
  const Layout l = layout_of(base);
  {
    Bytes b = base;
    store_le<uint64_t>(b, l.kv[0].key_len_pos, ~uint64_t(0));
    expect_rejected(b, "keylen.gguf", {"truncated", "metadata key"});
  }
  {
    Bytes b = base;
    store_le<uint64_t>(b, l.key("general.architecture").value_pos, uint64_t(1) << 62);
    expect_rejected(b, "strlen.gguf", {"truncated", "string value"});
  }
  {
    Bytes b = base;  // array counts: strings, then numbers
    store_le<uint64_t>(b, l.key("tokenizer.ggml.tokens").value_pos + 4, uint64_t(1) << 61);
    expect_rejected(b, "strarray.gguf", {"tokenizer.ggml.tokens", "array length", "exceeds the file"});
    b = base;
    store_le<uint64_t>(b, l.key("tokenizer.ggml.token_type").value_pos + 4, ~uint64_t(0) / 2);
    expect_rejected(b, "numarray.gguf", {"tokenizer.ggml.token_type", "array length", "exceeds the file"});
  }
  {
    Bytes b = base;
    store_le<uint64_t>(b, l.n_tensors_pos, ~uint64_t(0));
    expect_rejected(b, "ntensors.gguf", {"tensor count", "exceeds the file"});
    b = base;
    store_le<uint64_t>(b, l.n_kv_pos, uint64_t(1) << 40);
    expect_rejected(b, "nkv.gguf", {"metadata count", "exceeds the file"});
  }
  {
    Bytes b = base;
    store_le<uint64_t>(b, l.tensor("tok.weight").dim_pos[1], uint64_t(1) << 41);
    expect_rejected(b, "dim.gguf", {"tensor 'tok.weight'", "invalid dimension"});
    b = base;
    store_le<uint64_t>(b, l.tensor("tok.weight").dim_pos[0], uint64_t(1) << 35);
    store_le<uint64_t>(b, l.tensor("tok.weight").dim_pos[1], uint64_t(1) << 35);
    expect_rejected(b, "product.gguf", {"tensor 'tok.weight'", "element count overflows"});
    b = base;
    store_le<uint64_t>(b, l.tensor("tok.weight").dim_pos[1], 0);
    expect_rejected(b, "zero.gguf", {"tensor 'tok.weight'", "invalid dimension 0"});
  }
  {
    Bytes b = base;
    store_le<uint32_t>(b, l.tensor("norm.weight").n_dims_pos, 5);
    expect_rejected(b, "ndims.gguf", {"tensor 'norm.weight'", "invalid number of dimensions 5"});
    store_le<uint32_t>(b, l.tensor("norm.weight").n_dims_pos, 0);
    expect_rejected(b, "ndims0.gguf", {"invalid number of dimensions 0"});
  }
}

TEST(GgufReader, RejectsUnknownTensorTypes) {
  const Bytes base = small_image();
  const Layout l = layout_of(base);
  for (uint32_t t : {4u, 5u, 31u, 99u, 0xffffffffu}) {
    Bytes b = base;
    store_le<uint32_t>(b, l.tensor("tok.weight").type_pos, t);
    expect_rejected(b, "ttype.gguf", {"tensor 'tok.weight'", "unknown tensor type " + std::to_string(t)});
  }
  Bytes b = base;  // Q4_K needs rows of 256: a 32-wide Q4_K row is invalid
  store_le<uint32_t>(b, l.tensor("tok.weight").type_pos, static_cast<uint32_t>(DType::Q4_K));
  expect_rejected(b, "block.gguf", {"tensor 'tok.weight'", "not a multiple of the Q4_K block size"});
}

TEST(GgufReader, RejectsUnknownMetadataTypes) {
  const Bytes base = small_image();
  const Layout l = layout_of(base);
  for (uint32_t t : {13u, 100u, 0x80000000u}) {
    Bytes b = base;
    store_le<uint32_t>(b, l.key("llama.block_count").type_pos, t);
    expect_rejected(b, "vtype.gguf",
                    {"metadata key 'llama.block_count'", "unknown value type " + std::to_string(t)});
    b = base;
    store_le<uint32_t>(b, l.key("tokenizer.ggml.token_type").value_pos, t);
    expect_rejected(b, "etype.gguf", {"tokenizer.ggml.token_type", "unknown array element type"});
  }
  Bytes b = base;
  b[l.key("tokenizer.ggml.add_bos_token").value_pos] = 2;
  expect_rejected(b, "bool.gguf", {"tokenizer.ggml.add_bos_token", "invalid bool value 2"});
}

TEST(GgufReader, RejectsMisalignedTensorOffsets) {
  Bytes b = small_image();
  const Layout l = layout_of(b);
  const size_t pos = l.tensor("norm.weight").offset_pos;
  store_le<uint64_t>(b, pos, load_le<uint64_t>(b, pos) + 4);
  expect_rejected(b, "misaligned.gguf", {"tensor 'norm.weight'", "misaligned"});
}

TEST(GgufReader, RejectsDuplicateKeysAndTensors) {
  {
    Bytes b = small_image({{"dup.a", MetaValue::u32(1)}, {"dup.b", MetaValue::u32(2)}});
    const Layout l = layout_of(b);
    b[l.key("dup.b").key_len_pos + 8 + 4] = 'a';
    expect_rejected(b, "dupkey.gguf", {"duplicate metadata key 'dup.a'"});
  }
  {
    Bytes b = small_image({}, {"w.a", "w.b"});
    const Layout l = layout_of(b);
    b[l.tensor("w.b").name_len_pos + 8 + 2] = 'a';
    expect_rejected(b, "duptensor.gguf", {"duplicate tensor name 'w.a'"});
  }
}

TEST(GgufReader, RejectsBadAlignmentValues) {
  // The writer refuses bad alignments, so write a look-alike key and rename it.
  auto with_alignment = [](MetaValue v) {
    Bytes b = small_image({{"general.alignmenX", std::move(v)}});
    const Layout l = layout_of(b);
    b[l.key("general.alignmenX").key_len_pos + 8 + 16] = 't';
    return b;
  };
  for (uint32_t a : {0u, 3u, 48u, 1u << 30}) {
    expect_rejected(with_alignment(MetaValue::u32(a)), "align.gguf",
                    {"invalid general.alignment " + std::to_string(a)});
  }
  expect_rejected(with_alignment(MetaValue::i32(-32)), "align.gguf", {"invalid general.alignment -32"});
  expect_rejected(with_alignment(MetaValue::string("32")), "align.gguf",
                  {"general.alignment must be an integer"});
  expect_rejected(with_alignment(MetaValue::boolean(true)), "align.gguf",
                  {"general.alignment must be an integer"});
  expect_rejected(with_alignment(MetaValue::f32(32.0f)), "align.gguf",
                  {"general.alignment must be an integer"});
  // A valid but different alignment moves the data: 32-aligned offsets are
  // then misaligned for a 64-byte alignment unless they happen to be 0.
  expect_rejected(with_alignment(MetaValue::u32(64)), "align64.gguf", {"misaligned"});
}

TEST(GgufReader, RejectsArraysNestedTooDeeply) {
  MetaValue v = MetaValue::array(std::span<const int32_t>());
  for (int depth = 0; depth < 6; ++depth) {
    std::vector<MetaValue> one;
    one.push_back(std::move(v));
    v = MetaValue::array_of_arrays(std::move(one));
  }
  Bytes b = small_image({{"deep", std::move(v)}});
  expect_rejected(b, "deep.gguf", {"metadata key 'deep'", "nested too deeply"});
}

TEST(GgufReader, InMemoryTensorDataIsAligned) {
  Bytes b = small_image();
  for (size_t shift = 0; shift < 4; ++shift) {
    // Copy from differently aligned sources: the reader's own copy is aligned.
    Bytes padded(shift, 0);
    padded.insert(padded.end(), b.begin(), b.end());
    auto f = File::from_bytes(std::span<const uint8_t>(padded).subspan(shift), "aligned.gguf");
    for (const auto& t : f->tensors())
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 32, 0u) << t.name;
  }
}

// ---------------------------------------------------------------- writer round trip

TEST(GgufWriter, RoundTripsEveryMetadataType) {
  Writer w;
  w.set("u8", MetaValue::u8(255));
  w.set("i8", MetaValue::i8(-128));
  w.set("u16", MetaValue::u16(65535));
  w.set("i16", MetaValue::i16(-32768));
  w.set("u32", MetaValue::u32(4294967295u));
  w.set("i32", MetaValue::i32(std::numeric_limits<int32_t>::min()));
  w.set("u64", MetaValue::u64(std::numeric_limits<uint64_t>::max()));
  w.set("i64", MetaValue::i64(std::numeric_limits<int64_t>::min()));
  w.set("f32", MetaValue::f32(-1.5e-7f));
  w.set("f64", MetaValue::f64(3.141592653589793));
  w.set("bool.t", MetaValue::boolean(true));
  w.set("bool.f", MetaValue::boolean(false));
  w.set("str", MetaValue::string(std::string("caf\xC3\xA9 \xE2\x96\x81 with\0nul", 17)));
  w.set("str.empty", MetaValue::string(""));
  const std::vector<uint8_t> au8 = {0, 1, 255};
  const std::vector<int8_t> ai8 = {-128, 0, 127};
  const std::vector<uint16_t> au16 = {0, 65535};
  const std::vector<int16_t> ai16 = {-32768, 32767};
  const std::vector<uint32_t> au32 = {1, 2, 4294967295u};
  const std::vector<int32_t> ai32 = {-7, 0, 7, std::numeric_limits<int32_t>::max()};
  const std::vector<uint64_t> au64 = {std::numeric_limits<uint64_t>::max() / 3};
  const std::vector<int64_t> ai64 = {std::numeric_limits<int64_t>::min(), -1};
  const std::vector<float> af32 = {0.5f, -0.25f, 1e30f};
  const std::vector<double> af64 = {1e-300, -2.5};
  w.set("a.u8", MetaValue::array(std::span<const uint8_t>(au8)));
  w.set("a.i8", MetaValue::array(std::span<const int8_t>(ai8)));
  w.set("a.u16", MetaValue::array(std::span<const uint16_t>(au16)));
  w.set("a.i16", MetaValue::array(std::span<const int16_t>(ai16)));
  w.set("a.u32", MetaValue::array(std::span<const uint32_t>(au32)));
  w.set("a.i32", MetaValue::array(std::span<const int32_t>(ai32)));
  w.set("a.u64", MetaValue::array(std::span<const uint64_t>(au64)));
  w.set("a.i64", MetaValue::array(std::span<const int64_t>(ai64)));
  w.set("a.f32", MetaValue::array(std::span<const float>(af32)));
  w.set("a.f64", MetaValue::array(std::span<const double>(af64)));
  w.set("a.bool", MetaValue::bool_array({true, false, true}));
  w.set("a.str", MetaValue::string_array({"<s>", "", "\xE2\x96\x81the"}));
  w.set("a.empty", MetaValue::array(std::span<const float>()));
  w.set("a.empty_str", MetaValue::string_array({}));
  {
    std::vector<MetaValue> inner;
    inner.push_back(MetaValue::array(std::span<const int32_t>(ai32)));
    inner.push_back(MetaValue::string_array({"x", "yz"}));
    std::vector<MetaValue> deeper;
    deeper.push_back(MetaValue::array(std::span<const float>(af32)));
    inner.push_back(MetaValue::array_of_arrays(std::move(deeper)));
    inner.push_back(MetaValue::array_of_arrays({}));
    w.set("a.nested", MetaValue::array_of_arrays(std::move(inner)));
  }
  w.set("replaced", MetaValue::u32(1));
  w.set("replaced", MetaValue::string("second"));
  EXPECT_THROW(MetaValue::array_of_arrays({MetaValue::u8(1)}), Error);

  const Bytes bytes = w.to_bytes();
  auto f = File::from_bytes(bytes, "meta.gguf");
  EXPECT_EQ(f->metadata().size(), 30u);
  for (const auto& [key, value] : f->metadata()) {
    const MetaValue copy = MetaValue::copy_of(value);
    Bytes encoded;
    copy.encode(encoded);
    EXPECT_EQ(copy.encoded_size(), encoded.size()) << key;
    EXPECT_EQ(copy.type(), value.type) << key;
  }
  EXPECT_EQ(f->find("u8")->type, ValueType::U8);
  EXPECT_EQ(f->get_int("u8"), 255);
  EXPECT_EQ(f->get_int("i8"), -128);
  EXPECT_EQ(f->get_int("u16"), 65535);
  EXPECT_EQ(f->get_int("i16"), -32768);
  EXPECT_EQ(f->get_int("u32"), 4294967295ll);
  EXPECT_EQ(f->get_int("i32"), std::numeric_limits<int32_t>::min());
  EXPECT_EQ(f->find("u64")->u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_int("i64"), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f->get_float("f32"), static_cast<double>(-1.5e-7f));
  EXPECT_EQ(f->find("f32")->type, ValueType::F32);
  EXPECT_EQ(f->get_float("f64"), 3.141592653589793);
  EXPECT_EQ(f->get_bool("bool.t"), true);
  EXPECT_EQ(f->get_bool("bool.f"), false);
  EXPECT_EQ(f->get_string("str"), std::string("caf\xC3\xA9 \xE2\x96\x81 with\0nul", 17));
  EXPECT_EQ(f->get_string("str.empty"), "");
  EXPECT_EQ(f->get_string("replaced"), "second");

  auto ints = [&](const char* k) { return f->find(k)->int_array(k); };
  auto expect_ints = [&](const char* k, auto v, ValueType t) {
    SCOPED_TRACE(k);
    EXPECT_EQ(f->find(k)->elem_type, t);
    EXPECT_EQ(ints(k), std::vector<int64_t>(v.begin(), v.end()));
  };
  expect_ints("a.u8", au8, ValueType::U8);
  expect_ints("a.i8", ai8, ValueType::I8);
  expect_ints("a.u16", au16, ValueType::U16);
  expect_ints("a.i16", ai16, ValueType::I16);
  expect_ints("a.u32", au32, ValueType::U32);
  expect_ints("a.i32", ai32, ValueType::I32);
  expect_ints("a.i64", ai64, ValueType::I64);
  EXPECT_EQ(static_cast<uint64_t>(ints("a.u64")[0]), au64[0]);
  expect_ints("a.bool", std::vector<int>{1, 0, 1}, ValueType::BOOL);
  EXPECT_EQ(f->find("a.f32")->float_array("a.f32"), af32);
  EXPECT_EQ(f->find("a.f64")->elem_type, ValueType::F64);
  double f64s[2];
  std::memcpy(f64s, f->find("a.f64")->elems, 16);
  EXPECT_EQ(f64s[0], af64[0]);
  EXPECT_EQ(f64s[1], af64[1]);
  const auto& strs = f->find("a.str")->strings;
  ASSERT_EQ(strs.size(), 3u);
  EXPECT_EQ(strs[0], "<s>");
  EXPECT_EQ(strs[1], "");
  EXPECT_EQ(strs[2], "\xE2\x96\x81the");
  EXPECT_EQ(f->find("a.empty")->count, 0u);
  EXPECT_EQ(f->find("a.empty_str")->strings.size(), 0u);

  const gguf::Value& nested = *f->find("a.nested");
  EXPECT_EQ(nested.elem_type, ValueType::ARRAY);
  ASSERT_EQ(nested.nested.size(), 4u);
  EXPECT_EQ(nested.nested[0].int_array("n"), std::vector<int64_t>(ai32.begin(), ai32.end()));
  ASSERT_EQ(nested.nested[1].strings.size(), 2u);
  EXPECT_EQ(nested.nested[1].strings[1], "yz");
  ASSERT_EQ(nested.nested[2].nested.size(), 1u);
  EXPECT_EQ(nested.nested[2].nested[0].float_array("n"), af32);
  EXPECT_EQ(nested.nested[3].count, 0u);

  // Key order is insertion order (a replaced key keeps its slot).
  const Layout l = layout_of(bytes);
  EXPECT_EQ(l.kv.front().key, "u8");
  EXPECT_EQ(l.kv.back().key, "replaced");
  EXPECT_EQ(bytes.size() % 32, 0u) << "no tensors: the header is still padded to the alignment";
}

TEST(GgufWriter, RoundTripsEveryDtypeAndShape) {
  struct Case {
    DType type;
    std::vector<uint64_t> shape;
  };
  const std::vector<Case> cases = {
      {DType::F32, {5}},           {DType::F32, {3, 2, 2, 2}}, {DType::F16, {7, 3}},
      {DType::BF16, {9, 1, 2}},    {DType::Q8_0, {64, 3}},     {DType::Q8_0, {32, 2, 2}},
      {DType::Q4_0, {96, 5}},      {DType::Q4_0, {32}},        {DType::F16, {1, 1, 1, 1}},
      {DType::Q4_K, {256, 3}},     {DType::Q5_K, {512}},       {DType::Q6_K, {256, 2, 2}},
      {DType::Q3_K, {256, 2}},     {DType::IQ4_NL, {64, 3}},   {DType::IQ4_XS, {512, 2}},
  };
  Writer w;
  std::vector<Bytes> expected;
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    uint64_t n = 1;
    for (uint64_t d : c.shape) n *= d;
    std::vector<float> values = bell_values(n, 100 + i);
    expected.push_back(quantized(c.type, values));
    // Alternate the three ways of supplying data.
    const std::string name = "t" + std::to_string(i);
    if (i % 3 == 0) {
      w.add_tensor(name, c.shape, c.type, expected.back());
    } else if (i % 3 == 1) {
      w.add_tensor_f32(name, c.shape, c.type, values);
    } else {
      const uint64_t row = c.shape[0];
      w.add_tensor_rows(name, c.shape, c.type, [values, row](int64_t r, std::span<float> out) {
        ASSERT_EQ(out.size(), row);
        std::copy_n(values.begin() + r * static_cast<int64_t>(row), row, out.begin());
      });
    }
  }
  const Bytes raw_q4_k(144, 0x11);  // raw bytes of a type reprise only stores
  w.add_tensor("q4k", {256}, DType::Q4_K, raw_q4_k);
  w.set("general.alignment", MetaValue::u32(64));
  EXPECT_EQ(w.alignment(), 64u);

  TempDir dir;
  const std::string path = dir.file("dtypes.gguf");
  w.write(path);
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  const Bytes in_memory = w.to_bytes();
  EXPECT_EQ(read_file(path), in_memory) << "write() and to_bytes() must agree";

  auto f = File::open(path);
  EXPECT_EQ(f->alignment(), 64u);
  ASSERT_EQ(f->tensors().size(), cases.size() + 1);
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(i);
    const auto& t = f->tensors()[i];
    EXPECT_EQ(t.name, "t" + std::to_string(i));
    EXPECT_EQ(t.type, cases[i].type);
    EXPECT_EQ(t.shape, cases[i].shape);
    EXPECT_EQ(t.offset % 64, 0u);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data) % 64, 0u);
    ASSERT_EQ(t.n_bytes, expected[i].size());
    EXPECT_TRUE(std::equal(expected[i].begin(), expected[i].end(), t.data));
  }
  const auto& q4k = f->require_tensor("q4k");
  EXPECT_EQ(q4k.type, DType::Q4_K);
  EXPECT_TRUE(std::equal(raw_q4_k.begin(), raw_q4_k.end(), q4k.data));
  EXPECT_EQ(f->file_size() % 64, 0u) << "the last tensor is padded too, as ggml does";
}

// Reading a llama.cpp-written file and writing everything back (metadata in
// file order, tensors as views of the mapping) reproduces it byte for byte:
// the writer's layout, padding and encodings are ggml's.
TEST(GgufWriter, RewritesEveryFixtureByteForByte) {
  REPRISE_REQUIRE_SHARED(fixtures);
  int rewritten = 0;
  for (const auto& entry : fs::directory_iterator(fixtures + "/models")) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().filename().string());
    auto f = File::open(entry.path().string());
    const Bytes original(f->bytes().begin(), f->bytes().end());
    Writer w;
    for (const KvLayout& kv : layout_of(original).kv) w.set(kv.key, MetaValue::copy_of(*f->find(kv.key)));
    for (const auto& t : f->tensors())
      w.add_tensor_view(t.name, t.shape, t.type, std::span<const uint8_t>(t.data, t.n_bytes));
    const Bytes again = w.to_bytes();
    EXPECT_EQ(again.size(), original.size());
    EXPECT_TRUE(again == original) << "first difference at byte "
                                   << (std::mismatch(again.begin(), again.end(), original.begin(), original.end()).first - again.begin());
    ++rewritten;
  }
  EXPECT_GE(rewritten, 10);
}

// Resident set size of this process in bytes (/proc/self/statm).
uint64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

// After load the weights live in packed copies: release_resident() takes the
// mapping's pages out of the process's memory, and reading the tensors again
// still gives the file's bytes.
TEST(GgufReader, ReleaseResidentDropsMappedPagesAndKeepsTheData) {
  constexpr uint64_t kRows = 4096, kCols = 1024;  // 16 MiB of F32
  std::vector<float> values(kRows * kCols);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 9973) * 0.25f;
  Writer w;
  w.add_tensor("big", {kCols, kRows}, DType::F32,
               Bytes(reinterpret_cast<const uint8_t*>(values.data()),
                     reinterpret_cast<const uint8_t*>(values.data()) + values.size() * sizeof(float)));
  TempDir dir;
  const std::string path = dir.file("big.gguf");
  w.write(path);

  auto f = File::open(path);
  const auto& t = f->require_tensor("big");
  auto checksum = [&] {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < t.n_bytes; i += 512) sum = sum * 31 + t.data[i];
    return sum;
  };
  const uint64_t first = checksum();  // touches every page
  const uint64_t touched = resident_bytes();
  f->release_resident();
  const uint64_t released = resident_bytes();
  EXPECT_GE(touched - std::min(touched, released), t.n_bytes * 9 / 10)
      << "resident " << touched << " -> " << released << " bytes";
  EXPECT_EQ(checksum(), first);
  EXPECT_TRUE(std::memcmp(t.data, values.data(), t.n_bytes) == 0);
  // In-memory images own their bytes: nothing to release, nothing lost.
  auto mem = File::from_bytes(read_file(path), "big.gguf");
  mem->release_resident();
  EXPECT_TRUE(std::memcmp(mem->require_tensor("big").data, values.data(), t.n_bytes) == 0);
}

TEST(GgufWriter, ViewsAreNotCopied) {
  Bytes data(64 * 4);
  Writer w;
  w.add_tensor_view("v", {64}, DType::F32, data);
  data[0] = 0x42;  // changes after add_tensor_view are what gets written
  auto f = File::from_bytes(w.to_bytes(), "view.gguf");
  EXPECT_EQ(f->tensor("v")->data[0], 0x42);
}

TEST(GgufWriter, RejectsInvalidInput) {
  Writer w;
  w.add_tensor_f32("x", {32}, DType::F32, std::vector<float>(32));
  EXPECT_THROW(w.add_tensor_f32("x", {32}, DType::F32, std::vector<float>(32)), Error);  // duplicate
  EXPECT_THROW(w.add_tensor_f32("", {32}, DType::F32, std::vector<float>(32)), Error);
  EXPECT_THROW(w.add_tensor_f32(std::string(64, 'n'), {1}, DType::F32, {0.0f}), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {}, DType::F32, {}), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {1, 1, 1, 1, 1}, DType::F32, {0.0f}), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {4, 0}, DType::F32, {}), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {8}, DType::F32, std::vector<float>(7)), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {48}, DType::Q8_0, std::vector<float>(48)), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {256}, DType::IQ2_XS, std::vector<float>(256)), Error);
  EXPECT_THROW(w.add_tensor_f32("s", {128}, DType::Q4_K, std::vector<float>(128)), Error);
  EXPECT_THROW(w.add_tensor("s", {32}, DType::Q8_0, Bytes(33)), Error);
  EXPECT_THROW(w.add_tensor("s", {32}, static_cast<DType>(77), Bytes(32)), Error);
  EXPECT_THROW(w.add_tensor_rows("s", {32}, DType::F32, nullptr), Error);
  EXPECT_THROW(w.set("general.alignment", MetaValue::u32(48)), Error);
  EXPECT_THROW(w.set("general.alignment", MetaValue::u32(0)), Error);
  EXPECT_THROW(w.set("general.alignment", MetaValue::u64(64)), Error);
  EXPECT_THROW(w.set("", MetaValue::u32(1)), Error);
  EXPECT_EQ(w.tensor_count(), 1u);
  EXPECT_EQ(w.alignment(), 32u);

  TempDir dir;
  Writer failing;
  failing.add_tensor_rows("boom", {4, 4}, DType::F32, [](int64_t r, std::span<float>) {
    if (r == 2) throw Error("generator failed");
  });
  const std::string path = dir.file("failed.gguf");
  EXPECT_THROW(failing.write(path), Error);
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  try {
    w.write(dir.file("no/such/dir/x.gguf"));
    ADD_FAILURE() << "writing into a missing directory succeeded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no/such/dir/x.gguf"), std::string::npos) << e.what();
  }
}

// ---------------------------------------------------------------- quantizers

TEST(Quantize, Q8_0MatchesTheReferenceFormula) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = (i - 10) * 0.5f;  // amax 10.5 at i = 31
  BlockQ8_0 b;
  quantize_row_q8_0(x.data(), &b, 32);
  const float d = 10.5f / 127.0f;
  EXPECT_EQ(b.d, f32_to_f16(d));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(b.qs[i], static_cast<int8_t>(std::roundf(x[i] * (1.0f / d)))) << i;
  EXPECT_EQ(b.qs[31], 127);

  std::vector<float> zeros(32, 0.0f);
  quantize_row_q8_0(zeros.data(), &b, 32);
  EXPECT_EQ(b.d, 0);
  for (int8_t q : b.qs) EXPECT_EQ(q, 0);

  // roundf rounds halves away from zero: amax 127 gives d = 1 exactly.
  std::vector<float> halves(32, 0.0f);
  halves[0] = 127.0f;
  halves[1] = 2.5f;
  halves[2] = -2.5f;
  quantize_row_q8_0(halves.data(), &b, 32);
  EXPECT_EQ(b.qs[1], 3);
  EXPECT_EQ(b.qs[2], -3);
}

TEST(Quantize, Q4_0UsesTheSignedExtreme) {
  std::vector<float> x(32);
  for (int i = 0; i < 32; ++i) x[i] = (i - 12) * 0.25f;  // range [-3, 4.75]: extreme +4.75
  BlockQ4_0 b;
  quantize_row_q4_0(x.data(), &b, 32);
  const float d = 4.75f / -8.0f;
  EXPECT_EQ(b.d, f32_to_f16(d));
  // The extreme maps to nibble 0 (value -8 * d = +4.75).
  EXPECT_EQ(b.qs[31 - 16] >> 4, 0);
  const float id = 1.0f / d;
  for (int j = 0; j < 16; ++j) {
    volatile float p0 = x[j] * id, p1 = x[16 + j] * id;  // no FMA: the reference's rounding
    EXPECT_EQ(b.qs[j] & 15, std::min(15, static_cast<int>(static_cast<int8_t>(p0 + 8.5f)))) << j;
    EXPECT_EQ(b.qs[j] >> 4, std::min(15, static_cast<int>(static_cast<int8_t>(p1 + 8.5f)))) << j;
  }
  // Negative extreme; and the first of equal magnitudes wins.
  std::vector<float> y(32, 0.0f);
  y[3] = -2.0f;
  y[7] = 2.0f;
  quantize_row_q4_0(y.data(), &b, 32);
  EXPECT_EQ(f16_to_f32(b.d), 0.25f);
  EXPECT_EQ(b.qs[3] & 15, 0);
  EXPECT_EQ(b.qs[7] & 15, 15) << "+2 would be nibble 16: clamped to 15";
  std::vector<float> zeros(32, 0.0f);
  quantize_row_q4_0(zeros.data(), &b, 32);
  EXPECT_EQ(b.d, 0x8000) << "0 / -8 is -0, as in ggml";
  for (uint8_t q : b.qs) EXPECT_EQ(q, 0x88);
}

TEST(Quantize, RoundTripErrorIsWithinEachTypesBound) {
  const int64_t n = 32 * 64;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::vector<float> x = bell_values(n, 42, scale);
    x[5] = 0.0f;
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0,
                    DType::Q5_1}) {
      SCOPED_TRACE(dtype_name(static_cast<uint32_t>(t)) + " scale " + std::to_string(scale));
      Bytes q = quantized(t, x);
      ASSERT_EQ(q.size(), dtype_row_bytes(t, n));
      std::vector<float> y(n);
      dequantize_row(t, q.data(), y.data(), n);
      for (int64_t blk = 0; blk < n / 32; ++blk) {
        float amax = 0, lo = INFINITY, hi = -INFINITY;
        for (int j = 0; j < 32; ++j) {
          amax = std::max(amax, std::fabs(x[blk * 32 + j]));
          lo = std::min(lo, x[blk * 32 + j]);
          hi = std::max(hi, x[blk * 32 + j]);
        }
        for (int j = 0; j < 32; ++j) {
          const float v = x[blk * 32 + j], err = std::fabs(y[blk * 32 + j] - v);
          float bound = 0;
          switch (t) {
            case DType::F32: bound = 0; break;
            case DType::F16: bound = std::fabs(v) * 0x1p-11f + 0x1p-25f; break;
            case DType::BF16: bound = std::fabs(v) * 0x1p-8f; break;
            // Half a step plus the step's own f16 rounding over the range.
            // (0x1p-25 covers steps that are subnormal f16 numbers).
            case DType::Q8_0: bound = amax / 127 * 0.5f + amax * 0x1p-10f + 127 * 0x1p-25f; break;
            // Q4_0 maps the signed extreme to -8, so the other side tops out
            // at +7 steps: values there may be off by a whole step.
            case DType::Q4_0: bound = amax / 8 + amax * 0x1p-10f + 8 * 0x1p-25f; break;
            case DType::Q5_0: bound = amax / 16 + amax * 0x1p-10f + 16 * 0x1p-25f; break;
            // Half a step of (max - min) / levels, plus the f16 rounding of
            // the step (over up to 31 steps) and of the min.
            case DType::Q4_1: bound = (hi - lo) / 30 + (hi - lo) * 0x1p-10f + amax * 0x1p-10f + 0x1p-24f; break;
            case DType::Q5_1: bound = (hi - lo) / 62 + (hi - lo) * 0x1p-10f + amax * 0x1p-10f + 0x1p-24f; break;
            default: break;
          }
          ASSERT_LE(err, bound) << "block " << blk << " elem " << j << " x " << v;
        }
      }
      Bytes again = quantized(t, y);  // quantizing a dequantized row is idempotent
      EXPECT_EQ(again, q);
    }
  }
}

// The K types' quantizers: every element within its sub-block's budget
// (half a step, plus what rounding the sub-block scales and mins to integers
// and the super-block scales to f16 can add), read back as ggml reads the
// blocks (dequantize_row).
TEST(Quantize, KTypesRoundTripWithinTheirSubBlockStep) {
  const int64_t n = 256 * 8;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::vector<float> x = bell_values(n, 7, scale);
    for (int i = 0; i < 32; ++i) x[256 + i] = 0.0f;                          // an all-zero sub-block
    for (int i = 0; i < 256; ++i) x[512 + i] = std::fabs(x[512 + i]) + scale;  // all positive: no min
    for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
      SCOPED_TRACE(dtype_name(static_cast<uint32_t>(t)) + " scale " + std::to_string(scale));
      Bytes q = quantized(t, x);
      ASSERT_EQ(q.size(), dtype_row_bytes(t, n));
      std::vector<float> y(n);
      dequantize_row(t, q.data(), y.data(), n);
      const bool symmetric = t == DType::Q6_K || t == DType::Q3_K;
      const int sub = symmetric || t == DType::Q2_K ? 16 : 32;
      for (int64_t sb = 0; sb < n / 256; ++sb) {
        const uint8_t* blk = q.data() + sb * dtype_row_bytes(t, 256);
        uint16_t h[2];
        const size_t d_at = t == DType::Q6_K ? 208 : t == DType::Q3_K ? 108 : t == DType::Q2_K ? 80 : 0;
        std::memcpy(h, blk + d_at, symmetric ? 2 : 4);
        const float d = f16_to_f32(h[0]), dmin = symmetric ? 0.0f : f16_to_f32(h[1]);
        for (int64_t s0 = sb * 256; s0 < (sb + 1) * 256; s0 += sub) {
          float lo = 0, hi = 0, amax = 0;
          for (int i = 0; i < sub; ++i) {
            lo = std::min(lo, x[s0 + i]);
            hi = std::max(hi, x[s0 + i]);
            amax = std::max(amax, std::fabs(x[s0 + i]));
          }
          float bound;
          if (t == DType::Q6_K) {
            // The extreme maps to -32 steps, so the other side tops out at
            // +31: a whole step there, and 32 steps of scale rounding.
            bound = amax / 32 + 20 * d + amax * 0x1p-12f;
          } else if (t == DType::Q3_K) {
            // Likewise -4 and +3, with 4 steps of scale rounding (up to d
            // each where the largest scale clamps from 32 to 31).
            bound = amax / 4 + 4 * d + amax * 0x1p-12f;
          } else {
            const float levels = t == DType::Q2_K ? 3 : t == DType::Q4_K ? 15 : 31;
            bound = (hi - lo) / levels / 2 + (levels / 2 + 1) * d + dmin / 2 + amax * 0x1p-12f;
          }
          for (int i = 0; i < sub; ++i)
            ASSERT_LE(std::fabs(y[s0 + i] - x[s0 + i]), bound) << "element " << s0 + i << " x " << x[s0 + i];
        }
      }
      for (int i = 0; i < 32; ++i) EXPECT_EQ(y[256 + i], 0.0f) << "a zero sub-block stays zero";
    }
  }
}

// Hand-built blocks in ggml's layouts (see quant_blocks.h), so the element
// order, the 6-bit scale packing and the Q5_K/Q6_K high bits are pinned.
TEST(Quantize, KTypeLayoutsMatchGgml) {
  {
    // Q2_K: scale byte k holds scale k % 16 | min (15 - k) << 4; byte j of qs
    // holds crumbs (j * 7 + s) % 4 at bits 2s. The expected values follow
    // ggml's dequantize_row_q2_K loop (halves of 128, four shifts, two
    // 16-element sub-blocks per shift).
    BlockQ2_K b{};
    b.d = f32_to_f16(0.5f);
    b.dmin = f32_to_f16(0.25f);
    for (int k = 0; k < 16; ++k) b.scales[k] = static_cast<uint8_t>(k | ((15 - k) << 4));
    for (int j = 0; j < 64; ++j)
      for (int s = 0; s < 4; ++s) b.qs[j] = static_cast<uint8_t>(b.qs[j] | (((j * 7 + s) % 4) << (2 * s)));
    float want[256];
    int out = 0, is = 0;
    for (int n = 0; n < 256; n += 128) {
      const uint8_t* q = b.qs + n / 4;
      for (int shift = 0; shift < 8; shift += 2)
        for (int half = 0; half < 2; ++half) {
          const uint8_t sc = b.scales[is++];
          for (int l = 0; l < 16; ++l)
            want[out++] = 0.5f * static_cast<float>(sc & 15) * static_cast<float>((q[l + 16 * half] >> shift) & 3) -
                          0.25f * static_cast<float>(sc >> 4);
        }
    }
    float y[256];
    dequantize_row(DType::Q2_K, &b, y, 256);
    for (int i = 0; i < 256; ++i) ASSERT_EQ(y[i], want[i]) << i;
  }
  {
    BlockQ5_K b{};
    b.d = f32_to_f16(1.0f);
    b.dmin = f32_to_f16(0.5f);
    // Scales j + 1 and mins 2 j + 40 (j >= 4 needs the top bits of bytes 0..7).
    for (int j = 0; j < 8; ++j) {
      const int sc = j + 1 + (j >= 4 ? 48 : 0), m = 2 * j + 40;
      if (j < 4) {
        b.scales[j] = static_cast<uint8_t>(sc);
        b.scales[j + 4] = static_cast<uint8_t>(m);
      } else {
        b.scales[j + 4] = static_cast<uint8_t>((sc & 15) | ((m & 15) << 4));
        b.scales[j - 4] = static_cast<uint8_t>(b.scales[j - 4] | ((sc >> 4) << 6));
        b.scales[j] = static_cast<uint8_t>(b.scales[j] | ((m >> 4) << 6));
      }
    }
    for (int p = 0; p < 4; ++p)
      for (int l = 0; l < 32; ++l) b.qs[32 * p + l] = static_cast<uint8_t>((l % 16) | ((15 - l % 16) << 4));
    for (int l = 0; l < 32; ++l) b.qh[l] = static_cast<uint8_t>(l % 2 ? 0xaa : 0x55);  // odd l: odd sub-blocks
    float y5[256], y4[256];
    dequantize_row(DType::Q5_K, &b, y5, 256);
    BlockQ4_K b4{};
    b4.d = b.d;
    b4.dmin = b.dmin;
    std::memcpy(b4.scales, b.scales, 12);
    std::memcpy(b4.qs, b.qs, 128);
    dequantize_row(DType::Q4_K, &b4, y4, 256);
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int q = j % 2 ? 15 - l % 16 : l % 16;
        const float sc = static_cast<float>(j + 1 + (j >= 4 ? 48 : 0)), m = static_cast<float>(2 * j + 40);
        ASSERT_EQ(y4[32 * j + l], sc * q - 0.5f * m) << "Q4_K sub-block " << j << " element " << l;
        const int high = (j % 2) == (l % 2) ? 16 : 0;
        ASSERT_EQ(y5[32 * j + l], sc * (q + high) - 0.5f * m) << "Q5_K sub-block " << j << " element " << l;
      }
  }
  {
    BlockQ6_K b{};
    b.d = f32_to_f16(0.5f);
    for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
    for (int i = 0; i < 256; ++i) {
      const int u = (i * 7) % 64, h = i / 128, quarter = (i % 128) / 32, e = i % 32;
      uint8_t& lo = b.ql[64 * h + e + 32 * (quarter % 2)];
      lo = static_cast<uint8_t>(lo | (quarter < 2 ? u & 15 : (u & 15) << 4));
      b.qh[32 * h + e] = static_cast<uint8_t>(b.qh[32 * h + e] | ((u >> 4) << (2 * quarter)));
    }
    float y[256];
    dequantize_row(DType::Q6_K, &b, y, 256);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(y[i], 0.5f * static_cast<float>(i / 16 - 8) * static_cast<float>((i * 7) % 64 - 32)) << i;
  }
  {
    // Q3_K: sub-block k's scale 2k - 17 (its biased 6 bits 2k + 15 split
    // into a nibble and 2 top bits), element i's quant (i * 5) % 8 - 4 (low
    // 2 bits in qs, and the hmask bit set when the quant is >= 0).
    BlockQ3_K b{};
    b.d = f32_to_f16(0.25f);
    for (int k = 0; k < 16; ++k) {
      const int biased = 2 * k + 15;
      b.scales[k % 8] = static_cast<uint8_t>(b.scales[k % 8] | ((biased & 15) << (k < 8 ? 0 : 4)));
      b.scales[8 + k % 4] = static_cast<uint8_t>(b.scales[8 + k % 4] | ((biased >> 4) << (2 * (k / 4))));
    }
    for (int i = 0; i < 256; ++i) {
      const int u = (i * 5) % 8, h = i / 128, quarter = (i % 128) / 32, l = i % 32;
      b.qs[32 * h + l] = static_cast<uint8_t>(b.qs[32 * h + l] | ((u & 3) << (2 * quarter)));
      if (u & 4) b.hmask[l] = static_cast<uint8_t>(b.hmask[l] | (1 << (4 * h + quarter)));
    }
    float y[256];
    dequantize_row(DType::Q3_K, &b, y, 256);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(y[i], 0.25f * static_cast<float>(2 * (i / 16) - 17) * static_cast<float>((i * 5) % 8 - 4)) << i;
  }
  {
    // IQ4_NL: nibble v is kvalues_iq4nl[v]; low nibbles are elements 0..15.
    const float table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    BlockIQ4_NL b{};
    b.d = f32_to_f16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    float y[32];
    dequantize_row(DType::IQ4_NL, &b, y, 32);
    for (int j = 0; j < 16; ++j) {
      ASSERT_EQ(y[j], 0.5f * table[j]) << j;
      ASSERT_EQ(y[16 + j], 0.5f * table[15 - j]) << 16 + j;
    }
  }
  {
    // IQ4_XS: sub-block j's scale 9j - 32 (biased 9j, 0..63: low nibble in
    // scales_l[j / 2] at nibble j % 2, top 2 bits at bit 2j of scales_h);
    // element l of sub-block j has nibble (j + 3l) % 16, low nibbles of
    // qs[16j .. 16j+15] being elements 0..15.
    const float table[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    BlockIQ4_XS b{};
    b.d = f32_to_f16(0.125f);
    for (int j = 0; j < 8; ++j) {
      const int biased = 9 * j;
      b.scales_l[j / 2] = static_cast<uint8_t>(b.scales_l[j / 2] | ((biased & 15) << (4 * (j % 2))));
      b.scales_h = static_cast<uint16_t>(b.scales_h | ((biased >> 4) << (2 * j)));
      for (int l = 0; l < 16; ++l)
        b.qs[16 * j + l] = static_cast<uint8_t>(((j + 3 * l) % 16) | (((j + 3 * (l + 16)) % 16) << 4));
    }
    float y[256];
    dequantize_row(DType::IQ4_XS, &b, y, 256);
    for (int i = 0; i < 256; ++i)
      ASSERT_EQ(y[i], 0.125f * static_cast<float>(9 * (i / 32) - 32) * table[(i / 32 + 3 * (i % 32)) % 16]) << i;
  }
}

// IQ4_NL: each element is the nearest of the 16 table values times d, d set
// so the largest magnitude is the table's -127 end: within half the widest
// gap of the table (24 / 2 steps) or, above +113, 14 steps.
TEST(Quantize, Iq4NlRoundTripsWithinItsTableGaps) {
  const int64_t n = 32 * 16;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::vector<float> x = bell_values(n, 9, scale);
    for (int i = 0; i < 32; ++i) x[64 + i] = 0.0f;  // an all-zero block
    Bytes q = quantized(DType::IQ4_NL, x);
    ASSERT_EQ(q.size(), dtype_row_bytes(DType::IQ4_NL, n));
    std::vector<float> y(n);
    dequantize_row(DType::IQ4_NL, q.data(), y.data(), n);
    for (int64_t b = 0; b < n / 32; ++b) {
      float amax = 0;
      for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
      const float bound = amax * 14 / 127 + amax * 0x1p-9f;
      for (int i = 0; i < 32; ++i)
        ASSERT_LE(std::fabs(y[b * 32 + i] - x[b * 32 + i]), bound) << "element " << b * 32 + i;
    }
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[64 + i], 0.0f) << "a zero block stays zero";
  }
}

// IQ4_XS: each sub-block's step is d * its 6-bit scale, d from the largest
// sub-block scale / 32; an element is the nearest table value at that step.
// So an element is within half the widest table gap (12 steps) or, above
// +113, 14 steps of its step, and the step within half of d of what maps the
// sub-block's largest magnitude to -127.
TEST(Quantize, Iq4XsRoundTripsWithinItsTableGapsAndScaleStep) {
  const int64_t n = 256 * 6;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    std::vector<float> x = bell_values(n, 21, scale);
    for (int i = 0; i < 32; ++i) x[256 + 64 + i] = 0.0f;  // an all-zero sub-block
    for (int i = 0; i < 32; ++i) x[512 + i] *= 40.0f;     // one sub-block far above the rest
    Bytes q = quantized(DType::IQ4_XS, x);
    ASSERT_EQ(q.size(), dtype_row_bytes(DType::IQ4_XS, n));
    std::vector<float> y(n);
    dequantize_row(DType::IQ4_XS, q.data(), y.data(), n);
    for (int64_t s = 0; s < n / 256; ++s) {
      float amax[8] = {}, max_scale = 0;
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 32; ++i) amax[j] = std::max(amax[j], std::fabs(x[s * 256 + 32 * j + i]));
        max_scale = std::max(max_scale, amax[j] / 127);
      }
      const float d = max_scale / 32;  // the scale step (before f16 rounding)
      for (int j = 0; j < 8; ++j) {
        // The sub-block's step is within d / 2 (plus f16 rounding) of amax / 127.
        const float step = amax[j] / 127 + d * (0.5f + 0x1p-9f * 32);
        const float bound = step * 14 + amax[j] * 0x1p-9f + d * 0.5f * 127;
        for (int i = 0; i < 32; ++i) {
          const int64_t k = s * 256 + 32 * j + i;
          ASSERT_LE(std::fabs(y[k] - x[k]), bound) << "element " << k;
        }
      }
    }
    for (int i = 0; i < 32; ++i) EXPECT_EQ(y[256 + 64 + i], 0.0f) << "a zero sub-block stays zero";
  }
}

TEST(Quantize, RejectsUnsupportedTypesAndLengths) {
  float x[64] = {};
  uint8_t out[256];
  EXPECT_THROW(quantize_row(DType::IQ2_XS, x, out, 256), Error);
  EXPECT_THROW(quantize_row(DType::Q2_K, x, out, 64), Error);  // not a whole super-block
  EXPECT_THROW(quantize_row(DType::Q4_K, x, out, 64), Error);  // not a whole super-block
  EXPECT_THROW(dequantize_row(DType::Q8_1, out, x, 32), Error);
  EXPECT_THROW(quantize_row(DType::Q8_0, x, out, 48), Error);
  EXPECT_THROW(dequantize_row(DType::Q4_0, out, x, 16), Error);
  EXPECT_NO_THROW(quantize_row(DType::F16, x, out, 3));
  EXPECT_TRUE(quantize_supported(DType::BF16));
  EXPECT_TRUE(quantize_supported(DType::Q5_1));
  EXPECT_TRUE(quantize_supported(DType::IQ4_NL));
  EXPECT_TRUE(quantize_supported(DType::Q2_K));
  EXPECT_TRUE(quantize_supported(DType::IQ4_XS));
  EXPECT_FALSE(quantize_supported(DType::IQ2_XS));
}

// Dequantizing a llama-quantize tensor and quantizing it again must give the
// file's bytes back; and where the F16 fixture holds the same weights, our
// quantizer applied to them must reproduce llama-quantize's output exactly.
TEST(Quantize, BitExactWithLlamaQuantizeFixtures) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto f16 = File::open(fixtures + "/models/llama-spm-f16.gguf");
  for (const char* name : {"llama-spm-Q8_0.gguf", "llama-spm-Q4_0.gguf"}) {
    SCOPED_TRACE(name);
    auto q = File::open(fixtures + "/models/" + name);
    int requantized = 0, from_f16 = 0, f16_sources = 0;
    for (const auto& t : q->tensors()) {
      if (t.type != DType::Q8_0 && t.type != DType::Q4_0) continue;
      const int64_t n = static_cast<int64_t>(t.n_elements());
      std::vector<float> values(n);
      dequantize_row(t.type, t.data, values.data(), n);
      Bytes again(t.n_bytes);
      quantize_row(t.type, values.data(), again.data(), n);
      EXPECT_TRUE(std::equal(again.begin(), again.end(), t.data)) << t.name << " (requantized)";
      ++requantized;

      const auto* src = f16->tensor(t.name);
      if (!src || src->type != DType::F16) continue;
      ++f16_sources;
      dequantize_row(DType::F16, src->data, values.data(), n);
      quantize_row(t.type, values.data(), again.data(), n);
      if (std::equal(again.begin(), again.end(), t.data)) ++from_f16;
    }
    EXPECT_GE(requantized, 10);
    // The fixtures were quantized from the F16 file: every tensor must match.
    EXPECT_EQ(from_f16, f16_sources);
  }
}

// ---------------------------------------------------------------- fuzzing

// Parses an image; when it parses, touches everything the reader hands out so
// that sanitizer builds catch any view that escapes the buffer. Errors other
// than reprise::Error propagate to the caller (and fail the test).
bool exercise(std::span<const uint8_t> image, const std::string& name) {
  std::unique_ptr<File> f;
  try {
    f = File::from_bytes(image, name);
  } catch (const Error& e) {
    if (std::string(e.what()).rfind(name + ": ", 0) != 0)
      throw std::logic_error(std::string("error message lacks the file name: ") + e.what());
    return false;
  }
  uint64_t sink = 0;
  std::function<void(const std::string&, const gguf::Value&)> touch = [&](const std::string& key,
                                                                          const gguf::Value& v) {
    sink += v.str.empty() ? 0 : static_cast<uint8_t>(v.str.back());
    for (std::string_view s : v.strings) sink += s.empty() ? 0 : static_cast<uint8_t>(s.back());
    for (const gguf::Value& inner : v.nested) touch(key, inner);
    if (v.type == ValueType::ARRAY && v.elems) {
      try {
        for (float x : v.float_array(key)) sink += static_cast<uint64_t>(x != 0);
      } catch (const Error&) {
      }
    }
  };
  for (const auto& [key, value] : f->metadata()) touch(key, value);
  for (const auto& t : f->tensors()) sink += t.data[0] + t.data[t.n_bytes - 1];
  volatile uint64_t keep = sink;
  (void)keep;
  return true;
}

// Saves the input being parsed when the process dies on a signal, so a crash
// found by the mutation fuzzer can be minimized and added to the corpus.
namespace crash_capture {
const uint8_t* volatile g_data = nullptr;
volatile size_t g_size = 0;
constexpr char kCrashFile[] = "gguf_fuzz_crash.gguf";

extern "C" void on_fatal_signal(int sig) {
  if (g_data) {
    int fd = ::open(kCrashFile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, g_data, g_size);
      (void)ignored;
      ::close(fd);
    }
    static const char kMsg[] = "\ngguf fuzz: crashing input saved to ./gguf_fuzz_crash.gguf\n";
    ssize_t ignored = ::write(2, kMsg, sizeof(kMsg) - 1);
    (void)ignored;
  }
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

class Scope {
 public:
  Scope() {
    struct sigaction sa {};
    sa.sa_handler = on_fatal_signal;
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &sa, &old_[i]);
  }
  ~Scope() {
    for (size_t i = 0; i < kSignals.size(); ++i) ::sigaction(kSignals[i], &old_[i], nullptr);
    g_data = nullptr;
  }
  void current(const Bytes& b) {
    g_data = b.data();
    g_size = b.size();
  }

 private:
  static constexpr std::array<int, 5> kSignals = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
  std::array<struct sigaction, 5> old_{};
};
}  // namespace crash_capture

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  Bytes mutate(const Bytes& base, const Layout& l) {
    Bytes b = base;
    const int n = 1 + static_cast<int>(below(3));
    for (int i = 0; i < n && !b.empty(); ++i) mutate_once(b, l);
    return b;
  }

 private:
  uint64_t below(uint64_t n) { return n == 0 ? 0 : rng_() % n; }

  // Positions favour the fixed header and the tensor infos (where the
  // interesting fields are) over the bulk of vocabulary strings.
  size_t position(const Bytes& b, const Layout& l) {
    const uint64_t roll = below(10);
    size_t lo = 0, hi = b.size();
    if (roll < 4) {
      hi = std::min<size_t>(b.size(), 512);
    } else if (roll < 7 && l.header_end > l.tensor_infos_pos) {
      lo = std::min(l.tensor_infos_pos, b.size() - 1);
      hi = std::min(l.header_end, b.size());
    } else {
      hi = std::min(b.size(), l.header_end + 64);
    }
    return lo + below(std::max<size_t>(hi - lo, 1));
  }

  void smash_u64(Bytes& b, size_t pos) {
    if (pos + 8 > b.size()) return;
    const uint64_t orig = load_le<uint64_t>(b, pos);
    const uint64_t choices[] = {0, 1, 2, 7, 8, 31, 32, 0xff, 0xffff, 0xffffffffull,
                                uint64_t(1) << 32, uint64_t(1) << 40, uint64_t(1) << 62,
                                uint64_t(1) << 63, ~uint64_t(0), ~uint64_t(0) - 7, orig + 1,
                                orig - 1, orig * 2, orig + 32, b.size(), b.size() - pos};
    store_le<uint64_t>(b, pos, choices[below(std::size(choices))]);
  }
  void smash_u32(Bytes& b, size_t pos) {
    if (pos + 4 > b.size()) return;
    const uint32_t orig = load_le<uint32_t>(b, pos);
    const uint32_t choices[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10, 12, 13, 30, 31, 39, 40,
                                0xffffffffu, 0x80000000u, orig + 1, orig - 1};
    store_le<uint32_t>(b, pos, choices[below(std::size(choices))]);
  }

  void mutate_once(Bytes& b, const Layout& l) {
    switch (below(9)) {
      case 0: b[position(b, l)] ^= static_cast<uint8_t>(1u << below(8)); break;
      case 1: {
        const uint8_t values[] = {0, 1, 0x7f, 0x80, 0xff, static_cast<uint8_t>(below(256))};
        b[position(b, l)] = values[below(std::size(values))];
        break;
      }
      case 2: b.resize(position(b, l)); break;
      case 3: {
        const size_t pos = position(b, l);
        Bytes ins(1 + below(8));
        for (uint8_t& x : ins) x = static_cast<uint8_t>(below(256));
        b.insert(b.begin() + static_cast<std::ptrdiff_t>(pos), ins.begin(), ins.end());
        break;
      }
      case 4: {
        const size_t pos = position(b, l);
        const size_t n = std::min<size_t>(1 + below(8), b.size() - pos);
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(pos), b.begin() + static_cast<std::ptrdiff_t>(pos + n));
        break;
      }
      case 5:
      case 6:
        if (!l.u64_fields.empty()) smash_u64(b, l.u64_fields[below(l.u64_fields.size())]);
        break;
      case 7:
        if (!l.u32_fields.empty()) smash_u32(b, l.u32_fields[below(l.u32_fields.size())]);
        break;
      case 8: {  // copy a chunk over another (duplicate names, shifted fields)
        const size_t from = position(b, l), to = position(b, l);
        const size_t n = std::min({static_cast<size_t>(1 + below(32)), b.size() - from, b.size() - to});
        std::memmove(b.data() + to, b.data() + from, n);
        break;
      }
    }
  }

  std::mt19937_64 rng_;
};

Bytes all_types_image() {
  Writer w;
  w.set("u8", MetaValue::u8(7));
  w.set("i8", MetaValue::i8(-7));
  w.set("u16", MetaValue::u16(700));
  w.set("i16", MetaValue::i16(-700));
  w.set("u32", MetaValue::u32(70000));
  w.set("i32", MetaValue::i32(-70000));
  w.set("u64", MetaValue::u64(1ull << 40));
  w.set("i64", MetaValue::i64(-(1ll << 40)));
  w.set("f32", MetaValue::f32(0.5f));
  w.set("f64", MetaValue::f64(0.25));
  w.set("bool", MetaValue::boolean(true));
  w.set("str", MetaValue::string("hello"));
  const std::vector<int32_t> ints = {1, -2, 3};
  const std::vector<float> floats = {0.5f, 1.5f};
  w.set("a.i32", MetaValue::array(std::span<const int32_t>(ints)));
  w.set("a.f32", MetaValue::array(std::span<const float>(floats)));
  w.set("a.bool", MetaValue::bool_array({true, false}));
  w.set("a.str", MetaValue::string_array({"x", "", "yz"}));
  std::vector<MetaValue> inner;
  inner.push_back(MetaValue::array(std::span<const int32_t>(ints)));
  inner.push_back(MetaValue::string_array({"n"}));
  w.set("a.nested", MetaValue::array_of_arrays(std::move(inner)));
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0}) {
    w.add_tensor_f32(std::string("w.") + dtype_name(static_cast<uint32_t>(t)), {32, 2}, t,
                     bell_values(64, static_cast<uint64_t>(t)));
  }
  return w.to_bytes();
}

// A complete synthetic model small enough to fuzz with all of its data.
Bytes small_model_image(const TempDir& dir) {
  SyntheticModelSpec s;
  s.n_embd = 32;
  s.n_layer = 1;
  s.n_head = 2;
  s.n_head_kv = 1;
  s.n_ff = 32;
  s.n_vocab = 272;
  s.dtype = DType::Q8_0;
  const std::string path = dir.file("fuzz-model.gguf");
  make_synthetic_model(s, path);
  return read_file(path);
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v ? std::strtoll(v, nullptr, 0) : fallback;
}

struct FuzzTarget {
  std::string name;
  Bytes image;
  int cases;
};

void fuzz(const std::vector<FuzzTarget>& targets, uint64_t seed, int64_t& parsed, int64_t& rejected) {
  crash_capture::Scope capture;
  for (const FuzzTarget& target : targets) {
    const Layout layout = layout_of(target.image);
    Mutator mutator(seed ^ std::hash<std::string>()(target.name));
    for (int c = 0; c < target.cases; ++c) {
      const Bytes input = mutator.mutate(target.image, layout);
      capture.current(input);
      try {
        (exercise(input, target.name) ? parsed : rejected)++;
      } catch (const std::exception& e) {
        const std::string saved = "gguf_fuzz_failure-" + std::to_string(c) + ".gguf";
        std::ofstream(saved, std::ios::binary).write(reinterpret_cast<const char*>(input.data()),
                                                     static_cast<std::streamsize>(input.size()));
        ADD_FAILURE() << target.name << " case " << c << " (seed " << seed << "): non-reprise::Error "
                      << e.what() << "; input saved to ./" << saved;
      }
    }
  }
}

TEST(GgufFuzz, MutatedGeneratedFilesParseOrThrow) {
  const uint64_t seed = static_cast<uint64_t>(env_int("REPRISE_FUZZ_SEED", 20261121));
  const int64_t scale = env_int("REPRISE_FUZZ_SCALE", 1);
  TempDir dir;
  std::vector<FuzzTarget> targets = {
      {"small.gguf", small_image(), static_cast<int>(6000 * scale)},
      {"all-types.gguf", all_types_image(), static_cast<int>(6000 * scale)},
      {"small-model.gguf", small_model_image(dir), static_cast<int>(3000 * scale)},
  };
  int64_t parsed = 0, rejected = 0;
  fuzz(targets, seed, parsed, rejected);
  EXPECT_GT(parsed, 0) << "no mutant parsed: the mutations are too destructive to explore";
  EXPECT_GT(rejected, 0);
  std::printf("generated images: %lld mutants parsed, %lld rejected\n", static_cast<long long>(parsed),
              static_cast<long long>(rejected));
}

// Makes a fixture's header valid on its own: every tensor becomes one block
// at offset 0, so the header plus a few KiB of data is a complete image and
// mutants get past the tensor bounds check.
void shrink_tensors(Bytes& b, const Layout& l) {
  for (const TensorLayout& t : l.tensors) {
    const auto info = dtype_info(load_le<uint32_t>(b, t.type_pos));
    for (size_t d = 0; d < t.dim_pos.size(); ++d)
      store_le<uint64_t>(b, t.dim_pos[d], d == 0 ? info->block_elems : 1);
    store_le<uint64_t>(b, t.offset_pos, 0);
  }
}

TEST(GgufFuzz, MutatedFixtureHeadersParseOrThrow) {
  REPRISE_REQUIRE_SHARED(fixtures);
  const uint64_t seed = static_cast<uint64_t>(env_int("REPRISE_FUZZ_SEED", 20261121));
  const int64_t scale = env_int("REPRISE_FUZZ_SCALE", 1);
  std::vector<FuzzTarget> targets;
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(fixtures + "/models"))
    if (entry.path().extension() == ".gguf") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  ASSERT_FALSE(paths.empty());
  for (const std::string& path : paths) {
    Bytes whole = read_file(path);
    const Layout l = layout_of(whole);
    const std::string name = fs::path(path).filename().string();
    // Mostly the header plus a little data (cheap to copy; tensor bounds then
    // fail unless a mutation makes them fit), and a few whole files so that
    // accepted mutants of real models are explored too.
    Bytes head(whole.begin(), whole.begin() + static_cast<std::ptrdiff_t>(std::min(whole.size(), l.header_end + 4096)));
    shrink_tensors(head, l);
    EXPECT_TRUE(exercise(head, name)) << "the shrunk header image must itself be valid";
    targets.push_back({name + "[header]", std::move(head), static_cast<int>(500 * scale)});
    targets.push_back({name, std::move(whole), static_cast<int>(6 * scale)});
  }
  int64_t parsed = 0, rejected = 0;
  fuzz(targets, seed, parsed, rejected);
  EXPECT_GT(parsed, 0);
  std::printf("fixtures: %zu files, %lld mutants parsed, %lld rejected\n", paths.size(),
              static_cast<long long>(parsed), static_cast<long long>(rejected));
}

// ---------------------------------------------------------------- regression corpus

std::string corpus_dir() { return std::string(REPRISE_SOURCE_DIR) + "/tests/corpus/gguf"; }

// Files are named for what the reader must do with them: valid-* parse,
// invalid-* are rejected, crash-* (minimized fuzz findings) must merely not
// crash.
TEST(GgufCorpus, ReplaysEveryFile) {
  ASSERT_TRUE(fs::is_directory(corpus_dir())) << corpus_dir();
  int replayed = 0;
  for (const auto& entry : fs::directory_iterator(corpus_dir())) {
    if (entry.path().extension() != ".gguf") continue;
    const std::string name = entry.path().filename().string();
    SCOPED_TRACE(name);
    const Bytes b = read_file(entry.path().string());
    EXPECT_LT(b.size(), 4096u) << "keep corpus files tiny";
    const bool ok = exercise(b, name);
    if (name.rfind("valid-", 0) == 0) { EXPECT_TRUE(ok) << "must parse"; }
    if (name.rfind("invalid-", 0) == 0) { EXPECT_FALSE(ok) << "must be rejected"; }
    ++replayed;
  }
  EXPECT_GE(replayed, 8);
}

// Regenerates the seed files (run explicitly:
//   gguf_test --gtest_also_run_disabled_tests --gtest_filter='*WriteSeeds').
TEST(GgufCorpus, DISABLED_WriteSeeds) {
  fs::create_directories(corpus_dir());
  auto save = [](const std::string& name, const Bytes& b) {
    ASSERT_LT(b.size(), 4096u) << name;
    std::ofstream(corpus_dir() + "/" + name, std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  const Bytes small = small_image();
  const Layout l = layout_of(small);
  save("valid-small.gguf", small);
  save("valid-all-types.gguf", all_types_image());
  {
    Bytes v2 = small;
    store_le<uint32_t>(v2, 4, 2);
    save("valid-v2.gguf", v2);
  }
  {
    Writer w;
    w.set_string("general.architecture", "none");
    save("valid-no-tensors.gguf", w.to_bytes());
  }
  {
    Writer w;
    w.set("general.alignment", MetaValue::u32(256));
    w.add_tensor_f32("a", {3}, DType::F32, {1, 2, 3});
    w.add_tensor_f32("b", {32}, DType::Q4_0, bell_values(32, 3));
    save("valid-alignment-256.gguf", w.to_bytes());
  }
  save("invalid-truncated-header.gguf", Bytes(small.begin(), small.begin() + 40));
  save("invalid-truncated-data.gguf", Bytes(small.begin(), small.end() - 1));
  {
    Bytes b = small;
    store_le<uint64_t>(b, l.key("tokenizer.ggml.tokens").value_pos + 4, ~uint64_t(0));
    save("invalid-huge-array-count.gguf", b);
    b = small;
    store_le<uint64_t>(b, l.key("general.architecture").value_pos, ~uint64_t(0) - 7);
    save("invalid-huge-string-length.gguf", b);
    b = small;
    store_le<uint64_t>(b, l.n_tensors_pos, uint64_t(1) << 60);
    save("invalid-huge-tensor-count.gguf", b);
    b = small;
    store_le<uint64_t>(b, l.tensor("norm.weight").offset_pos, uint64_t(1) << 62);
    save("invalid-tensor-outside.gguf", b);
    b = small;
    store_le<uint64_t>(b, l.tensor("norm.weight").offset_pos, 100);
    save("invalid-misaligned-offset.gguf", b);
    b = small;
    store_le<uint32_t>(b, l.tensor("tok.weight").type_pos, 99);
    save("invalid-unknown-tensor-type.gguf", b);
    b = small;
    store_le<uint32_t>(b, l.key("llama.block_count").type_pos, 13);
    save("invalid-unknown-value-type.gguf", b);
  }
  {
    MetaValue v = MetaValue::array(std::span<const int32_t>());
    for (int depth = 0; depth < 8; ++depth) {
      std::vector<MetaValue> one;
      one.push_back(std::move(v));
      v = MetaValue::array_of_arrays(std::move(one));
    }
    save("invalid-deep-nesting.gguf", small_image({{"deep", std::move(v)}}));
  }
}

// ---------------------------------------------------------------- synthetic models

std::set<std::string> key_set(const File& f, bool with_tokenizer) {
  std::set<std::string> keys;
  for (const auto& [k, v] : f.metadata())
    if (with_tokenizer || k.rfind("tokenizer.", 0) != 0) keys.insert(k);
  return keys;
}

// Compares names, shapes, types and metadata keys/types/values of a synthetic
// model with the llama.cpp-converted fixture it imitates.
void expect_same_structure(const File& fixture, const File& ours, bool compare_tokenizer) {
  std::map<std::string, const gguf::TensorInfo*> theirs;
  for (const auto& t : fixture.tensors()) theirs[t.name] = &t;
  std::map<std::string, const gguf::TensorInfo*> mine;
  for (const auto& t : ours.tensors()) mine[t.name] = &t;
  std::vector<std::string> their_names, my_names;
  for (auto& [n, t] : theirs) their_names.push_back(n);
  for (auto& [n, t] : mine) my_names.push_back(n);
  EXPECT_EQ(my_names, their_names);
  for (auto& [n, t] : theirs) {
    if (!mine.count(n)) continue;
    EXPECT_EQ(mine[n]->shape, t->shape) << n;
    EXPECT_EQ(dtype_name(mine[n]->raw_type), dtype_name(t->raw_type)) << n;
  }
  EXPECT_EQ(key_set(ours, compare_tokenizer), key_set(fixture, compare_tokenizer));
  const std::string arch = fixture.require_string("general.architecture") + ".";
  for (const auto& [k, v] : fixture.metadata()) {
    const gguf::Value* m = ours.find(k);
    if (!m || (!compare_tokenizer && k.rfind("tokenizer.", 0) == 0)) continue;
    EXPECT_EQ(value_type_name(m->type), std::string(value_type_name(v.type))) << k;
    if (v.type == ValueType::ARRAY) { EXPECT_EQ(m->elem_type, v.elem_type) << k; }
    if (k.rfind(arch, 0) != 0 && k != "general.file_type") continue;
    if (v.is_integer() || v.is_float()) { EXPECT_EQ(m->as_double(k), v.as_double(k)) << k; }
    if (v.type == ValueType::ARRAY && v.elems) { EXPECT_EQ(m->int_array(k), v.int_array(k)) << k; }
  }
}

struct FixtureLikeCase {
  const char* fixture;
  const char* preset;
  std::function<void(SyntheticModelSpec&)> adjust;
};

TEST(SyntheticModel, MatchesTheFixtureLayoutOfEachArchitecture) {
  REPRISE_REQUIRE_SHARED(fixtures);
  auto llama_dims = [](int64_t embd, int64_t layers, int64_t heads, int64_t ff) {
    return [=](SyntheticModelSpec& s) {
      s.n_embd = embd;
      s.n_layer = layers;
      s.n_head = heads;
      s.n_head_kv = 2;
      s.head_dim = 16;
      s.n_ff = ff;
      s.n_ctx = 4096;
    };
  };
  const std::vector<FixtureLikeCase> cases = {
      {"llama-spm-f32.gguf", "tiny", llama_dims(64, 3, 4, 128)},
      {"llama-spm-f16.gguf", "tiny",
       [&](SyntheticModelSpec& s) {
         llama_dims(96, 2, 6, 256)(s);
         s.dtype = DType::F16;
         s.tied_output = true;
       }},
      {"llama-spm-Q8_0.gguf", "tiny",
       [&](SyntheticModelSpec& s) {
         llama_dims(96, 2, 6, 256)(s);
         s.dtype = DType::Q8_0;
         s.tied_output = true;
       }},
      {"llama-spm-Q4_0.gguf", "tiny",
       [&](SyntheticModelSpec& s) {
         llama_dims(96, 2, 6, 256)(s);
         s.dtype = DType::Q4_0;
         s.embd_dtype = DType::Q8_0;
         s.tied_output = true;
       }},
      {"qwen2-gpt2-f16.gguf", "tiny-qwen2", nullptr},
      {"qwen3-gpt2-f16.gguf", "tiny-qwen3", nullptr},
      {"gemma3-spm-f16.gguf", "tiny-gemma3", nullptr},
      {"mamba-spm-f16.gguf", "tiny-mamba", nullptr},
      {"mamba2-spm-f16.gguf", "tiny-mamba2", nullptr},
      {"jamba-spm-f16.gguf", "tiny-jamba", nullptr},
  };
  TempDir dir;
  for (const FixtureLikeCase& c : cases) {
    SCOPED_TRACE(c.fixture);
    auto fixture = File::open(fixtures + "/models/" + c.fixture);
    const std::string arch = fixture->require_string("general.architecture");
    SyntheticModelSpec spec = synthetic_preset(c.preset);
    if (c.adjust) c.adjust(spec);
    spec.n_vocab = fixture->require_int(arch + ".vocab_size");
    const std::string path = dir.file(std::string("like-") + c.fixture);
    make_synthetic_model(spec, path);
    auto ours = File::open(path);
    EXPECT_EQ(ours->require_string("general.architecture"), arch);
    const bool spm = fixture->get_string("tokenizer.ggml.model") == "llama";
    expect_same_structure(*fixture, *ours, spm);
  }
}

// Mean and standard deviation of a tensor's values.
std::pair<double, double> moments(const gguf::TensorInfo& t) {
  const int64_t n = static_cast<int64_t>(t.n_elements());
  std::vector<float> v(n);
  dequantize_row(t.type, t.data, v.data(), n);
  double sum = 0, sq = 0;
  for (float x : v) sum += x;
  const double mean = sum / n;
  for (float x : v) sq += (x - mean) * (x - mean);
  return {mean, std::sqrt(sq / n)};
}

TEST(SyntheticModel, TinyPresetIsWellConditionedAndUsable) {
  TempDir dir;
  const SyntheticModelSpec spec = synthetic_preset("tiny");
  make_synthetic_model(spec, dir.file("tiny.gguf"));
  auto f = File::open(dir.file("tiny.gguf"));
  uint64_t params = 0;
  for (const auto& t : f->tensors()) params += t.n_elements();
  EXPECT_GT(params, 900'000u);
  EXPECT_LT(params, 1'200'000u);
  EXPECT_EQ(f->require_int("llama.embedding_length"), 128);
  EXPECT_EQ(f->require_int("llama.attention.head_count_kv"), 2);
  EXPECT_EQ(f->require_tensor("output.weight").shape, (std::vector<uint64_t>{128, 1024}));

  for (const auto& t : f->tensors()) {
    SCOPED_TRACE(t.name);
    auto [mean, sd] = moments(t);
    if (t.shape.size() == 1) {  // norms: around 1, never exactly 1
      EXPECT_EQ(t.type, DType::F32);
      EXPECT_NEAR(mean, 1.0, 0.08);
      EXPECT_GT(sd, 0.1);
      const float* v = reinterpret_cast<const float*>(t.data);
      for (uint64_t i = 0; i < t.n_elements(); ++i) ASSERT_NE(v[i], 1.0f);
    } else if (t.name == "token_embd.weight") {
      EXPECT_NEAR(sd, 1.0, 0.02);
    } else {
      EXPECT_NEAR(mean, 0.0, 0.01);
      EXPECT_NEAR(sd, 1.0 / std::sqrt(static_cast<double>(t.shape[0])), 0.05 / std::sqrt(t.shape[0] * 1.0));
    }
  }

  // The tokenizer: SentencePiece layout with byte fallback.
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_bool("tokenizer.ggml.add_bos_token"), true);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), 2);
  const auto& tokens = f->find("tokenizer.ggml.tokens")->strings;
  const auto types = f->find("tokenizer.ggml.token_type")->int_array("token_type");
  const auto scores = f->find("tokenizer.ggml.scores")->float_array("scores");
  ASSERT_EQ(tokens.size(), 1024u);
  ASSERT_EQ(types.size(), 1024u);
  ASSERT_EQ(scores.size(), 1024u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(tokens[3 + 0x41], "<0x41>");
  EXPECT_EQ(tokens[258], "<0xFF>");
  for (int i = 3; i < 259; ++i) EXPECT_EQ(types[i], 6);
  EXPECT_EQ(tokens[259], "\xE2\x96\x81");
  EXPECT_EQ(std::set<std::string_view>(tokens.begin(), tokens.end()).size(), tokens.size());
  EXPECT_NE(std::find(tokens.begin(), tokens.end(), "\xE2\x96\x81the"), tokens.end());
  EXPECT_NE(std::find(tokens.begin(), tokens.end(), "\xE2\x96\x81Once"), tokens.end());
  for (size_t i = 260; i < tokens.size(); ++i) {
    EXPECT_EQ(types[i], 1);
    ASSERT_LT(scores[i], scores[i - 1]) << "scores rank pieces by order";
  }
}

TEST(SyntheticModel, IsDeterministicAndSeeded) {
  TempDir dir;
  SyntheticModelSpec spec = synthetic_preset("tiny-qwen3");
  spec.dtype = DType::Q4_0;
  make_synthetic_model(spec, dir.file("a.gguf"));
  make_synthetic_model(spec, dir.file("b.gguf"));
  spec.seed = 2;
  make_synthetic_model(spec, dir.file("c.gguf"));
  const Bytes a = read_file(dir.file("a.gguf")), b = read_file(dir.file("b.gguf")),
              c = read_file(dir.file("c.gguf"));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_NE(a, c);
  // Every tensor changes with the seed, not just some.
  auto fa = File::from_bytes(a, "a.gguf"), fc = File::from_bytes(c, "c.gguf");
  for (const auto& t : fa->tensors())
    EXPECT_FALSE(std::equal(t.data, t.data + t.n_bytes, fc->require_tensor(t.name).data)) << t.name;
}

// One layer of the tiny preset with rows of 256 and 512, so the K types fill
// whole super-blocks.
SyntheticModelSpec whole_super_block_spec() {
  SyntheticModelSpec spec = synthetic_preset("tiny");
  spec.n_layer = 1;
  spec.n_embd = 256;
  spec.head_dim = 64;
  spec.n_ff = 512;
  return spec;
}

TEST(SyntheticModel, EveryWeightDtype) {
  TempDir dir;
  SyntheticModelSpec spec = whole_super_block_spec();
  spec.dtype = DType::F32;
  make_synthetic_model(spec, dir.file("f32.gguf"));
  auto reference = File::open(dir.file("f32.gguf"));
  for (DType t : {DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1,
                  DType::IQ4_NL, DType::IQ4_XS, DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
    SCOPED_TRACE(dtype_name(static_cast<uint32_t>(t)));
    spec.dtype = t;
    const std::string path = dir.file(std::string(dtype_name(static_cast<uint32_t>(t))) + ".gguf");
    make_synthetic_model(spec, path);
    auto f = File::open(path);
    for (const auto& info : f->tensors()) {
      EXPECT_EQ(info.type, info.shape.size() == 1 ? DType::F32 : t) << info.name;
      const auto& ref = reference->require_tensor(info.name);
      const int64_t n = static_cast<int64_t>(info.n_elements());
      std::vector<float> got(n), want(n);
      dequantize_row(info.type, info.data, got.data(), n);
      dequantize_row(ref.type, ref.data, want.data(), n);
      // Same underlying values: the difference is only the type's rounding.
      const double tol = t == DType::Q2_K                     ? 0.35
                         : t == DType::Q3_K                   ? 0.3
                         : t == DType::Q4_0 || t == DType::Q4_K ? 0.25
                         : t == DType::IQ4_NL                 ? 0.12
                         : t == DType::IQ4_XS                 ? 0.15
                         : t == DType::Q4_1                   ? 0.15
                         : t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q5_K ? 0.12
                         : t == DType::Q6_K                   ? 0.06
                         : t == DType::Q8_0                   ? 0.02
                                                              : 0.01;
      double worst = 0, scale = 0;
      for (int64_t i = 0; i < n; ++i) {
        worst = std::max(worst, static_cast<double>(std::fabs(got[i] - want[i])));
        scale = std::max(scale, static_cast<double>(std::fabs(want[i])));
      }
      EXPECT_LE(worst, tol * scale) << info.name;
    }
    const int64_t file_type = f->require_int("general.file_type");
    // llama.cpp's LLAMA_FTYPE values (the K types as their _S variants).
    const int64_t want_type = t == DType::F16    ? 1
                              : t == DType::BF16 ? 32
                              : t == DType::Q8_0 ? 7
                              : t == DType::Q4_0 ? 2
                              : t == DType::Q4_1 ? 3
                              : t == DType::Q5_0 ? 8
                              : t == DType::Q5_1 ? 9
                              : t == DType::Q4_K ? 14
                              : t == DType::Q5_K ? 16
                              : t == DType::Q2_K ? 10
                              : t == DType::Q3_K ? 11
                              : t == DType::IQ4_NL ? 25
                              : t == DType::IQ4_XS ? 30
                                                 : 18;
    EXPECT_EQ(file_type, want_type);
    EXPECT_EQ(f->find("general.quantization_version") != nullptr, t != DType::F16 && t != DType::BF16);
  }
}

// Memory accounting (--models-max-ram) counts a model as its file plus what
// packing adds: nothing for the types packed at their stored size, a few
// percent for the K types' unpacked scales (Q3_K's: 3.625 bits per weight
// against 3.4375), about a quarter for Q2_K's scales and mins.
TEST(SyntheticModel, PackingGrowthCountsWidenedTypes) {
  TempDir dir;
  SyntheticModelSpec spec = whole_super_block_spec();
  for (DType t : {DType::Q4_0, DType::Q8_0, DType::Q2_K, DType::Q4_K, DType::Q3_K, DType::IQ4_NL, DType::IQ4_XS}) {
    SCOPED_TRACE(dtype_name(static_cast<uint32_t>(t)));
    spec.dtype = t;
    const std::string path = dir.file(std::string(dtype_name(static_cast<uint32_t>(t))) + ".gguf");
    make_synthetic_model(spec, path);
    auto f = File::open(path);
    uint64_t want = 0, stored = 0;
    for (const auto& info : f->tensors()) {
      if (info.shape.size() != 2) continue;
      MatrixView v;
      v.type = info.type;
      v.data = info.data;
      v.n_in = static_cast<int64_t>(info.shape[0]);
      v.n_out = static_cast<int64_t>(info.shape[1]);
      v.row_bytes = dtype_row_bytes(info.type, info.shape[0]);
      const size_t packed = PackedMatrix(v).packed_bytes();
      EXPECT_EQ(packed_matrix_bytes(info.type, v.n_in, v.n_out), packed) << info.name;
      if (packed > info.n_bytes) want += packed - info.n_bytes;
      stored += info.n_bytes;
    }
    const uint64_t growth = packing_growth_bytes(*f);
    EXPECT_EQ(growth, want);
    if (t == DType::Q4_K || t == DType::IQ4_XS || t == DType::Q3_K) {
      EXPECT_GT(growth, 0u);
      EXPECT_LT(growth, stored / 10) << "only the scales grow";
    } else if (t == DType::Q2_K) {
      // 3.25 bits per weight packed against 2.625 stored: the scales and mins
      // as bytes.
      EXPECT_GT(growth, stored / 5);
      EXPECT_LT(growth, stored * 3 / 10);
    } else {
      EXPECT_EQ(growth, 0u) << "packed at the stored size";
    }
  }
}

// Rows that are not whole 256-element super-blocks (the tiny preset's 128
// and 384) fall back as llama-quantize's do: Q2_K, Q3_K and IQ4_XS -> IQ4_NL,
// Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0.
TEST(SyntheticModel, KTypesFallBackLikeLlamaQuantize) {
  TempDir dir;
  SyntheticModelSpec spec = synthetic_preset("tiny");
  spec.n_layer = 1;
  for (auto [k, fallback] : {std::pair{DType::Q2_K, DType::IQ4_NL}, {DType::Q3_K, DType::IQ4_NL}, {DType::IQ4_XS, DType::IQ4_NL}, {DType::Q4_K, DType::Q5_0},
                             {DType::Q5_K, DType::Q5_1}, {DType::Q6_K, DType::Q8_0}}) {
    SCOPED_TRACE(dtype_name(static_cast<uint32_t>(k)));
    spec.dtype = k;
    const std::string path = dir.file(std::string(dtype_name(static_cast<uint32_t>(k))) + ".gguf");
    make_synthetic_model(spec, path);
    auto f = File::open(path);
    for (const auto& info : f->tensors())
      EXPECT_EQ(info.type, info.shape.size() == 1 ? DType::F32 : fallback) << info.name;
  }
}

// llama-quantize's Q4_K_M and Q5_K_M: Q6_K for the output and, in the layers
// it gives more bits (8 layers: 0, 3, 6 and 7), for attn_v and ffn_down;
// everything else in the base type. The file says _M, and it loads and
// decodes like any mixed-type file.
TEST(SyntheticModel, KQuantMediumMixes) {
  TempDir dir;
  SyntheticModelSpec spec = whole_super_block_spec();
  spec.n_layer = 8;
  for (auto [base, file_type] : {std::pair{DType::Q4_K, 15}, {DType::Q5_K, 17}}) {
    SCOPED_TRACE(dtype_name(static_cast<uint32_t>(base)));
    spec.dtype = base;
    spec.more_bits_dtype = DType::Q6_K;
    const std::string path = dir.file(std::string(dtype_name(static_cast<uint32_t>(base))) + "_M.gguf");
    make_synthetic_model(spec, path);
    auto f = File::open(path);
    EXPECT_EQ(f->require_int("general.file_type"), file_type);
    int more_bits = 0;
    for (const auto& info : f->tensors()) {
      if (info.shape.size() == 1) continue;
      const std::string& n = info.name;
      const bool v_or_down = n.ends_with("attn_v.weight") || n.ends_with("ffn_down.weight");
      const int layer = n.starts_with("blk.") ? std::stoi(n.substr(4)) : -1;
      const bool more_bits_layer = layer == 0 || layer == 3 || layer == 6 || layer == 7;
      const bool wants_more = n == "output.weight" || (v_or_down && more_bits_layer);
      EXPECT_EQ(info.type, wants_more ? DType::Q6_K : base) << n;
      more_bits += wants_more;
    }
    EXPECT_EQ(more_bits, 1 + 2 * 4);
    auto bundle = load_model_bundle(path);
    ThreadPool pool(2);
    std::vector<float> logits;
    FlatMemory memory(bundle->model->state_spec());
    const std::vector<int32_t> tokens = {1, 5, 9, 13};
    ForwardBatch batch;
    batch.tokens = tokens;
    bundle->model->forward(batch, memory, logits, pool);
    ASSERT_EQ(static_cast<int64_t>(logits.size()), bundle->model->info().n_vocab);
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(SyntheticModel, QuantizedSsmKeepsSmallTensorsUnquantized) {
  TempDir dir;
  SyntheticModelSpec spec = synthetic_preset("tiny-mamba");
  spec.dtype = DType::Q4_0;
  spec.dt_rank = 8;  // not a multiple of 32 either way
  make_synthetic_model(spec, dir.file("m.gguf"));
  auto f = File::open(dir.file("m.gguf"));
  EXPECT_EQ(f->require_tensor("blk.0.ssm_in.weight").type, DType::Q4_0);
  EXPECT_EQ(f->require_tensor("blk.0.ssm_out.weight").type, DType::Q4_0);
  EXPECT_EQ(f->require_tensor("blk.0.ssm_x.weight").type, DType::F16);
  EXPECT_EQ(f->require_tensor("blk.0.ssm_dt.weight").type, DType::F16);
  EXPECT_EQ(f->require_tensor("blk.0.ssm_conv1d.weight").type, DType::F32);
  EXPECT_EQ(f->require_tensor("blk.0.ssm_a").type, DType::F32);
  EXPECT_EQ(f->require_int("mamba.ssm.time_step_rank"), 8);
  const auto& a = f->require_tensor("blk.1.ssm_a");
  const float* av = reinterpret_cast<const float*>(a.data);
  for (uint64_t i = 0; i < a.n_elements(); ++i) ASSERT_LT(av[i], 0.0f) << "A must be negative";
  const auto& dt = f->require_tensor("blk.1.ssm_dt.bias");
  const float* dv = reinterpret_cast<const float*>(dt.data);
  for (uint64_t i = 0; i < dt.n_elements(); ++i) {
    ASSERT_GE(dv[i], -6.9f);
    ASSERT_LE(dv[i], -2.25f);
  }
}

TEST(SyntheticModel, LargerPresets) {
  TempDir dir;
  {
    SyntheticModelSpec spec = synthetic_preset("jamba-small");
    make_synthetic_model(spec, dir.file("jamba.gguf"));
    auto f = File::open(dir.file("jamba.gguf"));
    const auto kv = f->find("jamba.attention.head_count_kv")->int_array("kv");
    EXPECT_EQ(kv, (std::vector<int64_t>{0, 0, 0, 0, 2, 0, 0, 0}));
    EXPECT_NE(f->tensor("blk.4.attn_q.weight"), nullptr);
    EXPECT_EQ(f->tensor("blk.4.ssm_in.weight"), nullptr);
    EXPECT_EQ(f->require_tensor("blk.1.ffn_up_exps.weight").shape, (std::vector<uint64_t>{256, 512, 4}));
    EXPECT_EQ(f->tensor("blk.2.ffn_gate_inp.weight"), nullptr);
    EXPECT_EQ(f->require_int("jamba.expert_used_count"), 2);
  }
  {
    // The benchmark shape; written in Q4_0 to keep the test's disk use small.
    SyntheticModelSpec spec = synthetic_preset("60m");
    EXPECT_EQ(spec.n_embd, 512);
    EXPECT_EQ(spec.n_layer, 8);
    EXPECT_EQ(spec.n_head, 8);
    EXPECT_EQ(spec.n_head_kv, 8);
    EXPECT_EQ(spec.head_dim, 64);
    EXPECT_EQ(spec.n_ff, 1536);
    EXPECT_EQ(spec.n_vocab, 32000);
    EXPECT_EQ(spec.n_ctx, 2048);
    EXPECT_FALSE(spec.tied_output);
    spec.dtype = DType::Q4_0;
    make_synthetic_model(spec, dir.file("60m.gguf"));
    auto f = File::open(dir.file("60m.gguf"));
    uint64_t params = 0;
    for (const auto& t : f->tensors()) params += t.n_elements();
    EXPECT_GT(params, 55'000'000u);
    EXPECT_LT(params, 65'000'000u);
    EXPECT_EQ(f->require_tensor("output.weight").type, DType::Q4_0);
    EXPECT_EQ(f->find("tokenizer.ggml.tokens")->strings.size(), 32000u);
  }
  for (const std::string& name : synthetic_preset_names()) EXPECT_NO_THROW(validate_synthetic_spec(synthetic_preset(name))) << name;
  EXPECT_THROW(synthetic_preset("huge"), Error);
}

TEST(SyntheticModel, RejectsInconsistentSpecs) {
  auto expect_bad = [](const std::function<void(SyntheticModelSpec&)>& edit, const char* fragment) {
    SyntheticModelSpec s = synthetic_preset("tiny");
    edit(s);
    try {
      validate_synthetic_spec(s);
      ADD_FAILURE() << "accepted; expected " << fragment;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    }
  };
  expect_bad([](auto& s) { s.arch = "gpt9"; }, "unknown architecture");
  expect_bad([](auto& s) { s.n_head_kv = 3; }, "n_head_kv");
  expect_bad([](auto& s) { s.n_vocab = 100; }, "n_vocab");
  expect_bad([](auto& s) { s.dtype = DType::IQ2_XS; }, "dtype");
  expect_bad([](auto& s) { s.head_dim = 31; }, "head_dim");
  expect_bad([](auto& s) {
    s.dtype = DType::Q8_0;
    s.more_bits_dtype = DType::Q6_K;
  }, "_M mixes");
  expect_bad([](auto& s) {
    s.arch = "mamba2";
    s.ssm_n_head = 7;
  }, "ssm_n_head");
  expect_bad([](auto& s) {
    s.arch = "jamba";
    s.attention_layers = {true};
  }, "one entry per layer");
  expect_bad([](auto& s) {
    s.arch = "jamba";
    s.moe_layers = std::vector<bool>(s.n_layer, true);
    s.n_expert = 2;
    s.n_expert_used = 3;
  }, "n_expert_used");
  EXPECT_THROW(make_synthetic_model([] {
                 SyntheticModelSpec s;
                 s.arch = "gpt9";
                 return s;
               }(), "/nonexistent/x.gguf"),
               Error);
  EXPECT_THROW(synthetic_vocab(259), Error);
  const auto v = synthetic_vocab(50257);
  EXPECT_EQ(std::set<std::string>(v.begin(), v.end()).size(), 50257u);
}

}  // namespace
