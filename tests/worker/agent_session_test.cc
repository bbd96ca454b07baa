// The worker agent at the end of a task session (agent_fixture.h): what it had queued then;
// and what it logs of the verdicts and cancels that come down its task channel.
#include "tests/captured_log.h"
#include "tests/worker/agent_fixture.h"

namespace tessera::worker {
namespace {

// The tasks queued when a session ends are dropped with it: the coordinator takes no update of
// an ended session, so one taken before the next join would download its model only to stop
// before its first step. Here job-1's task is in hand (its download waits for the session's
// end) and job-2's is queued behind it when the task channel ends; the next join waits until
// the test is done. The worker keeps its round's memory, so once job-1's task is done with it
// hands the memory back only after idle_release_ms with nothing to do: that release comes,
// with job-2's model never downloaded.
TEST_F(AgentTest, TheTasksQueuedWhenASessionEndsAreDropped) {
  testing::CapturedLog log;
  shared_->numbered_sessions = true;
  shared_->next_session = std::vector<v1::Task>{};  // the first channel ends after its script
  std::vector<std::string> failed;                  // the jobs whose training failed or stopped
  bool joining = false;                             // the second join has started: the session is over
  bool release = false;                             // the second join may be answered
  WorkerOptions options;
  options.keep_round_memory = true;
  options.idle_release_ms = 10;
  options.after_failed_training = [this, &failed](const v1::TrainTask& task, const Status&) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    failed.push_back(task.job_id());
    shared_->cv.notify_all();
  };
  shared_->before_task = [&, this](size_t index) {  // job-2's task comes once job-1's is in hand
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (index == 1) shared_->cv.wait_for(lock, kWait, [&] { return shared_->downloads >= 1; });
  };
  shared_->before_download = [&, this](const v1::DownloadModelRequest& request) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (request.job_id() == "job-1") shared_->cv.wait_for(lock, kWait, [&] { return joining; });
    return Status::Ok();
  };
  shared_->before_join = [&, this](int number) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (number != 2) return;
    joining = true;
    shared_->cv.notify_all();
    shared_->cv.wait_for(lock, kWait, [&] { return release; });
  };
  Start({Train(1, 1, "job-1"), Train(1, 1, "job-2")}, {}, options);
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (agent_->idle_releases() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(agent_->idle_releases(), 1u);
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    EXPECT_EQ(shared_->downloads, 1) << "the queued task of an ended session downloaded its model";
    EXPECT_EQ(failed, std::vector<std::string>{"job-1"});
    release = true;
    shared_->cv.notify_all();
  }
  agent_->Stop();
  thread_.join();
  EXPECT_TRUE(Uploads().empty()) << "an ended session's task uploaded or reported something";
  EXPECT_NE(log.text().find("the task session ended: 1 queued task(s) dropped"), std::string::npos) << log.text();
}

// A hostile reason: a forged log line after a newline, then 4 KiB.
std::string HostileReason(const std::string& word) {
  return word + "\n[2026-01-01 00:00:00.000] [w1] [info] forged" + std::string(4096, 'x');
}

}  // namespace

// What a log rate limit must hold while `script` (many messages with HostileReason(word)) is
// delivered: every window the delivery touched lets at most `burst` lines containing `marker`
// through, `first_line` is among them (escaped), nothing forges a line or is logged whole.
void AgentTest::ExpectLoggedAtABoundedRate(std::vector<v1::Task> script, const std::string& marker,
                                           const std::string& first_line, int64_t burst,
                                           std::chrono::steady_clock::duration window) {
  testing::CapturedLog log;
  const auto started = std::chrono::steady_clock::now();
  Start(std::move(script));
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return shared_->scripts_delivered >= 1; }));
  }
  const auto elapsed = std::chrono::steady_clock::now() - started;
  agent_->Stop();
  thread_.join();
  const std::string text = log.text();
  int64_t lines = 0;
  for (size_t at = text.find(marker); at != std::string::npos; at = text.find(marker, at + 1)) ++lines;
  const int64_t windows = 1 + elapsed / window;
  EXPECT_GE(lines, 1) << text.substr(0, 4096);
  EXPECT_LE(lines, burst * windows) << text.substr(0, 4096);
  EXPECT_NE(text.find(first_line), std::string::npos) << text.substr(0, 4096);
  EXPECT_EQ(text.find("\n[2026-01-01"), std::string::npos) << "a reason forged a log line";
  EXPECT_EQ(text.find(std::string(1024, 'x')), std::string::npos) << "a reason was logged whole";
}

namespace {

// A coordinator that sends verdicts refusing updates this worker never sent, as many as it
// likes: a few are logged per minute (kRefusedVerdictLogBurst per kRefusedVerdictLogWindow),
// each escaped and bounded, not one line per verdict until the disk is full.
TEST_F(AgentTest, RefusedVerdictsAreLoggedAtABoundedRate) {
  std::vector<v1::Task> script;
  for (int i = 0; i < 500; ++i) {
    v1::Task task;
    task.mutable_verdict()->set_job_id("never-sent");
    task.mutable_verdict()->set_round(static_cast<uint32_t>(i + 1));
    task.mutable_verdict()->set_accepted(false);
    task.mutable_verdict()->set_reason(HostileReason("stale"));
    script.push_back(std::move(task));
  }
  ExpectLoggedAtABoundedRate(std::move(script), "refused: stale",
                             "update for job 'never-sent' round 1 refused: stale\\n[2026-01-01",
                             kRefusedVerdictLogBurst, kRefusedVerdictLogWindow);
}

// A coordinator that sends cancels of rounds this worker never had a task of, as many as it
// likes: a few are logged per minute (kCancelLogBurst per kCancelLogWindow), each escaped and
// bounded, not one line per cancel until the disk is full.
TEST_F(AgentTest, CancelsAreLoggedAtABoundedRate) {
  std::vector<v1::Task> script;
  for (int i = 0; i < 500; ++i) {
    v1::Task task;
    task.mutable_cancel()->set_job_id("never-had");
    task.mutable_cancel()->set_round(static_cast<uint32_t>(i + 1));
    task.mutable_cancel()->set_attempt(1);
    task.mutable_cancel()->set_reason(HostileReason("late"));
    script.push_back(std::move(task));
  }
  ExpectLoggedAtABoundedRate(std::move(script), "cancelled: late",
                             "round 1 attempt 1 of job 'never-had' cancelled: late\\n[2026-01-01",
                             kCancelLogBurst, kCancelLogWindow);
}

}  // namespace
}  // namespace tessera::worker
