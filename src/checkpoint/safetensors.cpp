// The safetensors header: a reader that validates everything it reads (Note
// [Nothing executed on load] in torus/checkpoint/safetensors.h) and the
// matching writer. No LibTorch.
#include "torus/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>

#include "core/log.h"

namespace torus::ckpt {

namespace {

using json = nlohmann::json;

struct DtypeInfo {
  const char* code;
  size_t bytes;
};

constexpr DtypeInfo kDtypes[] = {
    {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8},     {"I32", 4},     {"I16", 2}, {"I8", 1},
    {"U8", 1},  {"U16", 2}, {"U32", 4}, {"U64", 8},  {"BOOL", 1},    {"F8_E4M3", 1}, {"F8_E5M2", 1},
};

const DtypeInfo* find_dtype(std::string_view code) {
  for (const auto& d : kDtypes) {
    if (code == d.code) return &d;
  }
  return nullptr;
}

// A name or string from the file, quoted and escaped for a message, and cut
// short when long: messages stay one printable line whatever the file holds.
std::string shown(std::string_view s) {
  constexpr size_t kMax = 80;
  bool cut = s.size() > kMax;
  std::string text = json(std::string(s.substr(0, kMax))).dump(-1, ' ', false, json::error_handler_t::replace);
  return cut ? text + "..." : text;
}

[[noreturn]] void fail(const std::string& what, const std::string& problem) {
  throw CheckpointError(fmt::format("checkpoint: {}: {}", what, problem));
}

uint64_t read_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

// Deepest nesting a valid header has: root object (0) > entry (1) > shape or
// data_offsets list (2) > integer (3). Anything deeper is refused while
// parsing, before it is built.
constexpr int kMaxDepth = 3;

// Parses the header's JSON, refusing duplicate keys in any object (nlohmann
// would keep the last one silently) and nesting deeper than kMaxDepth.
json parse_json(std::string_view text, const std::string& what) {
  std::vector<std::unordered_set<std::string>> keys;  // one set per open object
  auto cb = [&](int depth, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (depth >= kMaxDepth) {
          fail(what, fmt::format("header JSON is nested deeper than a safetensors header ({} levels)", depth + 1));
        }
        if (event == json::parse_event_t::object_start) keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        keys.pop_back();
        break;
      case json::parse_event_t::key: {
        auto& name = parsed.get_ref<const std::string&>();
        if (!keys.back().insert(name).second) fail(what, fmt::format("header JSON has a duplicate key {}", shown(name)));
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    // nlohmann quotes the last token it read, which may be long: cut it short.
    std::string_view msg = e.what();
    fail(what, fmt::format("header is not valid JSON: {}{}", msg.substr(0, 240), msg.size() > 240 ? "..." : ""));
  }
}

// A non-negative JSON integer (nlohmann stores integers above INT64_MAX as
// unsigned and those past UINT64_MAX as floats, which are refused).
bool as_unsigned(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

TensorEntry parse_entry(const std::string& name, const json& v, const std::string& what) {
  const std::string q = shown(name);
  if (!v.is_object()) fail(what, fmt::format("tensor {}: entry is a JSON {}, not an object", q, v.type_name()));
  for (const auto& [key, _] : v.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      fail(what, fmt::format("tensor {}: unexpected key {} (an entry holds exactly dtype, shape, data_offsets)", q,
                             shown(key)));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) fail(what, fmt::format("tensor {}: missing \"{}\"", q, key));
  }
  TensorEntry e;
  e.name = name;

  const json& dtype = v.at("dtype");
  if (!dtype.is_string()) fail(what, fmt::format("tensor {}: dtype is a JSON {}, not a string", q, dtype.type_name()));
  e.dtype = dtype.get<std::string>();
  const DtypeInfo* info = find_dtype(e.dtype);
  if (info == nullptr) fail(what, fmt::format("tensor {}: unknown dtype {}", q, shown(e.dtype)));

  const json& shape = v.at("shape");
  if (!shape.is_array()) fail(what, fmt::format("tensor {}: shape is a JSON {}, not a list", q, shape.type_name()));
  e.shape.reserve(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    const json& d = shape[i];
    uint64_t dim = 0;
    if (!as_unsigned(d, &dim)) {
      if (d.is_number_integer()) fail(what, fmt::format("tensor {}: dimension {} is negative ({})", q, i, d.dump()));
      fail(what, fmt::format("tensor {}: dimension {} is not a non-negative integer: {}", q, i,
                             d.dump(-1, ' ', false, json::error_handler_t::replace)));
    }
    if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail(what, fmt::format("tensor {}: dimension {} of {} does not fit in 64-bit signed", q, i, dim));
    }
    e.shape.push_back(static_cast<int64_t>(dim));
  }
  // A zero dimension anywhere makes the tensor empty, whatever the others are.
  uint64_t nbytes = 0;
  if (std::find(e.shape.begin(), e.shape.end(), 0) == e.shape.end()) {
    nbytes = info->bytes;
    for (int64_t dim : e.shape) {
      if (__builtin_mul_overflow(nbytes, static_cast<uint64_t>(dim), &nbytes)) {
        fail(what, fmt::format("tensor {}: byte size of shape [{}] of {} overflows 64 bits", q,
                               fmt::join(e.shape, ", "), e.dtype));
      }
    }
  }

  const json& offsets = v.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(what, fmt::format("tensor {}: data_offsets must be a list of two integers, got {}", q,
                           offsets.is_array() ? fmt::format("a list of {}", offsets.size()) : offsets.type_name()));
  }
  if (!as_unsigned(offsets[0], &e.begin) || !as_unsigned(offsets[1], &e.end)) {
    fail(what, fmt::format("tensor {}: data_offsets must be non-negative integers, got {}", q,
                           offsets.dump(-1, ' ', false, json::error_handler_t::replace)));
  }
  if (e.begin > e.end) fail(what, fmt::format("tensor {}: data_offsets [{}, {}] are reversed", q, e.begin, e.end));
  if (e.end - e.begin != nbytes) {
    fail(what, fmt::format("tensor {}: data_offsets [{}, {}] span {} bytes, but shape [{}] of {} needs {}", q, e.begin,
                           e.end, e.end - e.begin, fmt::join(e.shape, ", "), e.dtype, nbytes));
  }
  return e;
}

void check_name(const std::string& name, const std::string& what) {
  if (name.empty()) fail(what, "a tensor has an empty name");
  if (name.size() > kMaxNameBytes) {
    fail(what, fmt::format("tensor name {} of {} bytes exceeds the limit of {}", shown(name), name.size(),
                           kMaxNameBytes));
  }
}

}  // namespace

const TensorEntry* Header::find(const std::string& name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t dtype_bytes(const std::string& dtype) {
  const DtypeInfo* info = find_dtype(dtype);
  if (info == nullptr) throw CheckpointError(fmt::format("checkpoint: unknown safetensors dtype {}", shown(dtype)));
  return info->bytes;
}

bool known_dtype(const std::string& dtype) { return find_dtype(dtype) != nullptr; }

Header parse_header(std::span<const uint8_t> prefix, uint64_t file_size, const std::string& what) {
  if (file_size < 8) fail(what, fmt::format("file of {} bytes is shorter than the 8-byte header length field", file_size));
  if (prefix.size() < 8) fail(what, fmt::format("only {} bytes of the 8-byte header length field", prefix.size()));
  const uint64_t n = read_le64(prefix.data());
  if (n == 0) fail(what, "header length is 0");
  if (n > kMaxHeaderBytes) fail(what, fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  if (n > file_size - 8) {
    fail(what, fmt::format("header length {} runs past the end of the file ({} bytes)", n, file_size));
  }
  if (prefix.size() - 8 < n) {
    fail(what, fmt::format("only {} of the header's {} bytes were read", prefix.size() - 8, n));
  }

  const std::string_view text(reinterpret_cast<const char*>(prefix.data() + 8), n);
  // JSON has no raw NUL byte anywhere (inside strings it is escaped), and
  // nlohmann's lexer would take one for the end of the input and ignore the
  // rest: refuse it here.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    fail(what, fmt::format("header holds a NUL byte at offset {} (padding must be spaces)", nul));
  }
  json root = parse_json(text, what);
  if (!root.is_object()) fail(what, fmt::format("header is a JSON {}, not an object", root.type_name()));

  Header h;
  h.data_offset = 8 + n;
  h.data_bytes = file_size - h.data_offset;
  h.tensors.reserve(root.size());
  for (const auto& [name, v] : root.items()) {
    if (name == "__metadata__") {
      if (!v.is_object()) fail(what, fmt::format("__metadata__ is a JSON {}, not an object", v.type_name()));
      for (const auto& [key, value] : v.items()) {
        if (!value.is_string()) {
          fail(what, fmt::format("__metadata__ value of {} is a JSON {}, not a string", shown(key), value.type_name()));
        }
        h.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    check_name(name, what);
    h.tensors.push_back(parse_entry(name, v, what));
  }

  // Sorted by begin (then end, then name, so that the order is one order):
  // each tensor must start where the previous one ended. A zero-sized tensor
  // sorts before a non-empty one at its offset and so shares it freely.
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
    if (a.begin != b.begin) return a.begin < b.begin;
    if (a.end != b.end) return a.end < b.end;
    return a.name < b.name;
  });
  uint64_t expected = 0;
  const TensorEntry* prev = nullptr;
  for (const auto& t : h.tensors) {
    if (t.begin < expected) {
      fail(what, fmt::format("tensor {} at [{}, {}] overlaps tensor {} at [{}, {}]", shown(t.name), t.begin, t.end,
                             shown(prev->name), prev->begin, prev->end));
    }
    if (t.begin > expected) {
      if (prev == nullptr) {
        fail(what, fmt::format("data does not start at 0: the first tensor {} begins at {}", shown(t.name), t.begin));
      }
      fail(what, fmt::format("hole of {} bytes between tensor {} (ends at {}) and tensor {} (begins at {})",
                             t.begin - expected, shown(prev->name), expected, shown(t.name), t.begin));
    }
    expected = t.end;
    prev = &t;
  }
  if (expected != h.data_bytes) {
    if (expected < h.data_bytes) {
      fail(what, fmt::format("{} trailing bytes after the last tensor: the data section holds {} bytes, the tensors "
                             "end at {}",
                             h.data_bytes - expected, h.data_bytes, expected));
    }
    fail(what, fmt::format("file is truncated: the tensors end at {} but the data section holds {} bytes (size "
                           "mismatch)",
                           expected, h.data_bytes));
  }
  return h;
}

namespace {

// read(2) until `bytes` are in or the file ends; returns how many were read.
size_t read_full(int fd, uint8_t* buf, size_t bytes, const std::string& path) {
  size_t got = 0;
  while (got < bytes) {
    ssize_t r = ::read(fd, buf + got, bytes - got);
    if (r < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      fail(path, fmt::format("read: {}", detail::errno_string(err)));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

}  // namespace

Header read_header(const std::string& path) {
  int fd;
  do {
    fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    int err = errno;
    fail(path, fmt::format("open: {}", detail::errno_string(err)));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    fail(path, fmt::format("fstat: {}", detail::errno_string(err)));
  }
  if (!S_ISREG(st.st_mode)) fail(path, "not a regular file");
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);

  std::vector<uint8_t> buf(8);
  buf.resize(read_full(fd, buf.data(), 8, path));
  if (buf.size() == 8) {
    // Read the whole header only when its length passes the checks that need
    // no more bytes; parse_header reports the others.
    const uint64_t n = read_le64(buf.data());
    if (n > 0 && n <= kMaxHeaderBytes && n <= file_size - std::min<uint64_t>(file_size, 8)) {
      buf.resize(8 + n);
      buf.resize(8 + read_full(fd, buf.data() + 8, n, path));
    }
  }
  return parse_header(buf, file_size, path);
}

std::vector<uint8_t> encode_header(const std::vector<TensorEntry>& tensors,
                                   const std::map<std::string, std::string>& metadata) {
  std::string text = "{";
  auto str = [](const std::string& s, const char* role) {
    try {
      return json(s).dump();
    } catch (const json::exception&) {
      throw InvalidArgument(fmt::format("safetensors {} {} is not valid UTF-8", role, shown(s)));
    }
  };
  if (!metadata.empty()) {
    text += "\"__metadata__\":{";
    bool first = true;
    for (const auto& [k, v] : metadata) {
      if (!first) text += ',';
      first = false;
      text += str(k, "metadata key");
      text += ':';
      text += str(v, "metadata value");
    }
    text += '}';
  }
  std::unordered_set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::string q = shown(t.name);
    TORUS_CHECK(!t.name.empty(), InvalidArgument, "safetensors tensor name must not be empty");
    TORUS_CHECK(t.name.size() <= kMaxNameBytes, InvalidArgument,
                "safetensors tensor name {} of {} bytes exceeds the limit of {}", q, t.name.size(), kMaxNameBytes);
    TORUS_CHECK(t.name != "__metadata__", InvalidArgument, "\"__metadata__\" is not a valid tensor name");
    TORUS_CHECK(names.insert(t.name).second, InvalidArgument, "tensor {} is named twice", q);
    const DtypeInfo* info = find_dtype(t.dtype);
    TORUS_CHECK(info != nullptr, InvalidArgument, "tensor {}: unknown safetensors dtype {}", q, shown(t.dtype));
    for (int64_t d : t.shape) {
      TORUS_CHECK(d >= 0, InvalidArgument, "tensor {}: negative dimension {} in shape [{}]", q, d,
                  fmt::join(t.shape, ", "));
    }
    uint64_t nbytes = 0;
    if (std::find(t.shape.begin(), t.shape.end(), 0) == t.shape.end()) {
      nbytes = info->bytes;
      for (int64_t d : t.shape) {
        TORUS_CHECK(!__builtin_mul_overflow(nbytes, static_cast<uint64_t>(d), &nbytes), InvalidArgument,
                    "tensor {}: byte size of shape [{}] overflows 64 bits", q, fmt::join(t.shape, ", "));
      }
    }
    TORUS_CHECK(t.begin == offset && t.end >= t.begin && t.end - t.begin == nbytes, InvalidArgument,
                "tensor {}: data_offsets [{}, {}] must be [{}, {}]: tensors are laid out back to back from 0 in the "
                "order given, {} bytes each for shape [{}] of {}",
                q, t.begin, t.end, offset, offset + nbytes, nbytes, fmt::join(t.shape, ", "), t.dtype);
    offset = t.end;
    if (text.size() > 1) text += ',';
    text += str(t.name, "tensor name");
    text += fmt::format(R"(:{{"dtype":"{}","shape":[{}],"data_offsets":[{},{}]}})", t.dtype, fmt::join(t.shape, ","),
                        t.begin, t.end);
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  TORUS_CHECK(text.size() <= kMaxHeaderBytes, InvalidArgument,
              "safetensors header of {} bytes exceeds the limit of {} bytes", text.size(), kMaxHeaderBytes);

  std::vector<uint8_t> out(8 + text.size());
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, text.data(), text.size());
  return out;
}

}  // namespace torus::ckpt
