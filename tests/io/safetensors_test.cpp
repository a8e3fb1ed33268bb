// Reader and writer of .safetensors: round trips of every dtype and odd shape, files from
// other writers, and one test per malformed-file error.

#include "sdpa/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sdpa/error.h"

namespace sdpa {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

namespace fs = std::filesystem;

// A fresh path per test, removed afterwards.
class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::path(::testing::TempDir()) /
           (std::string("sdpa_safetensors_") + info->test_suite_name() + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    path_ = dir_ / "file.safetensors";
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Writes the 8-byte little-endian `header_len` (default: the header's size), the header
  // and `data` verbatim.
  void write_raw(const std::string& header, const std::string& data = "",
                 std::optional<uint64_t> header_len = std::nullopt) const {
    std::ofstream out(path_, std::ios::binary);
    uint64_t n = header_len.value_or(header.size());
    for (int i = 0; i < 8; ++i, n >>= 8) out.put(static_cast<char>(n & 0xff));
    out << header << data;
  }
  void write_bytes(const std::string& bytes) const {
    std::ofstream out(path_, std::ios::binary);
    out << bytes;
  }
  // The sdpa::Error message of loading path_ (fails the test when it loads).
  std::string load_error() const {
    try {
      load_safetensors(path_);
    } catch (const Error& e) {
      return e.what();
    }
    ADD_FAILURE() << "expected sdpa::Error loading " << path_;
    return "";
  }

  fs::path dir_, path_;
};

// A tensor of `shape` whose elements are distinct small integers (exact in every dtype).
Tensor iota(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t n = t.numel();
  Tensor flat = t.view({n});
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index[] = {i};
    flat.set_item(index, dtype == DType::kBool ? static_cast<double>(i % 3 == 0)
                                              : static_cast<double>(i % 251) - 100.0);
  }
  return t;
}

void expect_same_bytes(const Tensor& actual, const Tensor& expected) {
  ASSERT_EQ(actual.dtype(), expected.dtype());
  ASSERT_EQ(actual.sizes(), expected.sizes());
  EXPECT_TRUE(actual.is_contiguous());
  const Tensor e = expected.contiguous();
  const size_t nbytes = static_cast<size_t>(e.numel()) * element_size(e.dtype());
  if (nbytes > 0) {
    EXPECT_EQ(std::memcmp(actual.data_ptr(), e.data_ptr(), nbytes), 0);
  }
}

TEST_F(SafetensorsTest, RoundTripsEveryDtypeAndOddShapes) {
  const std::map<std::string, Tensor> tensors = {
      {"f32", iota({2, 3}, DType::kFloat32)},
      {"f64", iota({7, 11, 13}, DType::kFloat64)},
      {"bf16", iota({3, 1, 5}, DType::kBFloat16)},
      {"f16", iota({17}, DType::kFloat16)},
      {"bool", iota({4, 4}, DType::kBool)},
      {"i32", iota({}, DType::kInt32)},           // scalar: one element
      {"i64", iota({1, 1, 1, 1, 1}, DType::kInt64)},
      {"empty", Tensor::empty({0, 3}, DType::kFloat32)},
      {"layer.with spaces/and.dots", iota({1}, DType::kFloat32)},
  };
  const SafetensorsMetadata metadata = {{"model", "minilm"}, {"scale", "0.1767766952966369"},
                                        {"unicode", "\xc3\xa9t\xc3\xa9"}};
  save_safetensors(path_, tensors, metadata);
  const SafetensorsFile file = load_safetensors(path_);
  EXPECT_EQ(file.metadata, metadata);
  ASSERT_EQ(file.tensors.size(), tensors.size());
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(file.tensors.contains(name));
    expect_same_bytes(file.tensors.at(name), tensor);
  }
}

TEST_F(SafetensorsTest, WritesStridedTensorsAsContiguous) {
  const Tensor base = iota({3, 5}, DType::kFloat32);
  const Tensor transposed = base.transpose(0, 1);  // [5, 3], strides [1, 5]
  save_safetensors(path_, {{"t", transposed}});
  const Tensor loaded = load_safetensors(path_).tensors.at("t");
  ASSERT_EQ(loaded.sizes(), (Shape{5, 3}));
  for (int64_t i = 0; i < 5; ++i) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(loaded.item({i, j}), base.item({j, i}));
  }
}

TEST_F(SafetensorsTest, LoadedTensorsAreAlignedAndIndependent) {
  save_safetensors(path_, {{"a", iota({3}, DType::kInt64)}, {"b", iota({5}, DType::kBFloat16)}});
  const SafetensorsFile file = load_safetensors(path_);
  for (const auto& [name, t] : file.tensors) {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data_ptr()) % kAlignment, 0u) << name;
  }
  EXPECT_NE(file.tensors.at("a").storage(), file.tensors.at("b").storage());
}

TEST_F(SafetensorsTest, PadsHeaderToEightBytes) {
  save_safetensors(path_, {{"x", iota({3}, DType::kFloat16)}});
  EXPECT_EQ((fs::file_size(path_) - 6) % 8, 0u);  // 8-byte prefix + padded header + 6 bytes
}

TEST_F(SafetensorsTest, EmptyFileHasNoTensors) {
  save_safetensors(path_, {});
  const SafetensorsFile file = load_safetensors(path_);
  EXPECT_TRUE(file.tensors.empty());
  EXPECT_TRUE(file.metadata.empty());
}

TEST_F(SafetensorsTest, ReadsOtherWritersLayout) {
  // As the Python writer may lay it out: entries in any order, unpadded header, trailing
  // whitespace inside it, offsets not in name order.
  const float b[2] = {1.5f, -2.0f};
  const int32_t a[1] = {7};
  std::string data(reinterpret_cast<const char*>(b), sizeof b);
  data.append(reinterpret_cast<const char*>(a), sizeof a);
  write_raw(R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[8,12]},)"
            R"("__metadata__":{"format":"pt"},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}   )",
            data);
  const SafetensorsFile file = load_safetensors(path_);
  EXPECT_EQ(file.metadata.at("format"), "pt");
  EXPECT_EQ(file.tensors.at("a").item({0}), 7.0);
  EXPECT_EQ(file.tensors.at("b").item({0}), 1.5);
  EXPECT_EQ(file.tensors.at("b").item({1}), -2.0);
}

TEST_F(SafetensorsTest, DtypeNamesMapBothWays) {
  for (DType d : {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                  DType::kBool, DType::kInt32, DType::kInt64}) {
    EXPECT_EQ(dtype_from_safetensors(safetensors_dtype_name(d)), d);
  }
  EXPECT_THROW(dtype_from_safetensors("f32"), Error);
}

// --- malformed files: every message names the file, and the tensor when one is at fault.

TEST_F(SafetensorsTest, RejectsMissingFile) {
  EXPECT_THAT(load_error(), AllOf(HasSubstr(path_.string()), HasSubstr("cannot")));
}

TEST_F(SafetensorsTest, RejectsFileShorterThanLengthPrefix) {
  write_bytes("");
  EXPECT_THAT(load_error(), AllOf(HasSubstr(path_.string()), HasSubstr("truncated"),
                                  HasSubstr("at least 8 bytes"), HasSubstr("found 0")));
  write_bytes(std::string("\x05\x00\x00", 3));
  EXPECT_THAT(load_error(), HasSubstr("found 3"));
}

TEST_F(SafetensorsTest, RejectsHeaderLengthBeyondFile) {
  write_raw("{}", "", 1000);
  EXPECT_THAT(load_error(), AllOf(HasSubstr("truncated"), HasSubstr("header length is 1000"),
                                  HasSubstr("only 2 bytes")));
  write_raw("{}", "", UINT64_MAX);  // must not wrap around or allocate
  EXPECT_THAT(load_error(), HasSubstr("truncated"));
}

TEST_F(SafetensorsTest, RejectsHeaderOverLimit) {
  // A sparse file, so the test writes almost nothing.
  write_raw("{}", "", 150'000'000);
  fs::resize_file(path_, 8 + 150'000'000);
  EXPECT_THAT(load_error(), HasSubstr("exceeds the limit"));
}

TEST_F(SafetensorsTest, RejectsInvalidJson) {
  write_raw("{\"a\": ");
  EXPECT_THAT(load_error(), AllOf(HasSubstr(path_.string()), HasSubstr("invalid JSON")));
  write_raw("");
  EXPECT_THAT(load_error(), HasSubstr("empty header"));
  write_raw("[1, 2]");
  EXPECT_THAT(load_error(), HasSubstr("expected a JSON object"));
  write_raw(" {}");  // the reference implementation also wants '{' first
  EXPECT_THAT(load_error(), HasSubstr("starting with '{'"));
  // A number past double's range is the parser's out_of_range, not a parse_error: it
  // escaped as a non-sdpa::Error without the file name.
  write_raw("{\"__metadata__\": {\"x\": 1e400}}");
  EXPECT_THAT(load_error(), AllOf(HasSubstr(path_.string()), HasSubstr("invalid JSON"),
                                  HasSubstr("number overflow")));
}

TEST_F(SafetensorsTest, RejectsDuplicateNames) {
  write_raw(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
            std::string(8, '\0'));
  EXPECT_THAT(load_error(), HasSubstr("'x' appears twice"));
}

TEST_F(SafetensorsTest, RejectsMalformedEntries) {
  struct Case {
    const char* entry;
    const char* message;
  };
  const Case cases[] = {
      {R"([1])", "expected an object with dtype, shape and data_offsets"},
      {R"({"shape":[1],"data_offsets":[0,4]})", "missing field 'dtype'"},
      {R"({"dtype":"F32","data_offsets":[0,4]})", "missing field 'shape'"},
      {R"({"dtype":"F32","shape":[1]})", "missing field 'data_offsets'"},
      {R"({"dtype":7,"shape":[1],"data_offsets":[0,4]})", "dtype: expected a string"},
      {R"({"dtype":"F32","shape":4,"data_offsets":[0,4]})", "shape: expected an array"},
      {R"({"dtype":"F32","shape":[-1],"data_offsets":[0,4]})", "shape: expected a non-negative integer, got -1"},
      {R"({"dtype":"F32","shape":[1.5],"data_offsets":[0,4]})", "shape: expected a non-negative integer, got 1.5"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[0]})", "data_offsets: expected [begin, end]"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":"0,4"})", "data_offsets: expected [begin, end]"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":[-4,4]})", "data_offsets: expected a non-negative integer"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.entry);
    write_raw(std::string(R"({"t":)") + c.entry + "}", std::string(4, '\0'));
    EXPECT_THAT(load_error(), AllOf(HasSubstr(path_.string()), HasSubstr("tensor 't'"),
                                    HasSubstr(c.message)));
  }
}

TEST_F(SafetensorsTest, RejectsUnknownAndUnsupportedDtypes) {
  for (const char* dtype : {"U8", "F8_E4M3", "float32", ""}) {
    SCOPED_TRACE(dtype);
    write_raw(std::string(R"({"t":{"dtype":")") + dtype + R"(","shape":[1],"data_offsets":[0,1]}})",
              std::string(1, '\0'));
    EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 't'"), HasSubstr("expected one of F32"),
                                    HasSubstr(std::string("got '") + dtype + "'")));
  }
}

TEST_F(SafetensorsTest, RejectsOffsetsInReverse) {
  write_raw(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", std::string(4, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 't'"), HasSubstr("data_offsets [4, 0]"),
                                  HasSubstr("begin <= end")));
}

TEST_F(SafetensorsTest, RejectsOffsetsBeyondData) {
  write_raw(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", std::string(4, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 't'"), HasSubstr("data_offsets [0, 8]"),
                                  HasSubstr("beyond the data buffer of 4 bytes")));
  // Offsets near 2^64 must not wrap around in the range arithmetic.
  write_raw(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}})",
            std::string(4, '\0'));
  EXPECT_THAT(load_error(), HasSubstr("beyond the data buffer"));
}

TEST_F(SafetensorsTest, RejectsSizeNotMatchingShape) {
  write_raw(R"({"t":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", std::string(8, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 't'"), HasSubstr("hold 8 bytes, expected 12"),
                                  HasSubstr("[2, 3]"), HasSubstr("BF16")));
}

TEST_F(SafetensorsTest, RejectsShapeWhoseByteSizeOverflows) {
  write_raw(R"({"t":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
            std::string(8, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 't'"), HasSubstr("overflow")));
}

TEST_F(SafetensorsTest, RejectsOverlappingTensors) {
  write_raw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            std::string(12, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 'b'"), HasSubstr("overlap tensor 'a'")));
}

TEST_F(SafetensorsTest, RejectsGapBetweenTensors) {
  write_raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
            std::string(12, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("tensor 'b'"), HasSubstr("begin at 8, expected 4")));
}

TEST_F(SafetensorsTest, RejectsTrailingBytes) {
  write_raw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", std::string(6, '\0'));
  EXPECT_THAT(load_error(), AllOf(HasSubstr("cover 4 bytes"), HasSubstr("holds 6 bytes")));
}

TEST_F(SafetensorsTest, RejectsMalformedMetadata) {
  write_raw(R"({"__metadata__":["a"]})");
  EXPECT_THAT(load_error(), HasSubstr("__metadata__: expected an object of strings"));
  write_raw(R"({"__metadata__":{"layers":6}})");
  EXPECT_THAT(load_error(), AllOf(HasSubstr("value of 'layers'"), HasSubstr("expected a string")));
}

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  auto save_error = [&](const std::map<std::string, Tensor>& tensors, const fs::path& path) {
    try {
      save_safetensors(path, tensors);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    ADD_FAILURE() << "expected sdpa::Error";
    return std::string();
  };
  EXPECT_THAT(save_error({{"u", Tensor()}}, path_),
              AllOf(HasSubstr("tensor 'u'"), HasSubstr("defined")));
  EXPECT_THAT(save_error({{"__metadata__", iota({1}, DType::kFloat32)}}, path_),
              HasSubstr("reserved"));
  float dummy = 0.0f;
  const Tensor on_gpu = Tensor::from_blob(&dummy, {1}, {1}, DType::kFloat32,
                                          Device{DeviceType::kCUDA, 0});
  EXPECT_THAT(save_error({{"g", on_gpu}}, path_), AllOf(HasSubstr("tensor 'g'"), HasSubstr("cuda:0")));
  EXPECT_THAT(save_error({{"x", iota({1}, DType::kFloat32)}}, dir_ / "no_such_dir" / "f.safetensors"),
              HasSubstr("cannot open for writing"));
}

}  // namespace
}  // namespace sdpa
