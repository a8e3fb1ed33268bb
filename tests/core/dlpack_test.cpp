// DLPack: zero-copy export/import, strides and offsets, devices, ownership (the deleter
// runs exactly once, when the last view goes) and the unsupported-dtype errors.

#include <dlpack/dlpack.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "common/reference.h"
#include "sdpa/dlpack.h"
#include "sdpa/error.h"
#include "sdpa/tensor.h"

namespace sdpa {
namespace {

using ::testing::HasSubstr;

// A DLManagedTensor over a caller's buffer whose deleter counts its calls.
struct Foreign {
  std::vector<int64_t> shape;
  std::vector<int64_t> strides;
  DLManagedTensor managed{};
  int deleted = 0;

  Foreign(void* data, std::vector<int64_t> shape_in, std::vector<int64_t> strides_in,
          DLDataType dtype, DLDevice device = {kDLCPU, 0}, uint64_t byte_offset = 0)
      : shape(std::move(shape_in)), strides(std::move(strides_in)) {
    DLTensor& t = managed.dl_tensor;
    t.data = data;
    t.device = device;
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
    t.strides = strides.empty() ? nullptr : strides.data();
    t.byte_offset = byte_offset;
    managed.manager_ctx = this;
    managed.deleter = [](DLManagedTensor* m) { ++static_cast<Foreign*>(m->manager_ctx)->deleted; };
  }
};

TEST(DLPack, ExportDescribesTheTensorWithoutCopying) {
  Tensor base = Tensor::zeros({3, 4, 5}, DType::kFloat32);
  const Tensor view = base.transpose(0, 2).slice(1, 1, 3);  // [5, 2, 3], offset 5
  DLManagedTensor* m = to_dlpack(view);
  ASSERT_NE(m, nullptr);
  const DLTensor& t = m->dl_tensor;
  EXPECT_EQ(static_cast<char*>(t.data) + t.byte_offset, view.data_ptr());
  ASSERT_EQ(t.ndim, 3);
  EXPECT_EQ(std::vector<int64_t>(t.shape, t.shape + 3), view.sizes());
  ASSERT_NE(t.strides, nullptr);
  EXPECT_EQ(std::vector<int64_t>(t.strides, t.strides + 3), view.strides());
  EXPECT_EQ(t.dtype.code, kDLFloat);
  EXPECT_EQ(t.dtype.bits, 32);
  EXPECT_EQ(t.dtype.lanes, 1);
  EXPECT_EQ(t.device.device_type, kDLCPU);
  m->deleter(m);
}

TEST(DLPack, ExportedDtypes) {
  const std::tuple<DType, uint8_t, uint8_t> cases[] = {
      {DType::kFloat64, kDLFloat, 64}, {DType::kFloat16, kDLFloat, 16},
      {DType::kBFloat16, kDLBfloat, 16}, {DType::kInt32, kDLInt, 32},
      {DType::kInt64, kDLInt, 64}};
  for (const auto& [dtype, code, bits] : cases) {
    DLManagedTensor* m = to_dlpack(Tensor::zeros({2}, dtype));
    EXPECT_EQ(m->dl_tensor.dtype.code, code) << dtype_name(dtype);
    EXPECT_EQ(m->dl_tensor.dtype.bits, bits) << dtype_name(dtype);
    m->deleter(m);
  }
}

// The export keeps the storage alive after the tensor is gone, until the deleter runs.
TEST(DLPack, ExportKeepsStorageAliveUntilDeleted) {
  const MemoryStats before = memory_stats();
  DLManagedTensor* m = nullptr;
  {
    Tensor t = Tensor::full({256}, 3.0, DType::kFloat64);
    m = to_dlpack(t);
  }
  EXPECT_GT(memory_stats().current_bytes, before.current_bytes);
  EXPECT_EQ(static_cast<double*>(m->dl_tensor.data)[255], 3.0);
  m->deleter(m);
  EXPECT_EQ(memory_stats().current_bytes, before.current_bytes);
}

TEST(DLPack, RoundTripSharesMemory) {
  Tensor t = Tensor::zeros({4, 6}, DType::kBFloat16);
  const Tensor view = t.slice(1, 1, 5, 2);
  Tensor back = from_dlpack(to_dlpack(view));
  EXPECT_EQ(back.data_ptr(), view.data_ptr());
  EXPECT_EQ(back.sizes(), view.sizes());
  EXPECT_EQ(back.strides(), view.strides());
  EXPECT_EQ(back.dtype(), DType::kBFloat16);
  test::set_at(back, {3, 1}, 2.5);
  EXPECT_EQ(t.item({3, 3}), 2.5);
  test::set_at(t, {0, 1}, -1.0);
  EXPECT_EQ(back.item({0, 0}), -1.0);
  // The round-tripped tensor keeps the memory alive on its own.
  t = Tensor();
  EXPECT_EQ(back.item({3, 1}), 2.5);
}

TEST(DLPack, ImportWrapsForeignMemoryAndDeletesOnce) {
  std::vector<double> buf(20);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<double>(i);
  Foreign f(buf.data(), {4, 5}, {5, 1}, {kDLFloat, 64, 1});
  {
    Tensor t = from_dlpack(&f.managed);
    EXPECT_EQ(t.data_ptr(), buf.data());
    EXPECT_EQ(t.item({3, 4}), 19.0);
    Tensor view = t.transpose(0, 1).select(0, 2);
    Tensor copy = view;
    t = Tensor();
    EXPECT_EQ(f.deleted, 0) << "deleted while views are alive";
    EXPECT_EQ(copy.item({1}), 7.0);
    buf[12] = -4;
    EXPECT_EQ(view.item({2}), -4.0);
  }
  EXPECT_EQ(f.deleted, 1);
}

TEST(DLPack, ViewReadsForeignMemoryWithoutTakingIt) {
  std::vector<float> buf(12);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
  // Every other element of a [2, 6] buffer: strides and a byte offset go through.
  Foreign f(buf.data(), {2, 3}, {6, 2}, {kDLFloat, 32, 1}, {kDLCPU, 0}, sizeof(float));
  {
    Tensor t = view_dlpack(f.managed);
    EXPECT_EQ(t.sizes(), (Shape{2, 3}));
    EXPECT_EQ(t.strides(), (Shape{6, 2}));
    EXPECT_EQ(t.item({1, 2}), 11.0);
    buf[3] = -1;
    EXPECT_EQ(t.item({0, 1}), -1.0);
  }
  EXPECT_EQ(f.deleted, 0) << "a view never calls the producer's deleter";
  Foreign bad(buf.data(), {12}, {1}, {kDLInt, 8, 1});
  EXPECT_THROW(view_dlpack(bad.managed), Error);
  EXPECT_EQ(bad.deleted, 0);
}

TEST(DLPack, ExportPointsIntoTheTensorsOwnShapeAndStrides) {
  Tensor t = Tensor::zeros({2, 3, 4}, DType::kFloat32).transpose(0, 2);
  DLManagedTensor* m = to_dlpack(t);
  t = Tensor();  // the export keeps its own reference, shape and strides included
  const DLTensor& d = m->dl_tensor;
  EXPECT_EQ(std::vector<int64_t>(d.shape, d.shape + d.ndim), (std::vector<int64_t>{4, 3, 2}));
  EXPECT_EQ(std::vector<int64_t>(d.strides, d.strides + d.ndim),
            (std::vector<int64_t>{1, 4, 12}));
  m->deleter(m);
}

TEST(DLPack, ImportCompactStridesByteOffsetAndDevices) {
  std::vector<float> buf(30, 1.0f);
  buf[4] = 9.0f;
  {
    Foreign f(buf.data(), {2, 3, 4}, {}, {kDLFloat, 32, 1}, {kDLCPU, 0}, 4 * sizeof(float));
    const Tensor t = from_dlpack(&f.managed);
    EXPECT_EQ(t.strides(), (Shape{12, 4, 1}));
    EXPECT_EQ(t.data_ptr(), buf.data() + 4);
    EXPECT_EQ(t.item({0, 0, 0}), 9.0);
  }
  {
    Foreign f(buf.data(), {2}, {1}, {kDLFloat, 32, 1}, {kDLCUDA, 1});
    const Tensor t = from_dlpack(&f.managed);
    EXPECT_EQ(t.device(), (Device{DeviceType::kCUDA, 1}));
  }
  {
    Foreign f(buf.data(), {2}, {1}, {kDLFloat, 32, 1}, {kDLExtDev, 3});
    EXPECT_EQ(from_dlpack(&f.managed).device(), (Device{DeviceType::kExternal, 3}));
  }
}

TEST(DLPack, ImportsEverySupportedDtype) {
  std::vector<uint64_t> buf(4, 0);
  const std::tuple<DLDataType, DType> cases[] = {
      {{kDLFloat, 32, 1}, DType::kFloat32}, {{kDLFloat, 64, 1}, DType::kFloat64},
      {{kDLFloat, 16, 1}, DType::kFloat16}, {{kDLBfloat, 16, 1}, DType::kBFloat16},
      {{kDLInt, 32, 1}, DType::kInt32},     {{kDLInt, 64, 1}, DType::kInt64},
      {{6 /* kDLBool, DLPack >= 0.8 */, 8, 1}, DType::kBool}};
  for (const auto& [dl, dtype] : cases) {
    Foreign f(buf.data(), {2}, {1}, dl);
    EXPECT_EQ(from_dlpack(&f.managed).dtype(), dtype) << dtype_name(dtype);
    EXPECT_EQ(f.deleted, 1);
  }
  // bool round trip
  Tensor b = Tensor::zeros({3}, DType::kBool);
  test::set_at(b, {2}, 1);
  const Tensor back = from_dlpack(to_dlpack(b));
  EXPECT_EQ(back.dtype(), DType::kBool);
  EXPECT_EQ(back.item({2}), 1.0);
}

TEST(DLPack, UnsupportedDtypesThrowAndStillReleaseTheTensor) {
  std::vector<uint64_t> buf(4, 0);
  // Each rejected type is named as numpy and torch name it.
  const std::pair<DLDataType, const char*> bad[] = {
      {{kDLInt, 8, 1}, "got int8"},        {{kDLUInt, 16, 1}, "got uint16"},
      {{kDLFloat, 32, 4}, "lanes=4"},      {{kDLComplex, 64, 1}, "got complex64"},
      {{kDLFloat, 8, 1}, "got float8"},    {{kDLBfloat, 32, 1}, "got bfloat32"},
      {{kDLUInt, 8, 1}, "got uint8"}};
  for (const auto& [dl, named] : bad) {
    Foreign f(buf.data(), {2}, {1}, dl);
    try {
      from_dlpack(&f.managed);
      ADD_FAILURE() << "accepted code " << int(dl.code) << " bits " << int(dl.bits) << " lanes "
                    << dl.lanes;
    } catch (const Error& e) {
      EXPECT_THAT(e.what(), HasSubstr("from_dlpack"));
      EXPECT_THAT(e.what(), HasSubstr(named));
    }
    // from_dlpack takes ownership: the tensor is released even when rejected.
    EXPECT_EQ(f.deleted, 1) << "code " << int(dl.code) << " bits " << int(dl.bits);
  }
  EXPECT_THROW(from_dlpack(nullptr), Error);
}

TEST(DLPack, RoundTripOfATransposedViewKeepsItsStrides) {
  Tensor q = Tensor::full({1, 5, 2, 8}, 0.3, DType::kFloat32).transpose(1, 2);  // BSHD
  test::set_at(q, {0, 1, 3, 2}, -1.0);
  const Tensor qi = from_dlpack(to_dlpack(q));
  EXPECT_EQ(qi.sizes(), q.sizes());
  EXPECT_EQ(qi.strides(), q.strides());
  EXPECT_EQ(qi.data_ptr(), q.data_ptr());
  EXPECT_EQ(test::to_doubles(qi), test::to_doubles(q));
}

}  // namespace
}  // namespace sdpa
