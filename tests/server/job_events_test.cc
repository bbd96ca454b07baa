// The job's event log: bounded to its last events (by count and by bytes), with Since() numbering events as they
// were published, so a watcher that fell behind skips forward and is told how many it missed.
#include <gtest/gtest.h>

#include "server/jobs/job_events.h"

#include <cstdint>
#include <string>

#include "proto/record_bounds.h"

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

v1::JobEvent RoundOf(uint32_t round, int workers) {
  v1::JobEvent event;
  event.mutable_round()->set_round(round);
  for (int w = 0; w < workers; ++w) event.mutable_round()->add_workers()->set_worker_id("worker-" + std::to_string(w));
  return event;
}

TEST(JobEventsTest, LargeRoundEventsAreBoundedByBytesAndTheNewestIsAlwaysKept) {
  const size_t one = RoundOf(1, 1000).ByteSizeLong();
  ASSERT_GT(one, 10000u);
  JobEvents events(1000, 3 * one + one / 2);  // room for three such rounds by bytes
  for (uint32_t r = 1; r <= 20; ++r) events.Publish(RoundOf(r, 1000));
  EXPECT_EQ(events.published(), 20u);
  EXPECT_EQ(events.kept(), 3u);
  EXPECT_LE(events.kept_bytes(), events.max_bytes());
  bool ended = false;
  size_t missed = 0;
  auto got = events.Since(0, &ended, &missed);
  EXPECT_EQ(missed, 17u);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got.front().round().round(), 18u);
  EXPECT_EQ(got.back().round().round(), 20u);

  // One event larger than the whole budget is still kept, alone.
  JobEvents tight(1000, one / 2);
  tight.Publish(Note(0));
  tight.Publish(RoundOf(7, 1000));
  EXPECT_EQ(tight.kept(), 1u);
  EXPECT_EQ(tight.Since(0, &ended, &missed).at(0).round().round(), 7u);
  EXPECT_EQ(missed, 1u);
  // Small events after it push it out once they fit.
  tight.Publish(Note(1));
  EXPECT_EQ(tight.kept(), 1u);
  EXPECT_EQ(JobEvents().max_bytes(), size_t{8} << 20);
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

TEST(JobEventsTest, ANumberPastTheLastPublishedGetsNothingYet) {
  JobEvents events(3);
  for (int i = 0; i < 2; ++i) events.Publish(Note(i));
  bool ended = true;
  size_t missed = 7;
  std::vector<v1::JobEvent> got;
  ASSERT_NO_THROW(got = events.Since(5, &ended, &missed));
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(missed, 0u);
  EXPECT_FALSE(ended);
  // Once the log has events up to it, they come as to any watcher.
  for (int i = 2; i < 7; ++i) events.Publish(Note(i));
  got = events.Since(5, &ended, &missed);
  EXPECT_EQ(missed, 0u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].message(), "event 5");
}

// The log counts the notes it drops, so that a watcher that fell behind learns how many notes
// it missed: those dropped since its last look, less those before its place.
TEST(JobEventsTest, TheNotesAmongTheDroppedEventsAreCounted) {
  JobEvents events(3);
  size_t notes = 99;
  EXPECT_EQ(events.OldestWithNotesDropped(&notes), 0u);
  EXPECT_EQ(notes, 0u);
  v1::JobEvent progress;
  progress.mutable_progress()->set_round(1);
  progress.set_message("not a note");  // a progress is not a note, whatever it says
  events.Publish(Note(0));
  events.Publish(progress);
  events.Publish(Note(1));
  events.Publish(RoundOf(1, 1));
  events.Publish(Note(2));
  events.Publish(progress);
  events.Publish(Note(3));
  bool ended = false;
  size_t missed = 0;
  EXPECT_EQ(events.Since(0, &ended, &missed, &notes).size(), 3u);
  EXPECT_EQ(missed, 4u);
  EXPECT_EQ(notes, 2u) << "events 0 to 3: two notes, a progress and a round";
  EXPECT_EQ(events.OldestWithNotesDropped(&notes), 4u);
  EXPECT_EQ(notes, 2u);
  events.Publish(Note(4));  // drops note 2
  EXPECT_EQ(events.OldestWithNotesDropped(&notes), 5u);
  EXPECT_EQ(notes, 3u);
}

// Whoever made an event (the runner's notes, a driver's progress, its end), the log keeps it
// within the bounds of proto/record_bounds.h: a note of a megabyte, a job's error of one, and a
// progress naming many long-named workers are cut, the count of those not named kept.
TEST(JobEventsTest, AnEventsTextIsBoundedAsItIsPublished) {
  std::string huge = "refused update from ";
  while (huge.size() < (size_t{1} << 20)) huge += "\xC3\xA9";  // é
  JobEvents events;
  v1::JobEvent note;
  note.set_message(huge);
  note.mutable_job()->set_error(huge);
  note.mutable_job()->mutable_last_round()->add_workers()->set_worker_id("w1");
  events.Publish(note);
  v1::JobEvent progress;
  for (int i = 0; i < 50; ++i) progress.mutable_progress()->add_waiting_on(std::string(1000, 'a' + i % 26));
  progress.mutable_progress()->set_waiting_more(7);
  events.Publish(progress);
  bool ended = false;
  const std::vector<v1::JobEvent> kept = events.Since(0, &ended);
  ASSERT_EQ(kept.size(), 2u);
  const std::string ellipsis = "\xE2\x80\xA6";
  EXPECT_LE(kept[0].message().size(), wire::kMaxNoteBytes);
  EXPECT_EQ(kept[0].message().rfind("refused update from \xC3\xA9", 0), 0u);
  EXPECT_EQ(kept[0].message().substr(kept[0].message().size() - ellipsis.size()), ellipsis);
  EXPECT_LE(kept[0].job().error().size(), wire::kMaxJobErrorBytes);
  EXPECT_EQ(kept[0].job().last_round().workers_size(), 0) << "an event's job carries no reports";
  ASSERT_EQ(static_cast<size_t>(kept[1].progress().waiting_on_size()), wire::kMaxProgressWaitingOn);
  EXPECT_EQ(kept[1].progress().waiting_more(), 7u + 50 - wire::kMaxProgressWaitingOn);
  for (const std::string& name : kept[1].progress().waiting_on()) EXPECT_LE(name.size(), kMaxNameBytes);
  EXPECT_LE(events.kept_bytes(), 2 * wire::kMaxNoteBytes + 2 * wire::kMaxJobErrorBytes);
}

// The rewinds (a job moved back as it resumed) are found among the events asked for, also once
// the log has dropped them, the one to the oldest round first; the last kMaxDroppedRewinds of
// those dropped are kept.
TEST(JobEventsTest, RewindsAreFoundAlsoOnceDropped) {
  const auto rewind = [](uint32_t to) {
    v1::JobEvent event;
    event.set_message("moved back to " + std::to_string(to));
    event.mutable_rewind()->set_to_round(to);
    return event;
  };
  JobEvents events(3);
  events.Publish(Note(0));
  events.Publish(rewind(5));  // 1
  events.Publish(rewind(2));  // 2
  events.Publish(rewind(7));  // 3
  for (int i = 4; i < 10; ++i) events.Publish(Note(i));
  ASSERT_EQ(events.oldest(), 7u);
  size_t number = 0;
  auto lowest = events.LowestRewindIn(0, SIZE_MAX, &number);
  ASSERT_TRUE(lowest.has_value());
  EXPECT_EQ(lowest->rewind().to_round(), 2u);
  EXPECT_EQ(lowest->message(), "moved back to 2");
  EXPECT_EQ(number, 2u);
  lowest = events.LowestRewindIn(3, 10, &number);
  ASSERT_TRUE(lowest.has_value());
  EXPECT_EQ(lowest->rewind().to_round(), 7u);
  EXPECT_EQ(number, 3u);
  EXPECT_FALSE(events.LowestRewindIn(4, SIZE_MAX, &number).has_value());
  events.Publish(rewind(1));  // 10, kept
  lowest = events.LowestRewindIn(3, SIZE_MAX, &number);
  ASSERT_TRUE(lowest.has_value());
  EXPECT_EQ(number, 10u);
  for (size_t i = 0; i < JobEvents::kMaxDroppedRewinds + 3; ++i) events.Publish(rewind(9));
  lowest = events.LowestRewindIn(0, SIZE_MAX, &number);
  ASSERT_TRUE(lowest.has_value());
  EXPECT_EQ(lowest->rewind().to_round(), 9u) << "the oldest dropped rewinds are forgotten";
}

}  // namespace
}  // namespace tessera::server
