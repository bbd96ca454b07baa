// The job's event log: bounded to its last events, with Since() numbering events as they
// were published, so a watcher that fell behind skips forward and is told how many it missed.
#include <gtest/gtest.h>

#include "server/jobs/job_events.h"

namespace tessera::server {
namespace {

v1::JobEvent Note(int i) {
  v1::JobEvent event;
  event.set_message("event " + std::to_string(i));
  return event;
}

TEST(JobEventsTest, KeepsOnlyTheLastEventsItHasRoomFor) {
  JobEvents events(3);
  for (int i = 0; i < 10; ++i) events.Publish(Note(i));
  EXPECT_EQ(events.published(), 10u);
  EXPECT_EQ(events.kept(), 3u);
  EXPECT_EQ(JobEvents().capacity(), 1000u);
}

TEST(JobEventsTest, AWatcherThatFellBehindSkipsToTheOldestKeptAndIsToldHowManyItMissed) {
  JobEvents events(3);
  for (int i = 0; i < 10; ++i) events.Publish(Note(i));
  bool ended = true;
  size_t missed = 0;
  auto got = events.Since(2, &ended, &missed);
  EXPECT_FALSE(ended);
  EXPECT_EQ(missed, 5u);  // events 2 to 6
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].message(), "event 7");
  EXPECT_EQ(got[2].message(), "event 9");
}

TEST(JobEventsTest, AWatcherThatKeptUpGetsExactlyWhatIsNew) {
  JobEvents events(3);
  size_t seen = 0;
  for (int i = 0; i < 10; ++i) {
    events.Publish(Note(i));
    bool ended = false;
    size_t missed = 0;
    auto got = events.Since(seen, &ended, &missed);
    EXPECT_EQ(missed, 0u);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].message(), "event " + std::to_string(i));
    seen += missed + got.size();
  }
  events.End();
  bool ended = false;
  EXPECT_TRUE(events.Since(seen, &ended).empty());
  EXPECT_TRUE(ended);
}

}  // namespace
}  // namespace tessera::server
