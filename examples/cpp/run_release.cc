// run_release: run an edgetune release with the TVM runtime's C++ API and check its output.
//
//   run_release <release-dir>
//
// A release directory (an installed `releases/<model>/current`, or an unpacked artifact) holds
//   model.so             the Relax VM executable (relax.build + export_library)
//   manifest.json        entry.function, entry.inputs (call order), inputs.tolerance {rtol, atol}
//   reference_input.npz  one array per input name
//   expected_output.npz  output0, output1, ... in the function's return order
//
// The program loads model.so with the TVM runtime (libtvm_runtime.so + libtvm_ffi.so, nothing of
// the compiler), calls the entry function on the reference input and compares every expected
// output as the board agent does (edgetune/artifact_format/reference.py check_outputs): same
// shape, and |actual - expected| <= atol + rtol * |expected| element-wise (numpy.allclose).
//
// A `current` symlink is resolved once, at the start: every file is read from that one version.
//
// Exit status: 0 every output matches, 1 an output does not, 2 the release could not be read,
// loaded or run (or bad usage).

#include <dlpack/dlpack.h>
#include <tvm/ffi/any.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/module.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/string.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "run_release reads little-endian .npy data as is: build it for a little-endian CPU"
#endif

namespace ffi = tvm::ffi;

namespace {

constexpr int kExitMatch = 0;
constexpr int kExitMismatch = 1;
constexpr int kExitError = 2;

// The release cannot be read, loaded or run: reported as "error: ..." with exit status 2.
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Failure("cannot read " + path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// ---------------------------------------------------------------------------------------------
// JSON: a small recursive-descent reader, enough for manifest.json (objects, arrays, strings,
// numbers, true/false/null).

struct Json {
  enum class Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = Kind::kNull;
  bool boolean = false;
  double number = 0.0;
  std::string string;
  std::vector<Json> array;
  std::vector<std::pair<std::string, Json>> object;

  const Json* Find(const std::string& key) const {
    for (const auto& [name, value] : object) {
      if (name == key) return &value;
    }
    return nullptr;
  }
};

class JsonReader {
 public:
  JsonReader(const std::string& text, std::string where) : text_(text), where_(std::move(where)) {}

  Json ReadDocument() {
    Json value = ReadValue(0);
    SkipSpace();
    if (pos_ != text_.size()) Fail("unexpected text after the document");
    return value;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void Fail(const std::string& what) const {
    throw Failure(where_ + ": not valid JSON at byte " + std::to_string(pos_) + ": " + what);
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(const char* word) {
    size_t n = std::strlen(word);
    if (text_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  Json ReadValue(int depth) {
    if (depth > kMaxDepth) Fail("nested too deeply");
    SkipSpace();
    if (pos_ >= text_.size()) Fail("unexpected end");
    Json value;
    char c = text_[pos_];
    if (c == '{') {
      value.kind = Json::Kind::kObject;
      ++pos_;
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == '}') {
        ++pos_;
        return value;
      }
      while (true) {
        SkipSpace();
        if (pos_ >= text_.size() || text_[pos_] != '"') Fail("expected a key");
        std::string key = ReadString();
        SkipSpace();
        if (pos_ >= text_.size() || text_[pos_] != ':') Fail("expected ':'");
        ++pos_;
        value.object.emplace_back(std::move(key), ReadValue(depth + 1));
        SkipSpace();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
        } else if (pos_ < text_.size() && text_[pos_] == '}') {
          ++pos_;
          return value;
        } else {
          Fail("expected ',' or '}'");
        }
      }
    }
    if (c == '[') {
      value.kind = Json::Kind::kArray;
      ++pos_;
      SkipSpace();
      if (pos_ < text_.size() && text_[pos_] == ']') {
        ++pos_;
        return value;
      }
      while (true) {
        value.array.push_back(ReadValue(depth + 1));
        SkipSpace();
        if (pos_ < text_.size() && text_[pos_] == ',') {
          ++pos_;
        } else if (pos_ < text_.size() && text_[pos_] == ']') {
          ++pos_;
          return value;
        } else {
          Fail("expected ',' or ']'");
        }
      }
    }
    if (c == '"') {
      value.kind = Json::Kind::kString;
      value.string = ReadString();
      return value;
    }
    if (Consume("true")) {
      value.kind = Json::Kind::kBool;
      value.boolean = true;
      return value;
    }
    if (Consume("false")) {
      value.kind = Json::Kind::kBool;
      return value;
    }
    if (Consume("null")) return value;
    value.kind = Json::Kind::kNumber;
    value.number = ReadNumber();
    return value;
  }

  double ReadNumber() {
    size_t start = pos_;
    if (pos_ < text_.size() && text_[pos_] == '-') ++pos_;
    while (pos_ < text_.size() && std::strchr("0123456789.eE+-", text_[pos_]) != nullptr) ++pos_;
    std::string token = text_.substr(start, pos_ - start);
    if (token.empty() || token == "-") Fail("expected a value");
    std::istringstream in(token);
    in.imbue(std::locale::classic());
    double number = 0.0;
    in >> number;
    if (!in || in.peek() != std::char_traits<char>::eof()) Fail("bad number '" + token + "'");
    return number;
  }

  unsigned ReadHex4() {
    if (pos_ + 4 > text_.size()) Fail("short \\u escape");
    unsigned code = 0;
    for (int i = 0; i < 4; ++i) {
      char h = text_[pos_++];
      code <<= 4;
      if (h >= '0' && h <= '9') {
        code |= static_cast<unsigned>(h - '0');
      } else if (h >= 'a' && h <= 'f') {
        code |= static_cast<unsigned>(h - 'a' + 10);
      } else if (h >= 'A' && h <= 'F') {
        code |= static_cast<unsigned>(h - 'A' + 10);
      } else {
        Fail("bad \\u escape");
      }
    }
    return code;
  }

  static void AppendUtf8(std::string& out, unsigned code) {
    if (code < 0x80) {
      out += static_cast<char>(code);
    } else if (code < 0x800) {
      out += static_cast<char>(0xC0 | (code >> 6));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else if (code < 0x10000) {
      out += static_cast<char>(0xE0 | (code >> 12));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (code >> 18));
      out += static_cast<char>(0x80 | ((code >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((code >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (code & 0x3F));
    }
  }

  std::string ReadString() {
    ++pos_;  // the opening quote
    std::string out;
    while (true) {
      if (pos_ >= text_.size()) Fail("unterminated string");
      char c = text_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= text_.size()) Fail("unterminated string");
      char e = text_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned code = ReadHex4();
          if (code >= 0xD800 && code < 0xDC00 && Consume("\\u")) {
            unsigned low = ReadHex4();
            if (low < 0xDC00 || low >= 0xE000) Fail("bad surrogate pair");
            code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
          }
          AppendUtf8(out, code);
          break;
        }
        default: Fail(std::string("bad escape \\") + e);
      }
    }
  }

  const std::string& text_;
  std::string where_;
  size_t pos_ = 0;
};

// ---------------------------------------------------------------------------------------------
// The manifest: the two things this program needs from it.

struct Manifest {
  std::string function;             // entry.function
  std::vector<std::string> inputs;  // entry.inputs, in call order
  double rtol = 0.0;                // inputs.tolerance.rtol
  double atol = 0.0;                // inputs.tolerance.atol
  long long version = 0;            // version (0: not stated)
  std::map<std::string, uint64_t> sizes;  // files[].path -> files[].size
};

const Json& Member(const Json& object, const std::string& key, const std::string& where,
                   Json::Kind kind) {
  const Json* value = object.kind == Json::Kind::kObject ? object.Find(key) : nullptr;
  if (value == nullptr) throw Failure(where + ": no '" + key + "'");
  if (value->kind != kind) throw Failure(where + ": '" + key + "' has the wrong type");
  return *value;
}

Manifest ReadManifest(const std::string& path) {
  std::string text = ReadFile(path);
  Json doc = JsonReader(text, path).ReadDocument();
  const Json* schema = doc.Find("schema");
  if (schema == nullptr || schema->kind != Json::Kind::kString ||
      schema->string != "edgetune.artifact") {
    throw Failure(path + ": not an edgetune artifact manifest (schema edgetune.artifact)");
  }
  Manifest manifest;
  const Json& entry = Member(doc, "entry", path, Json::Kind::kObject);
  manifest.function = Member(entry, "function", path + " entry", Json::Kind::kString).string;
  for (const Json& name : Member(entry, "inputs", path + " entry", Json::Kind::kArray).array) {
    if (name.kind != Json::Kind::kString) throw Failure(path + ": entry.inputs holds a non-string");
    manifest.inputs.push_back(name.string);
  }
  const Json& build_inputs = Member(doc, "inputs", path, Json::Kind::kObject);
  const Json& tolerance = Member(build_inputs, "tolerance", path + " inputs", Json::Kind::kObject);
  manifest.rtol = Member(tolerance, "rtol", path + " inputs.tolerance", Json::Kind::kNumber).number;
  manifest.atol = Member(tolerance, "atol", path + " inputs.tolerance", Json::Kind::kNumber).number;
  if (const Json* version = doc.Find("version"); version && version->kind == Json::Kind::kNumber) {
    manifest.version = static_cast<long long>(version->number);
  }
  if (const Json* files = doc.Find("files"); files && files->kind == Json::Kind::kArray) {
    for (const Json& file : files->array) {
      manifest.sizes[Member(file, "path", path + " files", Json::Kind::kString).string] =
          static_cast<uint64_t>(Member(file, "size", path + " files", Json::Kind::kNumber).number);
    }
  }
  return manifest;
}

// ---------------------------------------------------------------------------------------------
// Arrays: .npy data (little endian, C order) and the dtypes a release uses.

struct DType {
  char kind = 0;      // numpy's kind: 'f' float, 'i' signed int, 'u' unsigned int, 'b' bool
  size_t size = 0;    // bytes per element
};

std::string DTypeName(const DType& t) {
  switch (t.kind) {
    case 'f': return "float" + std::to_string(t.size * 8);
    case 'i': return "int" + std::to_string(t.size * 8);
    case 'u': return "uint" + std::to_string(t.size * 8);
    case 'b': return "bool";
    default: return "?";
  }
}

bool Supported(const DType& t) {
  switch (t.kind) {
    case 'f': return t.size == 2 || t.size == 4 || t.size == 8;
    case 'i':
    case 'u': return t.size == 1 || t.size == 2 || t.size == 4 || t.size == 8;
    case 'b': return t.size == 1;
    default: return false;
  }
}

DLDataType ToDLDataType(const DType& t) {
  DLDataType dl{};
  dl.lanes = 1;
  dl.bits = static_cast<uint8_t>(t.size * 8);
  dl.code = t.kind == 'f' ? kDLFloat : t.kind == 'i' ? kDLInt : t.kind == 'u' ? kDLUInt : kDLBool;
  return dl;
}

DType FromDLDataType(const DLDataType& dl) {
  if (dl.lanes != 1) throw Failure("an output has a vector dtype (lanes " + std::to_string(dl.lanes) + ")");
  DType t;
  if (dl.code == kDLBool || (dl.code == kDLUInt && dl.bits == 1)) {
    t = {'b', 1};
  } else if (dl.code == kDLFloat || dl.code == kDLInt || dl.code == kDLUInt) {
    t = {dl.code == kDLFloat ? 'f' : dl.code == kDLInt ? 'i' : 'u', static_cast<size_t>(dl.bits / 8)};
  }
  if (!Supported(t) || (t.kind != 'b' && t.size * 8 != dl.bits)) {
    throw Failure("an output has an unsupported dtype (DLPack code " + std::to_string(dl.code) +
                  ", bits " + std::to_string(dl.bits) + ")");
  }
  return t;
}

struct HostArray {
  DType dtype;
  std::vector<int64_t> shape;
  std::string data;  // numel * dtype.size bytes, C order, little endian

  int64_t Numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string out = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    out += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1) out += shape.size() == 1 ? "," : ", ";
  }
  return out + ")";
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {
    bits = sign | 0x7F800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);  // normal: rebias 15 -> 127
  } else if (mantissa == 0) {
    bits = sign;  // zero
  } else {
    float value = std::ldexp(static_cast<float>(mantissa), -24);  // subnormal
    return sign ? -value : value;
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

double ElementAsDouble(const HostArray& array, int64_t index) {
  const char* p = array.data.data() + index * static_cast<int64_t>(array.dtype.size);
  auto load = [p](auto zero) {
    decltype(zero) value;
    std::memcpy(&value, p, sizeof(value));
    return static_cast<double>(value);
  };
  switch (array.dtype.kind) {
    case 'f':
      if (array.dtype.size == 2) {
        uint16_t h;
        std::memcpy(&h, p, 2);
        return HalfToFloat(h);
      }
      return array.dtype.size == 4 ? load(0.0f) : load(0.0);
    case 'i':
      switch (array.dtype.size) {
        case 1: return load(int8_t{0});
        case 2: return load(int16_t{0});
        case 4: return load(int32_t{0});
        default: return load(int64_t{0});
      }
    case 'u':
      switch (array.dtype.size) {
        case 1: return load(uint8_t{0});
        case 2: return load(uint16_t{0});
        case 4: return load(uint32_t{0});
        default: return load(uint64_t{0});
      }
    default: return *p != 0 ? 1.0 : 0.0;  // bool
  }
}

// The header of a .npy file is a Python dict literal, as numpy writes it:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (1, 64), }
HostArray ParseNpy(const std::string& bytes, const std::string& where) {
  static const char kMagic[] = "\x93NUMPY";
  if (bytes.size() < 10 || bytes.compare(0, 6, kMagic, 6) != 0) throw Failure(where + ": not a .npy file");
  unsigned major = static_cast<unsigned char>(bytes[6]);
  size_t header_len, header_start;
  if (major == 1) {
    header_len = static_cast<unsigned char>(bytes[8]) | (static_cast<unsigned char>(bytes[9]) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw Failure(where + ": truncated .npy header");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | static_cast<unsigned char>(bytes[8 + i]);
    header_start = 12;
  } else {
    throw Failure(where + ": .npy format version " + std::to_string(major) + " is not supported");
  }
  if (header_start + header_len > bytes.size()) throw Failure(where + ": truncated .npy header");
  std::string header = bytes.substr(header_start, header_len);

  auto value_of = [&](const std::string& key) -> size_t {
    size_t at = header.find("'" + key + "'");
    if (at == std::string::npos) throw Failure(where + ": .npy header has no '" + key + "'");
    at = header.find(':', at);
    if (at == std::string::npos) throw Failure(where + ": bad .npy header");
    at = header.find_first_not_of(' ', at + 1);
    if (at == std::string::npos) throw Failure(where + ": bad .npy header");
    return at;
  };

  size_t d = value_of("descr");
  if (header[d] != '\'') throw Failure(where + ": structured dtypes are not supported");
  size_t d_end = header.find('\'', d + 1);
  if (d_end == std::string::npos) throw Failure(where + ": bad .npy header");
  std::string descr = header.substr(d + 1, d_end - d - 1);  // e.g. "<f4", "|u1", "|b1"
  if (descr.size() < 3) throw Failure(where + ": unsupported dtype '" + descr + "'");
  HostArray array;
  array.dtype.kind = descr[1];
  array.dtype.size = static_cast<size_t>(std::atoi(descr.c_str() + 2));
  if (!Supported(array.dtype)) throw Failure(where + ": unsupported dtype '" + descr + "'");
  if (descr[0] == '>' && array.dtype.size > 1) {
    throw Failure(where + ": big-endian data ('" + descr + "') is not supported");
  }

  if (header.compare(value_of("fortran_order"), 4, "True") == 0) {
    throw Failure(where + ": Fortran-order arrays are not supported (write C order)");
  }

  size_t s = value_of("shape");
  size_t s_end = header.find(')', s);
  if (header[s] != '(' || s_end == std::string::npos) throw Failure(where + ": bad .npy shape");
  std::string dims = header.substr(s + 1, s_end - s - 1);
  for (char& c : dims) {
    if (c == ',') c = ' ';
  }
  std::istringstream in(dims);
  for (int64_t dim; in >> dim;) {
    if (dim < 0) throw Failure(where + ": negative dimension");
    array.shape.push_back(dim);
  }
  if (!in.eof()) throw Failure(where + ": bad .npy shape '" + dims + "'");

  size_t data_start = header_start + header_len;
  size_t nbytes = static_cast<size_t>(array.Numel()) * array.dtype.size;
  if (bytes.size() - data_start != nbytes) {
    throw Failure(where + ": " + std::to_string(bytes.size() - data_start) + " bytes of data, " +
                  ShapeText(array.shape) + " " + DTypeName(array.dtype) + " needs " +
                  std::to_string(nbytes));
  }
  array.data = bytes.substr(data_start);
  return array;
}

// ---------------------------------------------------------------------------------------------
// .npz: a zip archive of `<name>.npy` members, stored without compression (numpy.savez and
// edgetune's deterministic writer); ZIP64 records (numpy.savez forces them) are understood.

uint64_t Le(const std::string& b, size_t at, int n, const std::string& where) {
  if (at + static_cast<size_t>(n) > b.size()) throw Failure(where + ": truncated zip archive");
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(b[at + i]);
  return v;
}

std::map<std::string, HostArray> ReadNpz(const std::string& path) {
  std::string zip = ReadFile(path);
  constexpr uint32_t kEndOfCentralDir = 0x06054b50, kZip64Locator = 0x07064b50,
                     kZip64End = 0x06064b50, kCentralEntry = 0x02014b50, kLocalEntry = 0x04034b50;
  if (zip.size() < 22) throw Failure(path + ": not a zip archive (.npz)");
  size_t eocd = std::string::npos;
  size_t lowest = zip.size() > 22 + 0xFFFF ? zip.size() - 22 - 0xFFFF : 0;
  for (size_t at = zip.size() - 22 + 1; at-- > lowest;) {
    if (Le(zip, at, 4, path) == kEndOfCentralDir) {
      eocd = at;
      break;
    }
  }
  if (eocd == std::string::npos) throw Failure(path + ": not a zip archive (.npz)");
  uint64_t entries = Le(zip, eocd + 10, 2, path);
  uint64_t dir_offset = Le(zip, eocd + 16, 4, path);
  if ((entries == 0xFFFF || dir_offset == 0xFFFFFFFF) && eocd >= 20 &&
      Le(zip, eocd - 20, 4, path) == kZip64Locator) {
    uint64_t end64 = Le(zip, eocd - 20 + 8, 8, path);
    if (Le(zip, end64, 4, path) != kZip64End) throw Failure(path + ": bad ZIP64 record");
    entries = Le(zip, end64 + 32, 8, path);
    dir_offset = Le(zip, end64 + 48, 8, path);
  }

  std::map<std::string, HostArray> arrays;
  size_t at = dir_offset;
  for (uint64_t i = 0; i < entries; ++i) {
    if (Le(zip, at, 4, path) != kCentralEntry) throw Failure(path + ": bad zip central directory");
    uint64_t flags = Le(zip, at + 8, 2, path);
    uint64_t method = Le(zip, at + 10, 2, path);
    uint64_t compressed = Le(zip, at + 20, 4, path);
    uint64_t size = Le(zip, at + 24, 4, path);
    size_t name_len = Le(zip, at + 28, 2, path);
    size_t extra_len = Le(zip, at + 30, 2, path);
    size_t comment_len = Le(zip, at + 32, 2, path);
    uint64_t local = Le(zip, at + 42, 4, path);
    if (at + 46 + name_len > zip.size()) throw Failure(path + ": truncated zip archive");
    std::string name = zip.substr(at + 46, name_len);
    // ZIP64 extra field (id 1): the 64-bit values of the 32-bit fields that are 0xFFFFFFFF.
    for (size_t x = at + 46 + name_len; x + 4 <= at + 46 + name_len + extra_len;) {
      uint64_t id = Le(zip, x, 2, path), len = Le(zip, x + 2, 2, path);
      if (id == 1) {
        size_t v = x + 4;
        for (uint64_t* field : {&size, &compressed, &local}) {
          if (*field == 0xFFFFFFFF) {
            *field = Le(zip, v, 8, path);
            v += 8;
          }
        }
      }
      x += 4 + len;
    }
    at += 46 + name_len + extra_len + comment_len;

    std::string where = path + " " + name;
    if (flags & 1) throw Failure(where + ": encrypted zip members are not supported");
    if (method != 0 || compressed != size) {
      throw Failure(where + ": compressed (numpy.savez_compressed); only stored members are supported");
    }
    if (Le(zip, local, 4, path) != kLocalEntry) throw Failure(where + ": bad zip local header");
    size_t data = local + 30 + Le(zip, local + 26, 2, path) + Le(zip, local + 28, 2, path);
    if (data + size > zip.size()) throw Failure(where + ": truncated zip archive");
    if (name.size() > 4 && name.compare(name.size() - 4, 4, ".npy") == 0) name.resize(name.size() - 4);
    arrays[name] = ParseNpy(zip.substr(data, size), where);
  }
  return arrays;
}

// ---------------------------------------------------------------------------------------------
// The TVM side: tensors in and out, the Relax VM.

// Host memory for input tensors, aligned as TVM allocates its own (64 bytes).
struct HostAlloc {
  void AllocData(DLTensor* tensor) {
    size_t size = std::max<size_t>(ffi::GetDataSize(*tensor), 1);
    tensor->data = std::aligned_alloc(64, (size + 63) / 64 * 64);
    if (tensor->data == nullptr) throw std::bad_alloc();
  }
  void FreeData(DLTensor* tensor) { std::free(tensor->data); }
};

ffi::Tensor ToTensor(const HostArray& array) {
  ffi::Tensor tensor = ffi::Tensor::FromNDAlloc(
      HostAlloc(), ffi::ShapeView(array.shape.data(), array.shape.size()),
      ToDLDataType(array.dtype), DLDevice{kDLCPU, 0});
  if (!array.data.empty()) std::memcpy(tensor.data_ptr(), array.data.data(), array.data.size());
  return tensor;
}

HostArray FromTensor(const ffi::Tensor& tensor, const std::string& name) {
  if (tensor.device().device_type != kDLCPU) throw Failure(name + " is not in host memory");
  if (!tensor.IsContiguous()) throw Failure(name + " is not contiguous");
  HostArray array;
  array.dtype = FromDLDataType(tensor.dtype());
  for (int64_t dim : tensor.shape()) array.shape.push_back(dim);
  const char* data = static_cast<const char*>(tensor.data_ptr()) + tensor.byte_offset();
  array.data.assign(data, static_cast<size_t>(array.Numel()) * array.dtype.size);
  return array;
}

ffi::Function RequiredFunction(const ffi::Module& module, const std::string& name,
                               const std::string& what) {
  ffi::Optional<ffi::Function> function = module->GetFunction(name, /*query_imports=*/true);
  if (!function.has_value()) throw Failure(what + " has no function '" + name + "'");
  return function.value();
}

// Load model.so and return the initialized VM module (as tvm.runtime.vm.VirtualMachine does).
ffi::Module LoadVirtualMachine(const std::string& library) {
  if (!ffi::Function::GetGlobal("ffi.Module.load_from_bytes.relax.VMExecutable").has_value()) {
    throw Failure("the TVM runtime is not loaded: link the program with libtvm_runtime.so");
  }
  ffi::Module executable = ffi::Module::LoadFromFile(library);
  ffi::Module vm = RequiredFunction(executable, "vm_load_executable", library)().cast<ffi::Module>();
  constexpr int kPooledAllocator = 2;  // VirtualMachine.POOLED_ALLOCATOR
  RequiredFunction(vm, "vm_initialization", "the Relax VM")(static_cast<int>(kDLCPU), 0,
                                                           kPooledAllocator);
  return vm;
}

// The VM's result, one tensor or a tuple of them, as output0, output1, ...
std::map<std::string, HostArray> Outputs(const ffi::Any& result) {
  std::map<std::string, HostArray> outputs;
  if (auto tensor = result.as<ffi::Tensor>()) {
    outputs["output0"] = FromTensor(*tensor, "output0");
  } else if (auto tuple = result.as<ffi::Array<ffi::Any>>()) {
    for (size_t i = 0; i < tuple->size(); ++i) {
      std::string name = "output" + std::to_string(i);
      auto item = (*tuple)[i].as<ffi::Tensor>();
      if (!item) throw Failure(name + " is not a tensor (" + (*tuple)[i].GetTypeKey() + ")");
      outputs[name] = FromTensor(*item, name);
    }
  } else {
    throw Failure("the function returned a " + result.GetTypeKey() + ", not tensors");
  }
  return outputs;
}

// ---------------------------------------------------------------------------------------------
// The check: reference.py check_outputs, element for element.

std::string Number(double value) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out.precision(3);
  out << value;
  return out.str();
}

std::string Tolerance(const Manifest& m) {
  std::ostringstream out;
  out.imbue(std::locale::classic());
  out << "rtol " << m.rtol << " / atol " << m.atol;
  return out.str();
}

struct Check {
  bool ok = true;
  double max_abs_error = 0.0;
  std::vector<std::string> problems;
};

Check CompareOutputs(const std::map<std::string, HostArray>& actual,
                     const std::map<std::string, HostArray>& expected, const Manifest& m) {
  Check check;
  for (const auto& [name, want] : expected) {  // sorted by name, as check_outputs
    auto found = actual.find(name);
    if (found == actual.end() || found->second.shape != want.shape) {
      check.problems.push_back(name + ": shape " +
                               (found == actual.end() ? "None" : ShapeText(found->second.shape)) +
                               ", expected " + ShapeText(want.shape));
      continue;
    }
    const HostArray& got = found->second;
    double worst = 0.0;
    bool close = true;
    for (int64_t i = 0; i < want.Numel(); ++i) {
      double a = ElementAsDouble(got, i), b = ElementAsDouble(want, i);
      double error = std::fabs(a - b);
      if (std::isnan(error)) {
        worst = std::numeric_limits<double>::quiet_NaN();
      } else if (!std::isnan(worst)) {
        worst = std::max(worst, error);
      }
      // numpy.isclose: equal infinities are close; NaN is never close.
      bool element_close = (std::isinf(a) || std::isinf(b)) ? a == b
                                                             : error <= m.atol + m.rtol * std::fabs(b);
      close = close && element_close;
    }
    if (std::isnan(worst) || std::isnan(check.max_abs_error)) {
      check.max_abs_error = std::numeric_limits<double>::quiet_NaN();
    } else {
      check.max_abs_error = std::max(check.max_abs_error, worst);
    }
    if (!close) {
      check.problems.push_back(name + ": max |error| " + Number(worst) + " exceeds " + Tolerance(m));
    }
  }
  check.ok = check.problems.empty();
  return check;
}

// The files this program reads have the sizes the manifest lists (a file cut short would
// otherwise crash the loader). Their sha256 and the manifest's signature are the agent's to check:
// it verified them when it installed the release.
void CheckSizes(const std::string& directory, const Manifest& manifest) {
  for (const char* name : {"model.so", "reference_input.npz", "expected_output.npz"}) {
    auto listed = manifest.sizes.find(name);
    if (listed == manifest.sizes.end()) continue;
    std::error_code error;
    uint64_t size = std::filesystem::file_size(directory + "/" + name, error);
    if (error) throw Failure("cannot read " + directory + "/" + name + ": " + error.message());
    if (size != listed->second) {
      throw Failure(directory + "/" + name + " is " + std::to_string(size) +
                    " bytes, the manifest lists " + std::to_string(listed->second));
    }
  }
}

int Run(const std::string& directory) {
  Manifest manifest = ReadManifest(directory + "/manifest.json");
  CheckSizes(directory, manifest);
  std::map<std::string, HostArray> reference = ReadNpz(directory + "/reference_input.npz");
  std::map<std::string, HostArray> expected = ReadNpz(directory + "/expected_output.npz");

  std::vector<ffi::Tensor> inputs;
  for (const std::string& name : manifest.inputs) {
    auto found = reference.find(name);
    if (found == reference.end()) {
      throw Failure("reference_input.npz has no array named " + name);
    }
    inputs.push_back(ToTensor(found->second));
  }

  ffi::Module vm = LoadVirtualMachine(directory + "/model.so");
  ffi::Function entry = RequiredFunction(vm, manifest.function, "the release's model.so");
  std::vector<ffi::AnyView> args(inputs.begin(), inputs.end());
  ffi::Any result;
  entry.CallPacked(args.data(), static_cast<int32_t>(args.size()), &result);
  Check check = CompareOutputs(Outputs(result), expected, manifest);

  std::string call = manifest.function + "(";
  for (size_t i = 0; i < manifest.inputs.size(); ++i) call += (i ? ", " : "") + manifest.inputs[i];
  call += ")";
  if (manifest.version > 0) call = "v" + std::to_string(manifest.version) + " " + call;
  if (check.ok) {
    std::cout << "match: " << call << ": " << expected.size() << " output"
              << (expected.size() == 1 ? "" : "s") << " within " << Tolerance(manifest)
              << " of expected_output.npz (max |error| " << Number(check.max_abs_error) << ")"
              << std::endl;
    return kExitMatch;
  }
  std::string detail;
  for (const std::string& problem : check.problems) detail += (detail.empty() ? "" : "; ") + problem;
  std::cout << "MISMATCH: " << call << " does not match expected_output.npz: " << detail
            << std::endl;
  return kExitMismatch;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 || std::string(argv[1]) == "-h" || std::string(argv[1]) == "--help") {
    std::cerr << "usage: " << (argc > 0 ? argv[0] : "run_release") << " RELEASE_DIR\n"
              << "  runs RELEASE_DIR/model.so on reference_input.npz with the TVM runtime and\n"
              << "  compares with expected_output.npz within the manifest's tolerance\n"
              << "  exit status: 0 match, 1 mismatch, 2 error\n";
    return kExitError;
  }
  std::string directory = argv[1];
  try {
    // Resolved once: every file comes from the version `releases/<model>/current` names now,
    // even if the agent switches it to another while this runs.
    std::error_code error;
    directory = std::filesystem::canonical(directory, error).string();
    if (error) throw Failure("cannot open the release " + std::string(argv[1]) + ": " + error.message());
    return Run(directory);
  } catch (const Failure& e) {
    std::cerr << "error: " << e.what() << std::endl;
  } catch (const ffi::Error& e) {
    std::cerr << "error: the TVM runtime failed on " << directory << ": " << e.kind() << ": "
              << e.message() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "error: " << directory << ": " << e.what() << std::endl;
  }
  return kExitError;
}
