#include "shoal/tensor/tensor.h"

#include <gtest/gtest.h>

namespace shoal {
namespace {

Tensor iota(const Shape& s) {
  Tensor t = Tensor::empty(s, DType::kF32);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(i, static_cast<double>(i));
  return t;
}

TEST(Tensor, StorageIsAlignedAndZeroed) {
  for (DType dt : kAllDTypes) {
    Tensor t = Tensor::empty({3, 5}, dt);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.raw_data()) % kTensorAlignment, 0u);
    for (std::int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.get(i), 0.0);
  }
}

TEST(Tensor, SliceIsAViewSharingStorage) {
  Tensor t = iota({4, 6});
  auto s = t.slice(1, 1, 6, 2);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->shape(), (Shape{4, 3}));
  EXPECT_FALSE(s->is_contiguous());
  EXPECT_EQ(s->get(0), 1);
  EXPECT_EQ(s->get(2), 5);
  EXPECT_EQ(s->get(3), 7);
  s->set(0, 100);
  EXPECT_EQ(t.get(1), 100);  // same storage
}

TEST(Tensor, TransposeAndContiguous) {
  Tensor t = iota({2, 3});
  auto tt = t.transpose({1, 0});
  ASSERT_TRUE(tt.ok());
  EXPECT_EQ(tt->shape(), (Shape{3, 2}));
  Tensor c = tt->contiguous();
  EXPECT_TRUE(c.is_contiguous());
  EXPECT_EQ(c.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_FALSE(t.transpose({0, 0}).ok());
}

TEST(Tensor, ReshapeInfersAndRejects) {
  Tensor t = iota({2, 3, 4});
  auto r = t.reshape({4, -1});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->shape(), (Shape{4, 6}));
  EXPECT_EQ(r->storage(), t.storage());  // a view
  auto bad = t.reshape({5, -1});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("[5, -1]"), std::string::npos);
  // Reshape of a non-contiguous view copies.
  auto tr = t.transpose({2, 1, 0});
  auto r2 = tr->reshape({24});
  ASSERT_TRUE(r2.ok());
  EXPECT_NE(r2->storage(), t.storage());
  EXPECT_EQ(r2->get(1), 12);
}

TEST(Tensor, BroadcastUsesZeroStrides) {
  Tensor t = iota({3, 1});
  auto b = t.broadcast_to({2, 3, 4});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->strides()[0], 0);
  EXPECT_EQ(b->strides()[2], 0);
  EXPECT_EQ(b->get(4 * 2 + 3), 2);
  EXPECT_FALSE(t.broadcast_to({4, 4}).ok());
  EXPECT_FALSE(iota({3, 2}).broadcast_to({3, 4}).ok());
  auto s = broadcast_shapes({4, 1, 3}, {2, 1});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (Shape{4, 2, 3}));
  EXPECT_FALSE(broadcast_shapes({3}, {4}).ok());
}

TEST(Tensor, CastBetweenAllDTypes) {
  Tensor t = Tensor::from_vector<float>({0.f, 1.f, 2.5f, -3.f, 200.f}, {5});
  for (DType dt : kAllDTypes) {
    Tensor c = t.cast(dt);
    EXPECT_EQ(c.dtype(), dt);
    if (dt == DType::kBool) {
      EXPECT_EQ(c.get(0), 0);
      EXPECT_EQ(c.get(3), 1);
    } else if (is_floating(dt)) {
      EXPECT_EQ(c.get(2), 2.5);
    } else {
      EXPECT_EQ(c.get(1), 1);
    }
  }
}

}  // namespace
}  // namespace shoal
