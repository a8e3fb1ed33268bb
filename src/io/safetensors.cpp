// .safetensors reader and writer (format in include/sdpa/safetensors.h).

#include "sdpa/safetensors.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <fstream>
#include <limits>
#include <set>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sdpa/error.h"

namespace sdpa {
namespace {

// The format is little-endian; tensor bytes are copied as they are, so a big-endian host
// would need byte swapping that nothing here does.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

constexpr size_t kLengthPrefixBytes = 8;
// The reference implementation refuses larger headers; so do we, which also bounds the
// allocation a corrupt length prefix can ask for.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The reference writer pads the header so the data buffer starts 8-byte aligned.
constexpr size_t kHeaderAlignment = 8;
constexpr std::string_view kMetadataKey = "__metadata__";

constexpr std::array<std::pair<std::string_view, DType>, 7> kDTypes = {{
    {"F32", DType::kFloat32},
    {"F64", DType::kFloat64},
    {"BF16", DType::kBFloat16},
    {"F16", DType::kFloat16},
    {"BOOL", DType::kBool},
    {"I32", DType::kInt32},
    {"I64", DType::kInt64},
}};

// One header entry, validated against the data buffer but not yet read.
struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

std::string single_quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out.append(1, '\'').append(s).append(1, '\'');
  return out;
}

// Prefixes every message with the file, and the tensor when one is named.
class FileErrors {
 public:
  explicit FileErrors(const std::filesystem::path& path) : file_(path.string()) {}

  template <typename... Args>
  [[noreturn]] void fail(const Args&... args) const {
    detail::throw_error(file_, ": ", args...);
  }
  template <typename... Args>
  [[noreturn]] void fail_tensor(std::string_view tensor, const Args&... args) const {
    detail::throw_error(file_, ": tensor ", single_quoted(tensor), ": ", args...);
  }

 private:
  std::string file_;
};

uint64_t read_le_u64(const std::array<unsigned char, kLengthPrefixBytes>& bytes) {
  uint64_t value = 0;
  for (size_t i = kLengthPrefixBytes; i-- > 0;) value = (value << 8) | bytes[i];
  return value;
}

void write_le_u64(std::ostream& os, uint64_t value) {
  std::array<char, kLengthPrefixBytes> bytes;
  for (char& b : bytes) {
    b = static_cast<char>(value & 0xffu);
    value >>= 8;
  }
  os.write(bytes.data(), bytes.size());
}

// Parses the header, rejecting duplicate top-level names (nlohmann keeps the last one
// silently, which would hide a malformed file).
nlohmann::json parse_header(const std::vector<char>& text, const FileErrors& errors) {
  if (text.empty() || text.front() != '{') {
    errors.fail("header: expected a JSON object starting with '{', got ",
                text.empty() ? std::string("an empty header")
                             : "byte " + std::to_string(static_cast<unsigned char>(text.front())) +
                                   " first");
  }
  std::set<std::string> names;
  std::string duplicate;
  const nlohmann::json::parser_callback_t reject_duplicates =
      [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        if (event == nlohmann::json::parse_event_t::key && depth == 1 && duplicate.empty() &&
            !names.insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
        }
        return true;
      };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text.begin(), text.end(), reject_duplicates);
  } catch (const nlohmann::json::exception& e) {  // syntax, and numbers out of range (1e400)
    errors.fail("header: invalid JSON (", e.what(), ")");
  }
  if (!duplicate.empty()) errors.fail("header: name ", single_quoted(duplicate), " appears twice");
  if (!header.is_object()) errors.fail("header: expected a JSON object, got ", header.type_name());
  return header;
}

SafetensorsMetadata parse_metadata(const nlohmann::json& value, const FileErrors& errors) {
  if (!value.is_object()) {
    errors.fail(kMetadataKey, ": expected an object of strings, got ", value.type_name());
  }
  SafetensorsMetadata metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      errors.fail(kMetadataKey, ": value of ", single_quoted(key), ": expected a string, got ",
                  item.type_name());
    }
    metadata[key] = item.get<std::string>();
  }
  return metadata;
}

// Reads a non-negative integer that JSON holds as an unsigned literal (nlohmann stores
// negative literals as signed and fractions or huge values as floats).
uint64_t read_unsigned(const nlohmann::json& value, std::string_view what,
                       std::string_view tensor, const FileErrors& errors) {
  if (!value.is_number_unsigned()) {
    errors.fail_tensor(tensor, what, ": expected a non-negative integer, got ", value.dump());
  }
  return value.get<uint64_t>();
}

TensorEntry parse_entry(const std::string& name, const nlohmann::json& value,
                        const FileErrors& errors) {
  if (!value.is_object()) {
    errors.fail_tensor(name, "expected an object with dtype, shape and data_offsets, got ",
                       value.type_name());
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) errors.fail_tensor(name, "missing field '", field, "'");
  }
  TensorEntry entry;
  entry.name = name;

  const nlohmann::json& dtype = value["dtype"];
  if (!dtype.is_string()) errors.fail_tensor(name, "dtype: expected a string, got ", dtype.dump());
  try {
    entry.dtype = dtype_from_safetensors(dtype.get<std::string>());
  } catch (const Error& e) {
    errors.fail_tensor(name, e.what());
  }

  const nlohmann::json& shape = value["shape"];
  if (!shape.is_array()) errors.fail_tensor(name, "shape: expected an array, got ", shape.dump());
  for (const nlohmann::json& size : shape) {
    const uint64_t s = read_unsigned(size, "shape", name, errors);
    if (s > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      errors.fail_tensor(name, "shape: size ", s, " exceeds int64");
    }
    entry.shape.push_back(static_cast<int64_t>(s));
  }

  const nlohmann::json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    errors.fail_tensor(name, "data_offsets: expected [begin, end], got ", offsets.dump());
  }
  entry.begin = read_unsigned(offsets[0], "data_offsets", name, errors);
  entry.end = read_unsigned(offsets[1], "data_offsets", name, errors);
  return entry;
}

// Checks one entry's byte range against its shape and the data buffer.
void check_entry_bytes(const TensorEntry& entry, uint64_t data_bytes, const FileErrors& errors) {
  const std::string offsets =
      "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) + "]";
  if (entry.begin > entry.end) {
    errors.fail_tensor(entry.name, offsets, ": expected begin <= end");
  }
  if (entry.end > data_bytes) {
    errors.fail_tensor(entry.name, offsets, " lie beyond the data buffer of ", data_bytes,
                       " bytes");
  }
  int64_t numel = 0;
  try {
    numel = checked_numel(entry.shape);
  } catch (const Error& e) {
    errors.fail_tensor(entry.name, e.what());
  }
  uint64_t expected = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), element_size(entry.dtype), &expected)) {
    errors.fail_tensor(entry.name, "byte size of shape ", shape_str(entry.shape), " overflows");
  }
  if (entry.end - entry.begin != expected) {
    errors.fail_tensor(entry.name, offsets, " hold ", entry.end - entry.begin,
                       " bytes, expected ", expected, " for shape ", shape_str(entry.shape),
                       " x ", safetensors_dtype_name(entry.dtype), " (",
                       element_size(entry.dtype), " bytes each)");
  }
}

// Checks that the entries, sorted by offset, tile [0, data_bytes) exactly, as the
// reference implementation does: gaps or trailing bytes could smuggle hidden content.
void check_tiling(std::vector<TensorEntry>& entries, uint64_t data_bytes,
                  const FileErrors& errors) {
  std::sort(entries.begin(), entries.end(), [](const TensorEntry& a, const TensorEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& entry : entries) {
    if (entry.begin < covered) {
      errors.fail_tensor(entry.name, "data_offsets [", entry.begin, ", ", entry.end,
                         "] overlap tensor ", single_quoted(previous->name), " which ends at ",
                         covered);
    }
    if (entry.begin > covered) {
      errors.fail_tensor(entry.name, "data_offsets begin at ", entry.begin, ", expected ",
                         covered, " (bytes [", covered, ", ", entry.begin,
                         ") of the data buffer belong to no tensor)");
    }
    covered = entry.end;
    previous = &entry;
  }
  if (covered != data_bytes) {
    errors.fail("data buffer: tensors cover ", covered, " bytes, but the file holds ",
                data_bytes, " bytes after the header (trailing bytes belong to no tensor)");
  }
}

}  // namespace

DType dtype_from_safetensors(const std::string& name) {
  for (const auto& [st_name, dtype] : kDTypes) {
    if (st_name == name) return dtype;
  }
  detail::throw_error("dtype: expected one of F32, F64, BF16, F16, BOOL, I32, I64, got '",
                      name, "'");
}

std::string safetensors_dtype_name(DType dtype) {
  for (const auto& [st_name, d] : kDTypes) {
    if (d == dtype) return std::string(st_name);
  }
  detail::throw_error("dtype: ", dtype_name(dtype), " has no safetensors name");
}

SafetensorsFile load_safetensors(const std::filesystem::path& path) {
  const FileErrors errors(path);
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) errors.fail("cannot open: no such file");
  if (!std::filesystem::is_regular_file(status)) errors.fail("cannot open: not a regular file");
  const uint64_t file_bytes = std::filesystem::file_size(path, ec);
  if (ec) errors.fail("cannot read the file size (", ec.message(), ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) errors.fail("cannot open for reading");

  if (file_bytes < kLengthPrefixBytes) {
    errors.fail("truncated: expected at least ", kLengthPrefixBytes,
                " bytes (the header length), found ", file_bytes);
  }
  std::array<unsigned char, kLengthPrefixBytes> prefix{};
  in.read(reinterpret_cast<char*>(prefix.data()), prefix.size());
  if (!in) errors.fail("cannot read the header length");
  const uint64_t header_bytes = read_le_u64(prefix);
  if (header_bytes > file_bytes - kLengthPrefixBytes) {
    errors.fail("truncated: header length is ", header_bytes, " bytes but only ",
                file_bytes - kLengthPrefixBytes, " bytes follow the length prefix");
  }
  if (header_bytes > kMaxHeaderBytes) {
    errors.fail("header length ", header_bytes, " exceeds the limit of ", kMaxHeaderBytes,
                " bytes");
  }
  std::vector<char> header_text(header_bytes);
  in.read(header_text.data(), static_cast<std::streamsize>(header_bytes));
  if (!in) errors.fail("cannot read the ", header_bytes, "-byte header");
  const nlohmann::json header = parse_header(header_text, errors);

  const uint64_t data_start = kLengthPrefixBytes + header_bytes;
  const uint64_t data_bytes = file_bytes - data_start;
  SafetensorsFile file;
  std::vector<TensorEntry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      file.metadata = parse_metadata(value, errors);
      continue;
    }
    entries.push_back(parse_entry(name, value, errors));
    check_entry_bytes(entries.back(), data_bytes, errors);
  }
  check_tiling(entries, data_bytes, errors);

  // Every range is now known to lie inside the file; read in file order.
  for (const TensorEntry& entry : entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype);
    const uint64_t nbytes = entry.end - entry.begin;
    if (nbytes > 0) {
      in.seekg(static_cast<std::streamoff>(data_start + entry.begin));
      in.read(static_cast<char*>(tensor.data_ptr()), static_cast<std::streamsize>(nbytes));
      if (!in) errors.fail_tensor(entry.name, "cannot read ", nbytes, " bytes (file changed?)");
    }
    file.tensors.emplace(entry.name, std::move(tensor));
  }
  return file;
}

void save_safetensors(const std::filesystem::path& path,
                      const std::map<std::string, Tensor>& tensors,
                      const SafetensorsMetadata& metadata) {
  const FileErrors errors(path);
  // Ordered, so the header lists __metadata__ first and the tensors in offset order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<Tensor> contiguous;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) errors.fail_tensor(name, "the name is reserved for metadata");
    if (!tensor.defined()) errors.fail_tensor(name, "expected a defined tensor");
    if (tensor.device().type != DeviceType::kCPU) {
      errors.fail_tensor(name, "expected a cpu tensor, got ", device_name(tensor.device()));
    }
    contiguous.push_back(tensor.contiguous());
    const uint64_t nbytes = static_cast<uint64_t>(tensor.numel()) * element_size(tensor.dtype());
    header[name] = {{"dtype", safetensors_dtype_name(tensor.dtype())},
                    {"shape", tensor.sizes()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  const size_t padded = (text.size() + kHeaderAlignment - 1) / kHeaderAlignment * kHeaderAlignment;
  text.resize(padded, ' ');

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) errors.fail("cannot open for writing");
  write_le_u64(out, text.size());
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const Tensor& t : contiguous) {
    const size_t nbytes = static_cast<size_t>(t.numel()) * element_size(t.dtype());
    if (nbytes > 0) out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(nbytes));
  }
  out.flush();
  if (!out) errors.fail("write failed");
}

}  // namespace sdpa
