#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "core/data/partition.h"

namespace tessera {
namespace {

// n samples, n / classes of each class, interleaved.
std::vector<uint8_t> BalancedLabels(int64_t n, int classes = 10) {
  std::vector<uint8_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = static_cast<uint8_t>(i * 7 % classes);
  return labels;
}

PartitionConfig Config(PartitionConfig::Kind kind, uint32_t parties, uint64_t seed = 1) {
  PartitionConfig config;
  config.kind = kind;
  config.parties = parties;
  config.seed = seed;
  return config;
}

// Every index appears at most once; returns how many appear.
size_t ExpectDisjoint(const std::vector<std::vector<int64_t>>& parts, size_t n) {
  std::vector<bool> seen(n, false);
  size_t total = 0;
  for (const auto& part : parts) {
    for (int64_t index : part) {
      EXPECT_GE(index, 0);
      EXPECT_LT(index, static_cast<int64_t>(n));
      EXPECT_FALSE(seen[static_cast<size_t>(index)]) << "index " << index << " in two parties";
      seen[static_cast<size_t>(index)] = true;
      ++total;
    }
  }
  return total;
}

size_t LabelsHeld(const std::vector<int64_t>& counts) {
  return static_cast<size_t>(std::count_if(counts.begin(), counts.end(), [](int64_t c) { return c > 0; }));
}

class EveryKindTest : public ::testing::TestWithParam<PartitionConfig::Kind> {};

TEST_P(EveryKindTest, CoversEverySampleExactlyOnce) {
  const std::vector<uint8_t> labels = BalancedLabels(6000);
  Result<std::vector<std::vector<int64_t>>> parts = PartitionIndices(labels, 10, Config(GetParam(), 10, 42));
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  ASSERT_EQ(parts->size(), 10u);
  EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), labels.size());
}

TEST_P(EveryKindTest, SameSeedSameSplitOtherSeedOtherSplit) {
  const std::vector<uint8_t> labels = BalancedLabels(3000);
  auto a = PartitionIndices(labels, 10, Config(GetParam(), 7, 5));
  auto b = PartitionIndices(labels, 10, Config(GetParam(), 7, 5));
  auto c = PartitionIndices(labels, 10, Config(GetParam(), 7, 6));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_NE(*a, *c);
}

TEST_P(EveryKindTest, RefusesZeroPartiesAndMorePartiesThanSamples) {
  const std::vector<uint8_t> labels = BalancedLabels(50);
  auto zero = PartitionIndices(labels, 10, Config(GetParam(), 0));
  ASSERT_FALSE(zero.ok());
  EXPECT_EQ(zero.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(zero.status().message().find("partition.parties"), std::string::npos) << zero.status().message();
  auto many = PartitionIndices(labels, 10, Config(GetParam(), 51));
  ASSERT_FALSE(many.ok());
  EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(many.status().message().find("partition.parties"), std::string::npos) << many.status().message();
}

INSTANTIATE_TEST_SUITE_P(Kinds, EveryKindTest,
                         ::testing::Values(PartitionConfig::kIid, PartitionConfig::kDirichlet,
                                           PartitionConfig::kLabelQuantity, PartitionConfig::kQuantity),
                         [](const auto& info) {
                           std::string name(PartitionKindName(info.param));
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

TEST(PartitionTest, IidSizesDifferByAtMostOne) {
  const std::vector<uint8_t> labels = BalancedLabels(1003);
  auto parts = PartitionIndices(labels, 10, Config(PartitionConfig::kIid, 10));
  ASSERT_TRUE(parts.ok());
  size_t smallest = labels.size(), largest = 0;
  for (const auto& part : *parts) {
    smallest = std::min(smallest, part.size());
    largest = std::max(largest, part.size());
  }
  EXPECT_EQ(smallest, 100u);
  EXPECT_EQ(largest, 101u);
  // Shuffled: a party does not hold a contiguous run.
  EXPECT_FALSE(std::is_sorted((*parts)[0].begin(), (*parts)[0].end()));
}

TEST(PartitionTest, LabelQuantityGivesEachPartyExactlyKLabels) {
  const std::vector<uint8_t> labels = BalancedLabels(5000);
  for (uint32_t k : {1u, 2u, 3u, 10u}) {
    SCOPED_TRACE(k);
    PartitionConfig config = Config(PartitionConfig::kLabelQuantity, 10, 9);
    config.labels_per_party = k;
    auto parts = PartitionIndices(labels, 10, config);
    ASSERT_TRUE(parts.ok()) << parts.status().ToString();
    EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), labels.size());  // 10 parties hold every label
    auto counts = PartitionLabelCounts(*parts, labels, 10);
    for (size_t p = 0; p < counts.size(); ++p) {
      EXPECT_EQ(LabelsHeld(counts[p]), k) << "party " << p;
      EXPECT_GT(counts[p][p % 10], 0) << "party " << p << " lacks its first label";
    }
    // Each label's samples are split evenly among its holders.
    for (int c = 0; c < 10; ++c) {
      int64_t lo = 1 << 30, hi = 0;
      for (const auto& row : counts) {
        if (row[static_cast<size_t>(c)] == 0) continue;
        lo = std::min(lo, row[static_cast<size_t>(c)]);
        hi = std::max(hi, row[static_cast<size_t>(c)]);
      }
      EXPECT_LE(hi - lo, 1) << "label " << c;
    }
  }
}

TEST(PartitionTest, LabelQuantityLeavesOutLabelsNobodyHolds) {
  const std::vector<uint8_t> labels = BalancedLabels(1000);
  PartitionConfig config = Config(PartitionConfig::kLabelQuantity, 2, 3);
  config.labels_per_party = 1;  // parties take labels 0 and 1 only
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok());
  EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), 200u);
}

TEST(PartitionTest, LabelQuantityTakesGivenLabelSets) {
  const std::vector<uint8_t> labels = BalancedLabels(1000);
  PartitionConfig config = Config(PartitionConfig::kLabelQuantity, 4, 5);
  config.party_labels = {{0, 7}, {1, 7}, {2, 0}, {7, 3}};
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  // Labels 0, 1, 2, 3 and 7 (100 samples each) are held; the rest are left out.
  EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), 500u);
  auto counts = PartitionLabelCounts(*parts, labels, 10);
  const std::vector<std::vector<int64_t>> expected = {
      {50, 0, 0, 0, 0, 0, 0, 34, 0, 0},   // label 7 has three holders: 34, 33, 33
      {0, 100, 0, 0, 0, 0, 0, 33, 0, 0},
      {50, 0, 100, 0, 0, 0, 0, 0, 0, 0},
      {0, 0, 0, 100, 0, 0, 0, 33, 0, 0}};
  EXPECT_EQ(counts, expected);

  // The sets are checked.
  config.party_labels = {{0, 7}, {1, 7}, {2, 0}};
  EXPECT_NE(PartitionIndices(labels, 10, config).status().message().find("one set of labels per party (4), got 3"),
            std::string::npos);
  config.party_labels = {{0, 7}, {1, 7}, {2, 2}, {7, 3}};
  EXPECT_NE(PartitionIndices(labels, 10, config).status().message().find("party_labels[2]: label 2 appears twice"),
            std::string::npos);
  config.party_labels = {{0, 7}, {1, 7}, {2, 10}, {7, 3}};
  EXPECT_NE(PartitionIndices(labels, 10, config).status().message().find("label 10 is outside [0, 10)"),
            std::string::npos);
  config.party_labels = {{0, 7}, {1, 7}, {2}, {7, 3}};
  EXPECT_NE(PartitionIndices(labels, 10, config).status().message().find("party_labels[2]: expected labels_per_party (2)"),
            std::string::npos);
}

// Labels 0 to 4 only in the data: a party whose labels are 8 and 9 would get nothing, whether
// the labels were given or drawn, and so would the third holder of a label with two samples.
TEST(PartitionTest, LabelQuantityRefusesToLeaveAPartyWithNoSamples) {
  const std::vector<uint8_t> labels = BalancedLabels(500, 5);
  PartitionConfig config = Config(PartitionConfig::kLabelQuantity, 3, 5);
  config.party_labels = {{0, 1}, {8, 9}, {2, 3}};
  auto given = PartitionIndices(labels, 10, config);
  ASSERT_FALSE(given.ok());
  EXPECT_EQ(given.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(given.status().message().find("party 1 with no samples: its labels [8, 9] (from "
                                          "partition.party_labels[1]) have 0 samples"),
            std::string::npos)
      << given.status().message();

  // Drawn: ten parties with one label each over ten classes, five of them absent.
  config = Config(PartitionConfig::kLabelQuantity, 10, 5);
  config.labels_per_party = 1;
  auto drawn = PartitionIndices(labels, 10, config);
  ASSERT_FALSE(drawn.ok());
  EXPECT_EQ(drawn.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(drawn.status().message().find("party 5 with no samples: its labels [5] (drawn with partition.seed 5)"),
            std::string::npos)
      << drawn.status().message();
  EXPECT_NE(drawn.status().message().find("partition.party_labels"), std::string::npos) << drawn.status().message();

  std::vector<uint8_t> few = BalancedLabels(100, 5);
  few.push_back(7);
  few.push_back(7);
  config = Config(PartitionConfig::kLabelQuantity, 3, 5);
  config.labels_per_party = 1;
  config.party_labels = {{7}, {7}, {7}};
  auto shared = PartitionIndices(few, 10, config);
  ASSERT_FALSE(shared.ok());
  EXPECT_NE(shared.status().message().find("party 2 with no samples: its labels [7]"), std::string::npos)
      << shared.status().message();
}

TEST(PartitionTest, LabelQuantityRefusesBadK) {
  const std::vector<uint8_t> labels = BalancedLabels(1000);
  for (uint32_t k : {0u, 11u}) {
    PartitionConfig config = Config(PartitionConfig::kLabelQuantity, 5);
    config.labels_per_party = k;
    auto parts = PartitionIndices(labels, 10, config);
    ASSERT_FALSE(parts.ok());
    EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(parts.status().message().find("partition.labels_per_party"), std::string::npos)
        << parts.status().message();
  }
}

TEST(PartitionTest, DirichletSmallBetaIsSkewedAndKeepsTenPerParty) {
  const std::vector<uint8_t> labels = BalancedLabels(60000);
  PartitionConfig config = Config(PartitionConfig::kDirichlet, 10, 2021);
  config.beta = 0.1;
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), labels.size());
  auto counts = PartitionLabelCounts(*parts, labels, 10);
  double dominant_share = 0;
  for (size_t p = 0; p < parts->size(); ++p) {
    EXPECT_GE((*parts)[p].size(), 10u) << "party " << p;
    // With beta 0.1 a party's largest class is far above the IID tenth.
    int64_t largest = *std::max_element(counts[p].begin(), counts[p].end());
    dominant_share += static_cast<double>(largest) / static_cast<double>((*parts)[p].size());
  }
  EXPECT_GT(dominant_share / 10.0, 0.4);

  // Large beta approaches IID: every party holds every class.
  config.beta = 1000;
  auto even = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(even.ok());
  for (const auto& row : PartitionLabelCounts(*even, labels, 10)) EXPECT_EQ(LabelsHeld(row), 10u);
}

TEST(PartitionTest, DirichletTinyBetaStillSucceeds) {
  const std::vector<uint8_t> labels = BalancedLabels(20000);
  PartitionConfig config = Config(PartitionConfig::kDirichlet, 10, 4);
  config.beta = 0.01;
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  for (const auto& part : *parts) EXPECT_GE(part.size(), 10u);
}

// A beta of 1e-320 made every gamma variate's logarithm -infinity, the proportions NaN and the
// cut a NaN cast to an integer; below 0.001 a draw skews no further. Both kinds that take a beta
// refuse it, and Dirichlet splits at 0.001 itself.
TEST(PartitionTest, ABetaBelowTheFloorIsRefusedAndTheFloorSplits) {
  const std::vector<uint8_t> labels = BalancedLabels(20000);
  for (auto kind : {PartitionConfig::kDirichlet, PartitionConfig::kQuantity}) {
    for (double beta : {1e-320, 1e-4}) {
      PartitionConfig config = Config(kind, 10, 4);
      config.beta = beta;
      auto parts = PartitionIndices(labels, 10, config);
      ASSERT_FALSE(parts.ok()) << beta;
      EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(parts.status().message().find("partition.beta: must be a finite number of at least 0.001"),
                std::string::npos)
          << parts.status().message();
    }
  }
  PartitionConfig config = Config(PartitionConfig::kDirichlet, 10, 4);
  config.beta = kMinBeta;
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ(ExpectDisjoint(*parts, labels.size()), labels.size());
}

// Every sample of class 0 placed, both parties at their fair share: the empty class 1 after it
// has no party to go to, and its (empty) cut is made from equal shares, not from 0 / 0.
TEST(PartitionTest, DirichletCutsAnEmptyClassWithNoEligiblePartyWithoutNaN) {
  const std::vector<uint8_t> labels(20, 0);
  PartitionConfig config = Config(PartitionConfig::kDirichlet, 2, 1);
  config.beta = 10000;
  auto parts = PartitionIndices(labels, 2, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  EXPECT_EQ((*parts)[0].size(), 10u);
  EXPECT_EQ((*parts)[1].size(), 10u);
}

TEST(PartitionTest, QuantitySkewSizesVaryLabelsDoNot) {
  const std::vector<uint8_t> labels = BalancedLabels(20000);
  PartitionConfig config = Config(PartitionConfig::kQuantity, 10, 77);
  config.beta = 0.5;
  auto parts = PartitionIndices(labels, 10, config);
  ASSERT_TRUE(parts.ok()) << parts.status().ToString();
  size_t smallest = labels.size(), largest = 0;
  for (const auto& part : *parts) {
    EXPECT_GE(part.size(), 10u);
    smallest = std::min(smallest, part.size());
    largest = std::max(largest, part.size());
  }
  EXPECT_GT(largest, 2 * smallest);
  // The largest party's labels are close to uniform.
  auto counts = PartitionLabelCounts(*parts, labels, 10);
  for (size_t p = 0; p < parts->size(); ++p) {
    if ((*parts)[p].size() != largest) continue;
    for (int64_t c : counts[p]) EXPECT_NEAR(static_cast<double>(c) / largest, 0.1, 0.03);
  }
}

TEST(PartitionTest, RefusesBadBetaAndTooFewSamples) {
  const std::vector<uint8_t> labels = BalancedLabels(1000);
  for (auto kind : {PartitionConfig::kDirichlet, PartitionConfig::kQuantity}) {
    for (double beta : {0.0, -1.0}) {
      PartitionConfig config = Config(kind, 5);
      config.beta = beta;
      auto parts = PartitionIndices(labels, 10, config);
      ASSERT_FALSE(parts.ok());
      EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
      EXPECT_NE(parts.status().message().find("partition.beta"), std::string::npos) << parts.status().message();
    }
    // 101 parties of at least 10 samples need 1010.
    auto parts = PartitionIndices(labels, 10, Config(kind, 101));
    ASSERT_FALSE(parts.ok());
    EXPECT_NE(parts.status().message().find("1010"), std::string::npos) << parts.status().message();
  }
  // IID has no minimum beyond one sample per party, and ignores beta.
  PartitionConfig iid = Config(PartitionConfig::kIid, 101);
  iid.beta = -1;
  EXPECT_TRUE(PartitionIndices(labels, 10, iid).ok());
}

TEST(PartitionTest, RefusesLabelOutsideClasses) {
  std::vector<uint8_t> labels = BalancedLabels(100);
  labels[42] = 10;
  auto parts = PartitionIndices(labels, 10, Config(PartitionConfig::kIid, 2));
  ASSERT_FALSE(parts.ok());
  EXPECT_EQ(parts.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(parts.status().message().find("index 42"), std::string::npos) << parts.status().message();
}

}  // namespace
}  // namespace tessera
