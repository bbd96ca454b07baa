// The command line's and the dashboard's JSON (proto/json.h): a peer's string that holds a
// terminal's C1 escape or a character that reorders text comes out as a \u escape.
#include "proto/json.h"

#include <gtest/gtest.h>

#include "tessera/v1/job.pb.h"

namespace tessera::wire {
namespace {

TEST(JsonTest, APeersHiddenCharactersComeOutEscaped) {
  v1::Job job;
  job.set_id("job-1");
  job.set_error("failed \xC2\x9B" "2J here \xE2\x80\xAE" "olleh");  // CSI 2J clears a terminal
  const std::string json = ToJson(job);
  EXPECT_EQ(json.find("\xC2\x9B"), std::string::npos) << json;
  EXPECT_EQ(json.find("\xE2\x80\xAE"), std::string::npos) << json;
  EXPECT_NE(json.find("\"error\":\"failed \\u009b2J here \\u202eolleh\""), std::string::npos) << json;
}

}  // namespace
}  // namespace tessera::wire
