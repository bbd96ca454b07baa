// The upload memory budget: what fits is granted at once, the rest in order as bytes are
// released, and a request larger than the whole budget alone.
#include <gtest/gtest.h>

#include <vector>

#include "server/rpc/byte_budget.h"

namespace tessera::server {
namespace {

TEST(ByteBudgetTest, GrantsWhatFitsAndQueuesTheRestInOrder) {
  ByteBudget budget(100);
  std::vector<int> granted;
  budget.Acquire(60, [&] { granted.push_back(1); });
  budget.Acquire(30, [&] { granted.push_back(2); });
  budget.Acquire(20, [&] { granted.push_back(3); });  // 110 > 100: waits
  budget.Acquire(5, [&] { granted.push_back(4); });   // fits, but waits behind 3
  EXPECT_EQ(granted, (std::vector<int>{1, 2}));
  EXPECT_EQ(budget.in_use(), 90u);
  EXPECT_EQ(budget.waiting(), 2u);
  budget.Release(60);
  EXPECT_EQ(granted, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(budget.in_use(), 55u);
  budget.Release(30);
  budget.Release(20);
  budget.Release(5);
  EXPECT_EQ(budget.in_use(), 0u);
}

TEST(ByteBudgetTest, ARequestLargerThanTheBudgetRunsAlone) {
  ByteBudget budget(100);
  std::vector<int> granted;
  budget.Acquire(10, [&] { granted.push_back(1); });
  budget.Acquire(500, [&] { granted.push_back(2); });
  budget.Acquire(10, [&] { granted.push_back(3); });
  EXPECT_EQ(granted, (std::vector<int>{1}));
  budget.Release(10);
  EXPECT_EQ(granted, (std::vector<int>{1, 2}));
  budget.Release(500);
  EXPECT_EQ(granted, (std::vector<int>{1, 2, 3}));
}

}  // namespace
}  // namespace tessera::server
