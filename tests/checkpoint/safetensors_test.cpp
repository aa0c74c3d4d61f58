// The safetensors header (torus/checkpoint/safetensors.h): encode -> parse
// round trips, a fixed corpus of malformed headers each refused with its own
// message, valid edge cases, read_header on files, and interoperation with
// the Python `safetensors` package in both directions.
#include "torus/checkpoint/safetensors.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/file_io.h"

namespace torus::ckpt {
namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

Bytes le64(uint64_t v) {
  Bytes out(8);
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
  return out;
}

// A whole file: the length field of `json`, `json`, then `data` zero bytes.
Bytes file_of(const std::string& json, uint64_t data = 0) {
  Bytes out = le64(json.size());
  out.insert(out.end(), json.begin(), json.end());
  out.resize(out.size() + data, 0);
  return out;
}

std::string entry(const std::string& dtype, const std::string& shape, uint64_t begin, uint64_t end) {
  return R"({"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":[)" + std::to_string(begin) + "," +
         std::to_string(end) + "]}";
}

std::string error_of(const Bytes& bytes, uint64_t file_size, const std::string& what) {
  try {
    parse_header(bytes, file_size, what);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "<accepted>";
}

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "torus-ckpt-XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

void write_bytes(const std::string& path, const Bytes& b) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// ---- dtypes -----------------------------------------------------------------

TEST(Safetensors, DtypeSizes) {
  const std::pair<const char*, size_t> table[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},  {"I32", 4},     {"I16", 2},    {"I8", 1},
      {"U8", 1},  {"U16", 2}, {"U32", 4}, {"U64", 8},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [code, bytes] : table) {
    EXPECT_TRUE(known_dtype(code)) << code;
    EXPECT_EQ(dtype_bytes(code), bytes) << code;
  }
  for (const char* bad : {"", "f32", "F128", "FLOAT", "F32 ", "C64"}) {
    EXPECT_FALSE(known_dtype(bad)) << bad;
    EXPECT_THROW(dtype_bytes(bad), CheckpointError) << bad;
  }
}

// ---- round trip ---------------------------------------------------------------

std::vector<TensorEntry> sample_tensors() {
  return {
      {"model.embed.weight", "F32", {4, 3}, 0, 48},
      {"model.ln.bias", "BF16", {3}, 48, 54},
      {"empty", "F16", {0, 5}, 54, 54},
      {"step", "I64", {}, 54, 62},
      {"mask", "BOOL", {2, 1}, 62, 64},
      {"q8", "F8_E4M3", {3}, 64, 67},
      {"weird \"name\"\n\u00e9", "U64", {1}, 67, 75},
  };
}

TEST(Safetensors, RoundTrip) {
  const auto tensors = sample_tensors();
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"torus", "{\"step\": 3}"}, {"empty", ""}};
  Bytes file = encode_header(tensors, meta);
  const uint64_t n = file.size() - 8;
  EXPECT_EQ(file.size() % 8, 0u) << "the data section must start 8-byte aligned";
  uint64_t len = 0;
  std::memcpy(&len, file.data(), 8);
  EXPECT_EQ(len, n);
  const std::string text(file.begin() + 8, file.end());
  EXPECT_EQ(text.rfind(R"({"__metadata__":{)", 0), 0u) << text;
  // Keys in the order given.
  EXPECT_LT(text.find("model.embed.weight"), text.find("model.ln.bias"));
  EXPECT_LT(text.find("model.ln.bias"), text.find(R"("empty":{"dtype")"));

  file.resize(file.size() + 75, 0xAB);
  Header h = parse_header(file, file.size(), "mem");
  EXPECT_EQ(h.data_offset, 8 + n);
  EXPECT_EQ(h.data_bytes, 75u);
  EXPECT_EQ(h.metadata, meta);
  ASSERT_EQ(h.tensors.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    // Sorted by begin; "empty" (54, 54) sorts before "step" (54, 62).
    const TensorEntry& want = tensors[i];
    const TensorEntry* got = h.find(want.name);
    ASSERT_NE(got, nullptr) << want.name;
    EXPECT_EQ(got->dtype, want.dtype);
    EXPECT_EQ(got->shape, want.shape);
    EXPECT_EQ(got->begin, want.begin);
    EXPECT_EQ(got->end, want.end);
    EXPECT_EQ(h.tensors[i].name, want.name);
  }
  EXPECT_EQ(h.find("absent"), nullptr);
}

TEST(Safetensors, EncodeWithoutMetadataHasNoMetadataKey) {
  Bytes file = encode_header({{"a", "F32", {2}, 0, 8}});
  const std::string text(file.begin() + 8, file.end());
  EXPECT_EQ(text.find("__metadata__"), std::string::npos);
  EXPECT_EQ(text.rfind(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 0), 0u) << text;
  file.resize(file.size() + 8);
  EXPECT_EQ(parse_header(file, file.size(), "mem").tensors.size(), 1u);
  // No tensors at all: "{}" padded to 8 bytes.
  Bytes none = encode_header({});
  EXPECT_EQ(std::string(none.begin() + 8, none.end()), "{}      ");
  EXPECT_TRUE(parse_header(none, none.size(), "mem").tensors.empty());
}

TEST(Safetensors, EncodeRefusesBadInput) {
  using V = std::vector<TensorEntry>;
  const std::pair<V, const char*> cases[] = {
      {{{"a", "F32", {2}, 4, 12}}, "must be [0, 8]"},
      {{{"a", "F32", {2}, 0, 8}, {"b", "F32", {2}, 12, 20}}, "must be [8, 16]"},
      {{{"a", "F32", {2}, 0, 4}}, "must be [0, 8]"},
      {{{"a", "F32", {2}, 8, 0}}, "must be [0, 8]"},
      {{{"b", "F32", {2}, 8, 16}, {"a", "F32", {2}, 0, 8}}, "order given"},
      {{{"a", "F33", {2}, 0, 8}}, "unknown safetensors dtype \"F33\""},
      {{{"", "F32", {2}, 0, 8}}, "must not be empty"},
      {{{std::string(kMaxNameBytes + 1, 'x'), "F32", {2}, 0, 8}}, "exceeds the limit of 4096"},
      {{{"__metadata__", "F32", {2}, 0, 8}}, "not a valid tensor name"},
      {{{"a", "F32", {2}, 0, 8}, {"a", "F32", {2}, 8, 16}}, "named twice"},
      {{{"a", "F32", {-1, 2}, 0, 8}}, "negative dimension -1"},
      {{{"a", "F32", {int64_t{1} << 62, 4}, 0, 8}}, "overflows 64 bits"},
      {{{"bad\xff", "F32", {2}, 0, 8}}, "not valid UTF-8"},
  };
  for (const auto& [tensors, fragment] : cases) {
    try {
      encode_header(tensors);
      ADD_FAILURE() << "accepted; expected: " << fragment;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what() << "\nexpected: " << fragment;
    }
  }
  EXPECT_THROW(encode_header({}, {{"k", "\xc3"}}), InvalidArgument);
}

// ---- valid edge cases -------------------------------------------------------

TEST(Safetensors, AcceptsEdgeCases) {
  {  // metadata only, no tensors, no data
    Bytes f = file_of(R"({"__metadata__":{"a":"b","c":""}})");
    Header h = parse_header(f, f.size(), "meta-only");
    EXPECT_TRUE(h.tensors.empty());
    EXPECT_EQ(h.metadata.at("a"), "b");
    EXPECT_EQ(h.metadata.at("c"), "");
    EXPECT_EQ(h.data_bytes, 0u);
  }
  {  // empty object, then padding spaces and newlines
    Bytes f = file_of("{}  \n\t  ");
    EXPECT_TRUE(parse_header(f, f.size(), "empty").tensors.empty());
  }
  {  // zero-sized tensors sharing offsets with others, a scalar, one at the end
    std::string j = "{\"z0\":" + entry("F32", "[0]", 0, 0) + ",\"a\":" + entry("F32", "[2]", 0, 8) +
                    ",\"z1\":" + entry("I64", "[3,0,7]", 8, 8) + ",\"z2\":" + entry("U8", "[0]", 8, 8) +
                    ",\"s\":" + entry("F64", "[]", 8, 16) + ",\"zend\":" + entry("BOOL", "[0]", 16, 16) +
                    ",\"big0\":" + entry("F64", "[0,4611686018427387904,4611686018427387904]", 16, 16) + "}";
    Bytes f = file_of(j, 16);
    Header h = parse_header(f, f.size(), "edges");
    ASSERT_EQ(h.tensors.size(), 7u);
    std::vector<std::string> order;
    for (const auto& t : h.tensors) order.push_back(t.name);
    EXPECT_EQ(order, (std::vector<std::string>{"z0", "a", "z1", "z2", "s", "big0", "zend"}));
    EXPECT_TRUE(h.find("s")->shape.empty());
    EXPECT_EQ(h.find("z1")->shape, (std::vector<int64_t>{3, 0, 7}));
  }
  {  // a prefix longer than the header is fine (the caller read a block)
    Bytes f = file_of("{\"a\":" + entry("U8", "[4]", 0, 4) + "}", 4);
    Bytes prefix(f.begin(), f.end());
    EXPECT_EQ(parse_header(prefix, f.size(), "block").data_bytes, 4u);
  }
}

// ---- the corpus of malformed headers ----------------------------------------

struct BadCase {
  const char* label;
  Bytes bytes;         // the bytes the reader is given
  uint64_t file_size;  // the size of the file they start
  const char* fragment;
};

BadCase json_case(const char* label, const std::string& json, uint64_t data, const char* fragment) {
  Bytes b = file_of(json, data);
  uint64_t size = b.size();
  return {label, std::move(b), size, fragment};
}

std::vector<BadCase> corpus() {
  const std::string a8 = entry("F32", "[2]", 0, 8);
  std::vector<BadCase> c;
  // The length field.
  c.push_back({"length_field_truncated", {1, 0, 0, 0, 0}, 5, "shorter than the 8-byte header length field"});
  c.push_back({"empty_file", {}, 0, "shorter than the 8-byte header length field"});
  c.push_back({"length_zero", le64(0), 8, "header length is 0"});
  {
    Bytes b = le64(100);
    b.push_back('{');
    b.push_back('}');
    c.push_back({"length_beyond_file", b, 10, "header length 100 runs past the end of the file (10 bytes)"});
  }
  c.push_back({"length_huge", le64(uint64_t{1} << 62), 1 << 20, "exceeds the limit of 104857600 bytes"});
  c.push_back({"length_max", le64(UINT64_MAX), 64, "exceeds the limit"});
  c.push_back({"length_just_over_limit", le64(kMaxHeaderBytes + 1), kMaxHeaderBytes + 100, "exceeds the limit"});
  {
    Bytes b = file_of("{}");
    b.resize(9);  // the caller read less than the header
    c.push_back({"prefix_short_of_header", b, 10, "only 1 of the header's 2 bytes"});
  }
  // The JSON.
  c.push_back(json_case("invalid_json", R"({"a":)", 0, "not valid JSON"));
  c.push_back(json_case("json_array", "[]", 0, "header is a JSON array, not an object"));
  c.push_back(json_case("json_string", R"("x")", 0, "header is a JSON string, not an object"));
  c.push_back(json_case("json_null", "null", 0, "header is a JSON null, not an object"));
  c.push_back(json_case("trailing_garbage", "{} x", 0, "not valid JSON"));
  // nlohmann would stop at a NUL byte and ignore whatever follows.
  c.push_back(json_case("nul_padding", std::string("{}\0\0", 4), 0, "NUL byte at offset 2"));
  c.push_back(json_case("nul_then_more", std::string("{}\0{\"a\":1}", 10), 0, "NUL byte at offset 2"));
  c.push_back(json_case("comment", "/**/{}", 0, "not valid JSON"));
  c.push_back(json_case("invalid_utf8_name", "{\"\xff\":" + a8 + "}", 8, "not valid JSON"));
  c.push_back(json_case("duplicate_tensor", "{\"a\":" + a8 + ",\"a\":" + a8 + "}", 8, "duplicate key \"a\""));
  c.push_back(json_case("duplicate_field",
                        R"({"a":{"dtype":"F32","dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 8,
                        "duplicate key \"dtype\""));
  c.push_back(json_case("duplicate_metadata", R"({"__metadata__":{"k":"1","k":"2"}})", 0, "duplicate key \"k\""));
  c.push_back(json_case("nested_garbage",
                        R"({"a":{"dtype":"F32","shape":[[[2]]],"data_offsets":[0,8]}})", 8, "nested deeper"));
  c.push_back(json_case("deep_nesting", std::string(100000, '['), 0, "nested deeper"));
  c.push_back(json_case("deep_metadata", R"({"__metadata__":{"k":{"x":"y"}}})", 0,
                        "__metadata__ value of \"k\" is a JSON object, not a string"));
  // Entries.
  c.push_back(json_case("entry_not_object", R"({"a":[1,2]})", 0, "tensor \"a\": entry is a JSON array"));
  c.push_back(json_case("unknown_dtype", "{\"a\":" + entry("F17", "[2]", 0, 8) + "}", 8, "unknown dtype \"F17\""));
  c.push_back(json_case("lowercase_dtype", "{\"a\":" + entry("f32", "[2]", 0, 8) + "}", 8, "unknown dtype \"f32\""));
  c.push_back(json_case("dtype_not_string", R"({"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}})", 8,
                        "dtype is a JSON number, not a string"));
  c.push_back(json_case("negative_dim", "{\"a\":" + entry("F32", "[-1,2]", 0, 8) + "}", 8,
                        "dimension 0 is negative (-1)"));
  c.push_back(json_case("non_integer_dim", "{\"a\":" + entry("F32", "[2.5]", 0, 8) + "}", 8,
                        "dimension 0 is not a non-negative integer: 2.5"));
  c.push_back(json_case("string_dim", "{\"a\":" + entry("F32", "[1,\"2\"]", 0, 8) + "}", 8,
                        "dimension 1 is not a non-negative integer: \"2\""));
  c.push_back(json_case("bool_dim", "{\"a\":" + entry("F32", "[true]", 0, 4) + "}", 4,
                        "dimension 0 is not a non-negative integer: true"));
  c.push_back(json_case("dim_past_int64", "{\"a\":" + entry("U8", "[9223372036854775808]", 0, 8) + "}", 8,
                        "does not fit in 64-bit signed"));
  c.push_back(json_case("dim_past_uint64", "{\"a\":" + entry("U8", "[18446744073709551616]", 0, 8) + "}", 8,
                        "not a non-negative integer"));
  c.push_back(json_case("shape_not_list", "{\"a\":" + entry("F32", "2", 0, 8) + "}", 8,
                        "shape is a JSON number, not a list"));
  c.push_back(json_case("shape_object", "{\"a\":" + entry("F32", "{}", 0, 8) + "}", 8,
                        "shape is a JSON object, not a list"));
  c.push_back(json_case("numel_overflow", "{\"a\":" + entry("U8", "[4294967296,4294967296]", 0, 8) + "}", 8,
                        "overflows 64 bits"));
  c.push_back(json_case("bytes_overflow", "{\"a\":" + entry("F64", "[4611686018427387904]", 0, 8) + "}", 8,
                        "overflows 64 bits"));
  c.push_back(json_case("offsets_reversed", "{\"a\":" + entry("F32", "[2]", 8, 0) + "}", 8,
                        "data_offsets [8, 0] are reversed"));
  c.push_back(json_case("offsets_one", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8]}})", 8,
                        "data_offsets must be a list of two integers, got a list of 1"));
  c.push_back(json_case("offsets_three", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4,8]}})", 8,
                        "got a list of 3"));
  c.push_back(json_case("offsets_not_list", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":8}})", 8,
                        "got number"));
  c.push_back(json_case("offsets_negative", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})", 8,
                        "data_offsets must be non-negative integers, got [-8,0]"));
  c.push_back(json_case("offsets_float", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})", 8,
                        "must be non-negative integers"));
  c.push_back(json_case("size_mismatch", "{\"a\":" + entry("F32", "[2]", 0, 4) + "}", 4,
                        "span 4 bytes, but shape [2] of F32 needs 8"));
  c.push_back(json_case("scalar_size_mismatch", "{\"a\":" + entry("F64", "[]", 0, 4) + "}", 4,
                        "shape [] of F64 needs 8"));
  c.push_back(json_case("extra_key", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"offset":0}})", 8,
                        "unexpected key \"offset\""));
  c.push_back(json_case("missing_dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, "missing \"dtype\""));
  c.push_back(json_case("missing_shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, "missing \"shape\""));
  c.push_back(json_case("missing_offsets", R"({"a":{"dtype":"F32","shape":[2]}})", 8, "missing \"data_offsets\""));
  c.push_back(json_case("empty_name", "{\"\":" + a8 + "}", 8, "a tensor has an empty name"));
  c.push_back(json_case("name_too_long", "{\"" + std::string(kMaxNameBytes + 1, 'n') + "\":" + a8 + "}", 8,
                        "of 4097 bytes exceeds the limit of 4096"));
  // Layout.
  c.push_back(json_case("overlap", "{\"a\":" + a8 + ",\"b\":" + entry("F32", "[2]", 4, 12) + "}", 12,
                        "tensor \"b\" at [4, 12] overlaps tensor \"a\" at [0, 8]"));
  c.push_back(json_case("same_range", "{\"a\":" + a8 + ",\"b\":" + a8 + "}", 8, "overlaps"));
  c.push_back(json_case("zero_sized_inside", "{\"a\":" + a8 + ",\"z\":" + entry("F32", "[0]", 4, 4) + "}", 8,
                        "tensor \"z\" at [4, 4] overlaps"));
  c.push_back(json_case("hole", "{\"a\":" + a8 + ",\"b\":" + entry("F32", "[2]", 12, 20) + "}", 20,
                        "hole of 4 bytes between tensor \"a\" (ends at 8) and tensor \"b\" (begins at 12)"));
  c.push_back(json_case("not_at_zero", "{\"a\":" + entry("F32", "[2]", 4, 12) + "}", 12,
                        "data does not start at 0: the first tensor \"a\" begins at 4"));
  c.push_back(json_case("trailing_bytes", "{\"a\":" + a8 + "}", 12, "4 trailing bytes after the last tensor"));
  c.push_back(json_case("data_without_tensors", "{}", 8, "8 trailing bytes"));
  c.push_back(json_case("data_truncated", "{\"a\":" + a8 + "}", 4, "file is truncated: the tensors end at 8"));
  c.push_back(json_case("zero_sized_past_end", "{\"a\":" + a8 + ",\"z\":" + entry("F32", "[0]", 16, 16) + "}", 8,
                        "hole of 8 bytes"));
  // Metadata.
  c.push_back(json_case("metadata_number", R"({"__metadata__":{"k":1}})", 0,
                        "__metadata__ value of \"k\" is a JSON number, not a string"));
  c.push_back(json_case("metadata_null", R"({"__metadata__":{"k":null}})", 0, "is a JSON null, not a string"));
  c.push_back(json_case("metadata_not_object", R"({"__metadata__":"x"})", 0,
                        "__metadata__ is a JSON string, not an object"));
  c.push_back(json_case("metadata_list", R"({"__metadata__":["x"]})", 0, "__metadata__ is a JSON array"));
  return c;
}

TEST(Safetensors, RefusesTheMalformedCorpus) {
  const auto cases = corpus();
  ASSERT_GE(cases.size(), 25u);
  for (const auto& c : cases) {
    const std::string what = std::string("corpus/") + c.label;
    const std::string msg = error_of(c.bytes, c.file_size, what);
    EXPECT_NE(msg.find(c.fragment), std::string::npos) << c.label << ": " << msg << "\nexpected: " << c.fragment;
    EXPECT_EQ(msg.rfind("checkpoint: " + what + ": ", 0), 0u) << c.label << ": " << msg;
    EXPECT_LT(msg.size(), 600u) << c.label << ": messages stay short whatever the file holds";
  }
}

// ---- files ------------------------------------------------------------------

TEST(Safetensors, ReadHeaderFromFiles) {
  TempDir dir;
  Bytes good = encode_header({{"w", "F32", {2, 2}, 0, 16}}, {{"k", "v"}});
  good.resize(good.size() + 16, 1);
  write_bytes(dir.file("good.safetensors"), good);
  Header h = read_header(dir.file("good.safetensors"));
  EXPECT_EQ(h.tensors.at(0).name, "w");
  EXPECT_EQ(h.data_offset + h.data_bytes, good.size());

  Bytes cut(good.begin(), good.end() - 1);
  write_bytes(dir.file("cut.safetensors"), cut);
  EXPECT_THROW(
      {
        try {
          read_header(dir.file("cut.safetensors"));
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find(dir.file("cut.safetensors") + ": file is truncated"), std::string::npos)
              << e.what();
          throw;
        }
      },
      CheckpointError);

  Bytes header_cut(good.begin(), good.begin() + 20);
  write_bytes(dir.file("header-cut.safetensors"), header_cut);
  try {
    read_header(dir.file("header-cut.safetensors"));
    ADD_FAILURE() << "accepted a file cut inside its header";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("runs past the end of the file (20 bytes)"), std::string::npos) << e.what();
  }

  write_bytes(dir.file("tiny"), {1, 2, 3});
  try {
    read_header(dir.file("tiny"));
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("file of 3 bytes is shorter"), std::string::npos) << e.what();
  }

  for (const std::string& p : {dir.file("missing.safetensors"), dir.file("")}) {
    try {
      read_header(p);
      ADD_FAILURE() << p;
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  }
  try {
    read_header(dir.file("missing.safetensors"));
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("No such file or directory"), std::string::npos) << e.what();
  }
}

// ---- the Python safetensors package -------------------------------------------

std::string python() {
  const char* p = std::getenv("TORUS_PYTHON");
  return p != nullptr && *p != '\0' ? p : "python3";
}

// Fails the test when the interpreter with safetensors and numpy is not there
// (scripts/setup.sh installs both; tests.cmake passes the build's interpreter).
#define REQUIRE_PY_SAFETENSORS()                                                                            \
  do {                                                                                                      \
    if (std::system((python() + " -c 'import safetensors.numpy, numpy' >/dev/null 2>&1").c_str()) != 0) { \
      FAIL() << python() << " with the safetensors and numpy packages is not available";                    \
    }                                                                                                       \
  } while (0)

int run_python(const TempDir& dir, const std::string& script, const std::string& arg) {
  const std::string path = dir.file("script.py");
  std::ofstream(path) << script;
  return std::system((python() + " " + path + " " + arg).c_str());
}

template <typename T>
std::vector<T> values_at(const MappedFile& f, const Header& h, const std::string& name) {
  const TensorEntry* t = h.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ((t->end - t->begin) % sizeof(T), 0u);
  std::vector<T> out((t->end - t->begin) / sizeof(T));
  std::memcpy(out.data(), f.data() + h.data_offset + t->begin, t->end - t->begin);
  return out;
}

TEST(SafetensorsInterop, ReadsFilesOfThePythonPackage) {
  REQUIRE_PY_SAFETENSORS();
  TempDir dir;
  const std::string path = dir.file("py.safetensors");
  const char* script = R"PY(
import sys
import numpy as np
from safetensors.numpy import save_file
save_file({
    "f32": np.arange(6, dtype=np.float32).reshape(2, 3),
    "f64_scalar": np.array(3.25, dtype=np.float64),
    "f16": np.array([1.5, -2.0], dtype=np.float16),
    "i64": np.array([-5, 7, 1 << 40], dtype=np.int64),
    "i32": np.array([-3], dtype=np.int32),
    "i16": np.array([[1], [-2]], dtype=np.int16),
    "i8": np.array([-128, 127], dtype=np.int8),
    "u8": np.array([255, 0, 1], dtype=np.uint8),
    "u16": np.array([65535], dtype=np.uint16),
    "u32": np.array([4000000000], dtype=np.uint32),
    "u64": np.array([2**64 - 1], dtype=np.uint64),
    "bool": np.array([True, False, True]),
    "empty": np.zeros((0, 3), dtype=np.float32),
}, sys.argv[1], metadata={"format": "np", "note": "from python"})
)PY";
  ASSERT_EQ(run_python(dir, script, path), 0);
  Header h = read_header(path);
  EXPECT_EQ(h.metadata, (std::map<std::string, std::string>{{"format", "np"}, {"note", "from python"}}));
  ASSERT_EQ(h.tensors.size(), 13u);
  const std::map<std::string, std::pair<std::string, std::vector<int64_t>>> want{
      {"f32", {"F32", {2, 3}}}, {"f64_scalar", {"F64", {}}}, {"f16", {"F16", {2}}}, {"i64", {"I64", {3}}},
      {"i32", {"I32", {1}}},    {"i16", {"I16", {2, 1}}},    {"i8", {"I8", {2}}},   {"u8", {"U8", {3}}},
      {"u16", {"U16", {1}}},    {"u32", {"U32", {1}}},       {"u64", {"U64", {1}}}, {"bool", {"BOOL", {3}}},
      {"empty", {"F32", {0, 3}}}};
  for (const auto& [name, ds] : want) {
    const TensorEntry* t = h.find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, ds.first) << name;
    EXPECT_EQ(t->shape, ds.second) << name;
  }
  MappedFile f(path);
  ASSERT_EQ(f.size(), h.data_offset + h.data_bytes);
  EXPECT_EQ(values_at<float>(f, h, "f32"), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(values_at<double>(f, h, "f64_scalar"), (std::vector<double>{3.25}));
  EXPECT_EQ(values_at<uint16_t>(f, h, "f16"), (std::vector<uint16_t>{0x3E00, 0xC000}));
  EXPECT_EQ(values_at<int64_t>(f, h, "i64"), (std::vector<int64_t>{-5, 7, int64_t{1} << 40}));
  EXPECT_EQ(values_at<int32_t>(f, h, "i32"), (std::vector<int32_t>{-3}));
  EXPECT_EQ(values_at<int16_t>(f, h, "i16"), (std::vector<int16_t>{1, -2}));
  EXPECT_EQ(values_at<int8_t>(f, h, "i8"), (std::vector<int8_t>{-128, 127}));
  EXPECT_EQ(values_at<uint8_t>(f, h, "u8"), (std::vector<uint8_t>{255, 0, 1}));
  EXPECT_EQ(values_at<uint16_t>(f, h, "u16"), (std::vector<uint16_t>{65535}));
  EXPECT_EQ(values_at<uint32_t>(f, h, "u32"), (std::vector<uint32_t>{4000000000u}));
  EXPECT_EQ(values_at<uint64_t>(f, h, "u64"), (std::vector<uint64_t>{UINT64_MAX}));
  EXPECT_EQ(values_at<uint8_t>(f, h, "bool"), (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_TRUE(values_at<float>(f, h, "empty").empty());
}

TEST(SafetensorsInterop, PythonPackageReadsEncodedFiles) {
  REQUIRE_PY_SAFETENSORS();
  TempDir dir;
  const std::string path = dir.file("torus.safetensors");
  const float f32[6] = {0.5f, -1.0f, 2.0f, 3.5f, 1e-3f, -7.25f};
  const int64_t i64[3] = {-1, 0, int64_t{1} << 50};
  const uint8_t flags[2] = {1, 0};
  const double step = 42.0;
  const uint16_t f16[2] = {0x3C00, 0xC400};  // 1.0, -4.0
  std::vector<TensorEntry> tensors{
      {"layer.0.w", "F32", {2, 3}, 0, 24}, {"ids", "I64", {3}, 24, 48}, {"flags", "BOOL", {2}, 48, 50},
      {"none", "F16", {0}, 50, 50},         {"step", "F64", {}, 50, 58}, {"h", "F16", {2}, 58, 62}};
  Bytes file = encode_header(tensors, {{"format", "pt"}, {"torus.step", "42"}});
  auto append = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    file.insert(file.end(), b, b + n);
  };
  append(f32, sizeof(f32));
  append(i64, sizeof(i64));
  append(flags, sizeof(flags));
  append(&step, sizeof(step));
  append(f16, sizeof(f16));
  {
    FileWriter w(path);
    w.write(file.data(), file.size());
    w.close();
  }
  const char* script = R"PY(
import sys
import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
want = {
    "layer.0.w": np.array([[0.5, -1.0, 2.0], [3.5, 1e-3, -7.25]], dtype=np.float32),
    "ids": np.array([-1, 0, 1 << 50], dtype=np.int64),
    "flags": np.array([True, False]),
    "none": np.zeros((0,), dtype=np.float16),
    "step": np.array(42.0, dtype=np.float64),
    "h": np.array([1.0, -4.0], dtype=np.float16),
}
assert sorted(t) == sorted(want), sorted(t)
for k, v in want.items():
    assert t[k].dtype == v.dtype and t[k].shape == v.shape and np.array_equal(t[k], v), (k, t[k], v)
with safe_open(sys.argv[1], framework="np") as f:
    assert f.metadata() == {"format": "pt", "torus.step": "42"}, f.metadata()
)PY";
  EXPECT_EQ(run_python(dir, script, path), 0) << "safetensors.numpy.load_file refused or misread " << path;
}

}  // namespace
}  // namespace torus::ckpt
