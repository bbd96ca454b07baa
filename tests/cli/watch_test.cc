// `tessera watch` against a scripted coordinator (a stub whose WatchJob streams events made on
// the fly, in the test's thread): what it prints of rounds, notes and progress, that its memory
// does not grow with what each round's record holds, that a reconnected watch shows a replayed
// note once, that rounds run again after the job moved back are shown again, and that nothing
// the coordinator sends puts a control character on the terminal.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <deque>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include "cli/job_client.h"
#include "proto/job_mapping.h"
#include "tests/address_space.h"
#include "tests/cli/scripted_stub.h"

namespace tessera::cli {
namespace {

using v1::JobEvent;

// Round `n` of a job, its latencies made from n, with `workers` reports of `outcome_bytes` each.
v1::RoundRecord Round(uint32_t n, int workers = 2, size_t outcome_bytes = 8) {
  v1::RoundRecord r;
  r.set_job_id("job-1-abc");
  r.set_round(n);
  r.set_attempt(1);
  r.set_test_accuracy(0.5 + 0.0001 * n);
  r.set_test_loss(1.0 / n);
  r.set_clients_selected(static_cast<uint32_t>(workers));
  r.set_clients_reported(static_cast<uint32_t>(workers));
  auto& l = *r.mutable_latency();
  l.set_selection_ms(1 + n % 3);
  l.set_distribution_ms(2.5 * n);
  l.set_compute_ms_median(10 + (n * 7) % 11);
  l.set_compute_ms_max(20 + (n * 5) % 13);
  l.set_upload_ms(3 + n % 4);
  l.set_straggler_wait_ms(n % 2);
  l.set_aggregation_ms(0.5 * n);
  l.set_evaluation_ms(30 - n % 5);
  l.set_commit_ms(1);
  l.set_total_ms(100 + n);
  for (int w = 0; w < workers; ++w) {
    auto& report = *r.add_workers();
    report.set_worker_id("w" + std::to_string(w));
    report.set_outcome("accepted" + std::string(outcome_bytes, 'x'));
  }
  return r;
}

v1::Job Job(v1::JobState state, const std::string& error = "") {
  v1::Job job;
  job.set_id("job-1-abc");
  job.set_state(state);
  job.set_error(error);
  job.mutable_spec()->set_rounds(100);
  return job;
}

// A stream of rounds 1 to `rounds` of a running job, then its end.
ScriptedStub::Stream Rounds(uint32_t rounds, int workers = 2, size_t outcome_bytes = 8) {
  return {[=, n = uint32_t{0}](JobEvent* event) mutable {
    if (n > rounds) return false;
    ++n;
    if (n > rounds) {
      *event->mutable_job() = Job(v1::JOB_SUCCEEDED);
      event->set_message("job job-1-abc succeeded");
    } else {
      *event->mutable_job() = Job(v1::JOB_RUNNING);
      *event->mutable_round() = Round(n, workers, outcome_bytes);
    }
    return true;
  }};
}

TEST(WatchTest, PrintsEachRoundThenTheFinalAccuracyAndTheLatencySummary) {
  ScriptedStub stub;
  stub.streams.push_back(Rounds(5));
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out);
  ASSERT_TRUE(watched.ok()) << watched.ToString();
  std::vector<v1::RoundRecord> rounds;
  std::string expected = RoundHeader() + "\n";
  for (uint32_t n = 1; n <= 5; ++n) {
    rounds.push_back(Round(n));
    expected += RoundRow(rounds.back()) + "\n";
  }
  expected += "  job job-1-abc succeeded\n\nfinal test accuracy: 50.05% after 5 rounds\n\nround latency by phase (5 "
              "rounds):\n" + LatencySummary(rounds);
  EXPECT_EQ(out.str(), expected);
}

TEST(WatchTest, ItsMemoryDoesNotGrowWithWhatEachRoundsRecordHolds) {
  // 400 rounds of 1,000 workers' reports with 512-byte outcomes: about 600 KB of record a
  // round, 240 MB in all, streamed one event at a time. The watch keeps twelve latencies a
  // round; 128 MiB of address space more than it had at the start is room for one event, the
  // output and a second malloc arena (64 MiB reserved), not for the rounds' 240 MB of records.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        testing::CapAddressSpace(uint64_t{128} << 20);
        ScriptedStub stub;
        stub.streams.push_back(Rounds(400, 1000, 512));
        std::ostringstream out;
        Status watched = WatchCommand(stub, "job-1-abc", out);
        const std::string text = out.str();
        std::fprintf(stderr, "%s\n%s\n", watched.ToString().c_str(), text.substr(text.size() - std::min<size_t>(text.size(), 2000)).c_str());
        // _Exit: the exit handlers (OpenBLAS's thread shutdown) have no business in this child.
        std::_Exit(watched.ok() && text.find("final test accuracy: 54.00% after 400 rounds") != std::string::npos &&
                          text.find("round latency by phase (400 rounds)") != std::string::npos
                      ? 0
                      : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

TEST(WatchTest, AReconnectedWatchShowsAReplayedNoteAndRoundOnce) {
  ScriptedStub stub;
  // The first stream: a note and round 1, then the coordinator goes away.
  stub.streams.push_back({[n = 0](JobEvent* event) mutable {
                            *event->mutable_job() = Job(v1::JOB_RUNNING);
                            if (n == 0) event->set_message("refused w9: update norm 1e9");
                            if (n == 1) *event->mutable_round() = Round(1);
                            return n++ < 2;
                          },
                          grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  // The restarted coordinator replays its live log: the note, round 1, then round 2 and the end.
  stub.streams.push_back({[n = 0](JobEvent* event) mutable {
    *event->mutable_job() = Job(n == 4 ? v1::JOB_SUCCEEDED : v1::JOB_RUNNING);
    if (n == 0) event->set_message("refused w9: update norm 1e9");
    if (n == 1) *event->mutable_round() = Round(1);
    if (n == 2) event->set_message("refused w8: update norm 2e9");
    if (n == 3) *event->mutable_round() = Round(2);
    if (n == 4) event->set_message("job job-1-abc succeeded");
    return n++ < 5;
  }});
  WatchOptions options;
  options.reconnect_for = std::chrono::seconds(60);
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out, options);
  ASSERT_TRUE(watched.ok()) << watched.ToString() << "\n" << out.str();
  const std::string text = out.str();
  EXPECT_EQ(stub.from_rounds, (std::vector<uint32_t>{0, 2})) << "the second watch asks for the rounds after 1";
  const auto count = [&text](const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("refused w9"), 1u) << text;
  EXPECT_EQ(count("refused w8"), 1u) << text;
  EXPECT_EQ(count(RoundRow(Round(1))), 1u) << text;
  EXPECT_EQ(count(RoundRow(Round(2))), 1u) << text;
  EXPECT_NE(text.find("(2 rounds)"), std::string::npos) << text;
}

TEST(WatchTest, NothingTheCoordinatorSendsReachesTheTerminalAsAControlCharacter) {
  ScriptedStub stub;
  const std::string clear = "\x1b[2J\x1b]0;owned\x07";
  stub.streams.push_back({[&, n = 0](JobEvent* event) mutable {
    *event->mutable_job() = Job(n == 2 ? v1::JOB_FAILED : v1::JOB_RUNNING, n == 2 ? "diverged " + clear : "");
    if (n == 0) {
      auto& p = *event->mutable_progress();
      p.set_round(1);
      p.set_selected(2);
      for (int i = 0; i < 20; ++i) p.add_waiting_on("w" + clear);
    }
    if (n == 1) event->set_message("note " + clear + std::string(100000, 'n'));
    if (n == 2) event->set_message("job job-1-abc failed");
    return n++ < 3;
  }});
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out);
  const std::string text = out.str();
  EXPECT_EQ(watched.code(), StatusCode::kFailedPrecondition) << watched.ToString();
  for (const std::string& shown : {text, watched.message()}) {
    EXPECT_EQ(shown.find('\x1b'), std::string::npos) << shown;
    EXPECT_EQ(shown.find('\x07'), std::string::npos) << shown;
  }
  EXPECT_NE(text.find("waiting on w\\x1b[2J"), std::string::npos) << text;
  EXPECT_NE(text.find("and 12 more"), std::string::npos) << "the first 8 names, then a count:\n" << text;
  EXPECT_NE(text.find("note \\x1b[2J"), std::string::npos) << text;
  EXPECT_LT(text.size(), 10000u) << "a note is cut, not shown whole";
  EXPECT_NE(watched.message().find("diverged \\x1b[2J"), std::string::npos) << watched.message();
}

TEST(WatchTest, ARoundNumberNoJobReachesIsRefused) {
  ScriptedStub stub;
  stub.streams.push_back({[n = 0](JobEvent* event) mutable {
    *event->mutable_job() = Job(v1::JOB_RUNNING);
    *event->mutable_round() = Round(n == 0 ? 1 : wire::kMaxRounds + 1);
    return n++ < 2;
  }});
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out);
  EXPECT_EQ(watched.code(), StatusCode::kInvalidArgument) << watched.ToString();
  EXPECT_NE(watched.message().find("the coordinator sent round 100001, past the most a job has (100000)"),
            std::string::npos)
      << watched.message();
}

// A note that happens again (the same refusal in another round) is shown each time; only a
// reconnected watch's replay of notes shown already is skipped.
TEST(WatchTest, ANoteThatHappensAgainIsShownAgain) {
  const std::string refused = "refused update from worker 'w3' for job job-1-abc: field 'trained_weights'";
  ScriptedStub stub;
  stub.streams.push_back({[&, n = 0](JobEvent* event) mutable {
                            *event->mutable_job() = Job(v1::JOB_RUNNING);
                            if (n == 0 || n == 2) event->set_message(refused);
                            if (n == 1) *event->mutable_round() = Round(1);
                            return n++ < 3;
                          },
                          grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  // The replay: both refusals and round 1 again, then a third refusal, round 2 and the end.
  stub.streams.push_back({[&, n = 0](JobEvent* event) mutable {
    *event->mutable_job() = Job(n == 5 ? v1::JOB_SUCCEEDED : v1::JOB_RUNNING);
    if (n == 0 || n == 2 || n == 3) event->set_message(refused);
    if (n == 1) *event->mutable_round() = Round(1);
    if (n == 4) *event->mutable_round() = Round(2);
    if (n == 5) event->set_message("job job-1-abc succeeded");
    return n++ < 6;
  }});
  WatchOptions options;
  options.reconnect_for = std::chrono::seconds(60);
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out, options);
  ASSERT_TRUE(watched.ok()) << watched.ToString() << "\n" << out.str();
  const std::string text = out.str();
  size_t count = 0;
  for (size_t at = text.find(refused); at != std::string::npos; at = text.find(refused, at + 1)) ++count;
  EXPECT_EQ(count, 3u) << text;
}

// A job moved back to an older checkpoint as the coordinator restarted: the rounds after it
// that were shown are run again, and shown again as they are, after a line that says so; a
// reconnected watch's replay of the same rewind is not applied twice.
TEST(WatchTest, RoundsRunAgainAfterTheJobMovedBackAreShownAgain) {
  const auto rerun = [](uint32_t n) {
    v1::RoundRecord r = Round(n);
    r.set_test_accuracy(0.9 + 0.01 * n);
    return r;
  };
  const auto rewind = [](JobEvent* event) {
    event->set_message("falling back to the checkpoint of round 1; rounds 2 to 3 will be run again");
    event->mutable_rewind()->set_to_round(1);
    event->mutable_rewind()->set_from_round(3);
    event->mutable_rewind()->set_at_unix_ms(1700000000000);
  };
  ScriptedStub stub;
  // Rounds 1 to 3, then the coordinator goes away.
  stub.streams.push_back({[n = 0](JobEvent* event) mutable {
                            *event->mutable_job() = Job(v1::JOB_RUNNING);
                            *event->mutable_round() = Round(static_cast<uint32_t>(n + 1));
                            return n++ < 3;
                          },
                          grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  // The restarted coordinator moved the job back to round 1 and runs round 2 again; the
  // stream is cut.
  stub.streams.push_back({[=, n = 0](JobEvent* event) mutable {
                            *event->mutable_job() = Job(v1::JOB_RUNNING);
                            if (n == 0) rewind(event);
                            if (n == 1) *event->mutable_round() = rerun(2);
                            return n++ < 2;
                          },
                          grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  // The same coordinator's replay: the rewind, round 2 again, then round 3 and the end.
  stub.streams.push_back({[=, n = 0](JobEvent* event) mutable {
    *event->mutable_job() = Job(n == 3 ? v1::JOB_SUCCEEDED : v1::JOB_RUNNING);
    if (n == 0) rewind(event);
    if (n == 1) *event->mutable_round() = rerun(2);
    if (n == 2) *event->mutable_round() = rerun(3);
    if (n == 3) event->set_message("job job-1-abc succeeded");
    return n++ < 4;
  }});
  WatchOptions options;
  options.reconnect_for = std::chrono::seconds(60);
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out, options);
  ASSERT_TRUE(watched.ok()) << watched.ToString() << "\n" << out.str();
  const std::string text = out.str();
  EXPECT_EQ(stub.from_rounds, (std::vector<uint32_t>{0, 4, 3})) << "the third watch asks for the rounds after 2";
  const auto count = [&text](const std::string& what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  const std::string line = "job moved back to round 1: the checkpoint of round 3 was missing or damaged; rounds 2 to 3 "
                           "run again";
  EXPECT_EQ(count(line), 1u) << text;
  for (uint32_t r = 1; r <= 3; ++r) EXPECT_EQ(count(RoundRow(Round(r))), 1u) << "round " << r << ":\n" << text;
  for (uint32_t r = 2; r <= 3; ++r) EXPECT_EQ(count(RoundRow(rerun(r))), 1u) << "round " << r << ":\n" << text;
  EXPECT_LT(text.find(RoundRow(Round(3))), text.find(line)) << text;
  EXPECT_LT(text.find(line), text.find(RoundRow(rerun(2)))) << text;
  EXPECT_NE(text.find("final test accuracy: 93.00% after 3 rounds"), std::string::npos) << text;
}

// A watch whose first stream fails before the coordinator sent anything (a mistyped address)
// says so at once, as every other command does, rather than reconnecting to what it never had;
// once the coordinator has answered, the same failure is a coordinator gone away.
TEST(WatchTest, AFirstConnectionThatFailsIsReturnedAtOnce) {
  ScriptedStub stub;
  stub.streams.push_back({[](JobEvent*) { return false; }, grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused")});
  stub.streams.push_back(Rounds(1));
  WatchOptions options;
  options.reconnect_for = std::chrono::seconds(60);
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out, options);
  EXPECT_EQ(watched.code(), StatusCode::kUnavailable) << watched.ToString();
  EXPECT_EQ(stub.from_rounds.size(), 1u);
  EXPECT_EQ(out.str().find("lost the coordinator"), std::string::npos) << out.str();

  ScriptedStub answered;
  answered.streams.push_back({[n = 0](JobEvent* event) mutable {
                                *event->mutable_job() = Job(v1::JOB_RUNNING);
                                *event->mutable_round() = Round(1);
                                return n++ < 1;
                              },
                              grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")});
  answered.streams.push_back({[](JobEvent*) { return false; }, grpc::Status(grpc::StatusCode::UNAVAILABLE, "down")});
  answered.streams.push_back(Rounds(2));
  std::ostringstream followed;
  Status resumed = WatchCommand(answered, "job-1-abc", followed, options);
  EXPECT_TRUE(resumed.ok()) << resumed.ToString() << "\n" << followed.str();
  EXPECT_EQ(answered.from_rounds.size(), 3u);
  EXPECT_NE(followed.str().find("lost the coordinator"), std::string::npos) << followed.str();
}

// A coordinator that answers and closes each stream at once, sending only what was shown
// already, is not back: its reconnects count toward reconnect_for together and the watch gives
// up, where it used to reconnect for ever. A stream that brings a new round starts the time
// again, as does one that stays open for steady_for.
TEST(WatchTest, StreamsThatBringNothingNewDoNotStartTheReconnectTimeAgain) {
  // A running job's round `n`, then the stream closes cleanly.
  const auto closing_after = [](uint32_t n) {
    return ScriptedStub::Stream{[=, sent = false](JobEvent* event) mutable {
      if (sent) return false;
      *event->mutable_job() = Job(v1::JOB_RUNNING);
      *event->mutable_round() = Round(n);
      sent = true;
      return true;
    }};
  };
  const auto script = [&](ScriptedStub& stub) {
    stub.streams.push_back(closing_after(1));
    stub.streams.push_back(closing_after(2));  // a new round: the coordinator is back
    for (int i = 0; i < 4; ++i) stub.streams.push_back(closing_after(2));  // round 2 again, and again
  };
  ScriptedStub stub;
  script(stub);
  WatchOptions options;
  options.reconnect_for = std::chrono::milliseconds(0);  // no second try without progress
  options.steady_for = std::chrono::hours(1);
  std::ostringstream out;
  Status watched = WatchCommand(stub, "job-1-abc", out, options);
  EXPECT_EQ(watched.code(), StatusCode::kUnavailable) << watched.ToString() << "\n" << out.str();
  EXPECT_NE(watched.message().find("the coordinator did not come back within 0 s"), std::string::npos)
      << watched.ToString();
  EXPECT_EQ(stub.from_rounds, (std::vector<uint32_t>{0, 2, 3})) << out.str();

  // Each stream that stays open for steady_for (here: any) counts as the coordinator back: the
  // watch follows it to the end of its script (the stub's "not scripted", a final error).
  ScriptedStub steady;
  script(steady);
  options.steady_for = std::chrono::milliseconds(0);
  std::ostringstream followed;
  Status ended = WatchCommand(steady, "job-1-abc", followed, options);
  EXPECT_EQ(ended.code(), StatusCode::kUnimplemented) << ended.ToString() << "\n" << followed.str();
  EXPECT_EQ(steady.from_rounds.size(), 7u) << followed.str();
}

}  // namespace
}  // namespace tessera::cli
