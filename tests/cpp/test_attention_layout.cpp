// Where attention's gradients go (runtime/attention_layout.h): q, k, v as the heads of one fused
// [b, s, h, 3d] projection get one buffer in which dq, dk, dv take their places; tensors that share
// elements (self-attention given one tensor twice), lie apart, or differ in shape or strides get none.
#include <gtest/gtest.h>

#include "runtime/attention_layout.h"

namespace meshfuse {
namespace {

// q, k, v of [b, h, s, d] as the permuted slices of a [b, s, h, 3d] projection.
std::vector<Tensor> headsOf(const Tensor& projection, int64_t d) {
  std::vector<Tensor> heads;
  for (int64_t i = 0; i < 3; ++i) heads.push_back(projection.slice(3, i * d, d).permute({0, 2, 1, 3}));
  return heads;
}

TEST(AttentionLayout, HeadsOfOneProjectionShareABufferLaidOutAsIt) {
  const int64_t b = 2, s = 5, h = 3, d = 8;
  const Tensor projection = Tensor::empty({b, s, h, 3 * d}, DataType::Float);
  const std::vector<Tensor> qkv = headsOf(projection, d);
  const auto buffer = gradientBufferLike(qkv[0], qkv[1], qkv[2]);
  ASSERT_TRUE(buffer.has_value());
  EXPECT_EQ(buffer->elements, projection.numel());
  EXPECT_EQ(buffer->byte_offset, 0);
  // Gradients in another dtype keep the element places (the byte offsets scale).
  const std::vector<Tensor> grads = gradientViews(*buffer, qkv[0], qkv[1], qkv[2], DataType::Double, Device::cpu());
  ASSERT_EQ(grads.size(), 3u);
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(grads[i].storage(), grads[0].storage());
    EXPECT_EQ(grads[i].shape(), qkv[i].shape());
    EXPECT_EQ(grads[i].strides(), qkv[i].strides());
    EXPECT_EQ(grads[i].byteOffset(), i * d * 8);
  }
  EXPECT_GE(grads[0].storage()->bytes(), static_cast<size_t>(projection.numel() * 8));
}

TEST(AttentionLayout, TensorsThatShareElementsOrLieApartGetNoBuffer) {
  const int64_t b = 1, s = 4, h = 2, d = 8;
  const Tensor projection = Tensor::empty({b, s, h, 3 * d}, DataType::Float);
  const std::vector<Tensor> qkv = headsOf(projection, d);
  EXPECT_FALSE(gradientBufferLike(qkv[0], qkv[0], qkv[2]).has_value()) << "q given as k too";
  EXPECT_FALSE(gradientBufferLike(qkv[1], qkv[0], qkv[2]).has_value()) << "out of order";
  const Tensor separate = Tensor::empty({b, h, s, d}, DataType::Float);
  EXPECT_FALSE(gradientBufferLike(qkv[0], separate, qkv[2]).has_value()) << "another storage";
  // Overlapping heads: slices 4 elements apart in a [.., 2d] row.
  const Tensor narrow = Tensor::empty({b, s, h, 2 * d}, DataType::Float);
  const Tensor q = narrow.slice(3, 0, d).permute({0, 2, 1, 3}), k = narrow.slice(3, 4, d).permute({0, 2, 1, 3}),
               v = narrow.slice(3, d, d).permute({0, 2, 1, 3});
  EXPECT_FALSE(gradientBufferLike(q, k, v).has_value()) << "k overlaps q";
  // Contiguous [b, h, s, d] tensors: no rows to share.
  const Tensor a = Tensor::empty({b, h, s, d}, DataType::Float), c = Tensor::empty({b, h, s, d}, DataType::Float);
  EXPECT_FALSE(gradientBufferLike(a, c, a).has_value());
}

}  // namespace
}  // namespace meshfuse
