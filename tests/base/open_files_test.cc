#include "base/open_files.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>

namespace tessera {
namespace {

// Puts the soft limit back as it was, whatever the test did to it.
class SoftLimitRestorer {
 public:
  SoftLimitRestorer() { getrlimit(RLIMIT_NOFILE, &saved_); }
  ~SoftLimitRestorer() { setrlimit(RLIMIT_NOFILE, &saved_); }
  rlimit saved() const { return saved_; }

 private:
  rlimit saved_{};
};

TEST(OpenFilesTest, TheSoftLimitIsRaisedToTheHardOne) {
  SoftLimitRestorer restore;
  rlimit limit = restore.saved();
  const uint64_t hard = limit.rlim_max == RLIM_INFINITY ? kOpenFileCeiling : limit.rlim_max;
  if (hard <= 256) GTEST_SKIP() << "the hard open-file limit here is " << hard << ": nothing to raise above 256";
  limit.rlim_cur = 256;  // as a shell's soft limit may be
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &limit), 0);

  auto raised = RaiseOpenFileLimit();
  ASSERT_TRUE(raised.ok()) << raised.status().ToString();
  EXPECT_EQ(raised->before, 256u);
  EXPECT_EQ(raised->hard, hard);
  EXPECT_EQ(raised->soft, std::min(hard, kOpenFileCeiling));
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  EXPECT_EQ(static_cast<uint64_t>(now.rlim_cur), raised->soft);

  // At the hard limit already: nothing changes.
  auto again = RaiseOpenFileLimit();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->before, raised->soft);
  EXPECT_EQ(again->soft, raised->soft);
}

TEST(OpenFilesTest, AShortfallSaysWhatItHoldsBackAndHowToRaiseIt) {
  const OpenFileLimit limit{1024, 1024, 4096};
  EXPECT_FALSE(OpenFileShortfall(limit, 1024, "workers connected at once").has_value());
  auto warning = OpenFileShortfall(limit, 17408, "workers connected at once");
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("open-file limit is 1024 (hard limit 4096)"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("17408"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("workers connected at once"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("LimitNOFILE"), std::string::npos) << *warning;
}

}  // namespace
}  // namespace tessera
