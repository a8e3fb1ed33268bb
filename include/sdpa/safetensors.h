#pragma once
// Reading and writing .safetensors files (Hugging Face's format), the exchange format of
// the captured model tensors in data/ and of test fixtures.
//
// Format (https://github.com/huggingface/safetensors):
//   bytes [0, 8)        N, the header length: unsigned 64-bit little-endian
//   bytes [8, 8 + N)    the header: a UTF-8 JSON object, possibly padded with trailing
//                       spaces; one entry per tensor
//                         "name": {"dtype": "F32", "shape": [2, 3],
//                                  "data_offsets": [begin, end]}
//                       and optionally "__metadata__": {"key": "string value", ...}
//   bytes [8 + N, end)  the data buffer; each tensor's bytes are [begin, end) relative to
//                       its start, row-major, little-endian. The tensors tile the buffer
//                       exactly: no gaps, no overlaps, no trailing bytes.
// Supported dtypes: F32, F64, BF16, F16, BOOL (1 byte), I32, I64.

#include <filesystem>
#include <map>
#include <string>

#include "sdpa/tensor.h"

namespace sdpa {

/// String-to-string metadata of a .safetensors file (its "__metadata__" entry).
using SafetensorsMetadata = std::map<std::string, std::string>;

/// The contents of a .safetensors file: every tensor by name, and the metadata.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;  ///< contiguous CPU tensors, one storage each
  SafetensorsMetadata metadata;
};

/// Maps a safetensors dtype name ("F32", "BF16", "BOOL", ...) to a DType. Throws
/// sdpa::Error naming the supported set for any other name (including safetensors dtypes
/// sdpa has no counterpart for, such as "U8" or "F8_E4M3").
DType dtype_from_safetensors(const std::string& name);
/// The safetensors name of `dtype` ("F32", "BF16", ...).
std::string safetensors_dtype_name(DType dtype);

/// Reads every tensor and the metadata of the .safetensors file at `path`. Each tensor is
/// copied into its own 64-byte aligned storage (the file's offsets need not be aligned).
/// Validates before reading any tensor data, and never reads outside the file. Throws
/// sdpa::Error naming the file (and the tensor, when one is at fault) with what was
/// expected and what was found when:
///   - the file cannot be opened or read, or is shorter than the 8-byte length prefix;
///   - the header length exceeds the file or 100 MB (the reference implementation's cap);
///   - the header is not a JSON object, has a duplicate name, or an entry lacks or
///     mistypes dtype / shape / data_offsets (negative or non-integer values included);
///   - "__metadata__" is not an object of strings;
///   - a dtype is unknown or unsupported;
///   - data_offsets are not [begin, end] with begin <= end <= data buffer size;
///   - end - begin differs from numel(shape) x element size (or that overflows);
///   - the tensors overlap, leave a gap, or do not cover the data buffer to its end.
SafetensorsFile load_safetensors(const std::filesystem::path& path);

/// Writes `tensors` (any strides; defined CPU tensors of a supported dtype) and `metadata`
/// to `path` in the order of their names, the header padded with spaces to a multiple of
/// 8 bytes as the reference writer does. Overwrites an existing file. Throws sdpa::Error
/// for an undefined or non-CPU tensor, a tensor named "__metadata__", or an I/O failure.
void save_safetensors(const std::filesystem::path& path,
                      const std::map<std::string, Tensor>& tensors,
                      const SafetensorsMetadata& metadata = {});

}  // namespace sdpa
