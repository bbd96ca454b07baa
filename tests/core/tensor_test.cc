#include "core/tensor.h"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

namespace tessera {
namespace {

TensorSet OneTensor(std::string name, std::vector<int64_t> shape) {
  NamedTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.values.assign(static_cast<size_t>(t.NumElements()), 0.0f);
  return {t};
}

// A worker's upload names its tensors and gives their shapes: a name holding a forged log line
// or megabytes, or a shape of a hundred thousand dimensions, shows up in the error escaped and
// cut short.
TEST(TensorTest, ALayoutMismatchShowsTheCandidatesNameAndShapeEscapedAndBounded) {
  const TensorSet reference = OneTensor("conv1.weight", {6, 1, 5, 5});

  const std::string forged = "conv1.weight\nERROR forged line" + std::string(1 << 20, 'x');
  Status named = CheckSameLayout(reference, OneTensor(forged, {6, 1, 5, 5}), "update from w-1");
  ASSERT_FALSE(named.ok());
  EXPECT_EQ(named.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(named.message().find('\n'), std::string::npos) << named.message();
  EXPECT_NE(named.message().find("conv1.weight\\nERROR forged line"), std::string::npos) << named.message();
  EXPECT_LT(named.message().size(), 400u);

  std::vector<int64_t> long_shape(100000, 1);
  long_shape[0] = 6;
  Status shaped = CheckSameLayout(reference, OneTensor("conv1.weight", long_shape), "update from w-1");
  ASSERT_FALSE(shaped.ok());
  EXPECT_EQ(shaped.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shaped.message().find("expected shape [6, 1, 5, 5], got [6, 1, 1, 1, 1, 1, 1, 1, ... (100000 dimensions)]"),
            std::string::npos)
      << shaped.message();
  EXPECT_LT(shaped.message().size(), 400u);

  TensorSet bad = OneTensor(forged, {2});
  bad[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  Status finite = CheckFinite(bad, "update from w-1");
  ASSERT_FALSE(finite.ok());
  EXPECT_EQ(finite.message().find('\n'), std::string::npos) << finite.message();
  EXPECT_LT(finite.message().size(), 400u);
}

}  // namespace
}  // namespace tessera
