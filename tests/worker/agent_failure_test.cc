// The worker agent when something fails (agent_fixture.h): its device, a download, a session
// replaced while it trained, what the coordinator's reasons look like in its log, and which
// refusals end the worker.
#include "core/data/idx.h"
#include "tests/captured_log.h"
#include "tests/worker/agent_fixture.h"

namespace tessera::worker {
namespace {

// A profile with a host link of 1 KB/s whose native ops are `native_ops` (the rest are host
// fallbacks, which pay the link): paced, what crosses the link is modelled at minutes.
std::string WriteSlowLinkProfile(const std::string& file, const std::string& native_ops) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / file).string();
  std::ofstream(path) << "[slow-link]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 8.0\nmemory_bandwidth_gbps = 100\n"
                      << "memory_bytes = 1073741824\nhost_link_gbps = 0.000001\npower_watts = 20\n"
                      << "native_ops = [" << native_ops << "]\n";
  return path;
}

// Each (job, text) of `cases` was reported, not trained: its round 1's upload is an
// INVALID_ARGUMENT failure naming the job's round and `text`.
void ExpectReportedInvalid(const std::vector<v1::UpdateHeader>& uploads,
                           const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [job, text] : cases) {
    SCOPED_TRACE(job);
    const auto found =
        std::find_if(uploads.begin(), uploads.end(), [&](const v1::UpdateHeader& h) { return h.job_id() == job; });
    ASSERT_NE(found, uploads.end()) << "nothing uploaded or reported";
    EXPECT_EQ(found->failure().rfind("INVALID_ARGUMENT", 0), 0u) << found->failure();
    EXPECT_NE(found->failure().find("job " + job + " round 1"), std::string::npos) << found->failure();
    EXPECT_NE(found->failure().find(text), std::string::npos) << found->failure();
  }
}

// The worker measures its device as it opens it: with the GEMM a host fallback over a slow
// link, that is modelled at minutes; a stop ends it.
TEST_F(AgentTest, AStopEndsThePacedMeasurementOfTheDevice) {
  WorkerOptions options;
  options.device = "emu:" + WriteSlowLinkProfile("agent_test_slow_measure.toml", "\"fill\"");
  options.pace_real_time = true;
  Start({}, {}, options);
  agent_->Stop();
  thread_.join();
  EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
}

// A paced round modelled at minutes (the model's copies and every op but the GEMM cross the
// slow link) stops pacing once the round's deadline passes: the worker is free for its next
// task instead of sleeping out the modelled time.
TEST_F(AgentTest, ThePacingOfARoundEndsAtItsDeadline) {
  const std::string path = WriteSlowLinkProfile("agent_test_slow_link.toml", "\"gemm\", \"fill\"");
  WorkerOptions options;
  options.device = "emu:" + path;
  options.pace_real_time = true;
  v1::Task slow = Train(1, 1);
  const int64_t now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch()).count();
  slow.mutable_train()->set_deadline_unix_ms(now_ms + 1000);
  // The next task is refused before it reaches the device: its report shows the worker took it.
  v1::Task next = Train(1, 1, "job-2");
  next.mutable_train()->mutable_spec()->set_fallback_device("emu:" + path);
  Start({slow, next}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2")) << "the paced round held the worker past its deadline";
  EXPECT_EQ(upload.failure().rfind("INVALID_ARGUMENT", 0), 0u) << upload.failure();
}

// A device that fails (out of memory, a driver error) sends the round to the job's fallback
// device class. A job names a class, never a file: "emu:FILE.toml" would have the worker read
// a file the job chose. Such a task is refused as the coordinator refuses such a spec, before
// anything of it is used; a built-in profile's name this worker does not have is reported
// failed when the device fails; a class still serves.
TEST_F(AgentTest, AJobsFallbackDeviceIsNeverAProfileFileOnTheWorker) {
  WorkerOptions options;
  options.device = "emu:" + WriteProfile("agent_test_tiny.toml", "tiny-npu", 64 << 10);  // the model does not fit
  v1::Task named_file = Train(1, 1);
  named_file.mutable_train()->mutable_spec()->set_fallback_device(
      "emu:" + WriteProfile("agent_test_job_named.toml", "job-npu", uint64_t{1} << 30));
  v1::Task named_class = Train(1, 1, "job-2");
  named_class.mutable_train()->mutable_spec()->set_fallback_device("emu:generic");
  v1::Task named_unknown = Train(1, 1, "job-3");
  named_unknown.mutable_train()->mutable_spec()->set_fallback_device("emu:no-such-profile");
  Start({named_file, named_class, named_unknown}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("INVALID_ARGUMENT", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("fallback_device"), std::string::npos) << upload.failure();
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-3"));
  EXPECT_EQ(upload.failure().rfind("RESOURCE_EXHAUSTED", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("the job's fallback device 'emu:no-such-profile'"), std::string::npos)
      << upload.failure();
  EXPECT_NE(upload.failure().find("is not a device class of this worker"), std::string::npos) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  // job-2 twice (its device, then its fallback), job-3 once; job-1 never.
  EXPECT_EQ(shared_->downloads, 3) << "a job trained again on a device it named";
}

// A download that fails with a transport's INTERNAL (a stream reset) or RESOURCE_EXHAUSTED is
// not the device's failure: the round is reported, not trained again on the job's fallback
// device (a GPU worker's round on its CPU).
TEST_F(AgentTest, ADownloadsFailureIsNotTakenForTheDevices) {
  shared_->before_download = [](const v1::DownloadModelRequest&) {
    return InternalError("download: Received RST_STREAM with error code 2");
  };
  v1::Task task = Train(1, 1);
  task.mutable_train()->mutable_spec()->set_fallback_device("emu:generic");
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("INTERNAL", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("RST_STREAM"), std::string::npos) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "the round was downloaded again for the fallback device";
}

// A worker that joins again while it trains (the coordinator restarted, or its session was
// refused) reports the task's failure under the session that handed the task out: under the
// new one, it would end that session's part in a round it may be handed again and train.
TEST_F(AgentTest, AFailureIsReportedUnderTheSessionThatHandedTheTaskOut) {
  shared_->numbered_sessions = true;
  shared_->next_session = std::vector<v1::Task>{};  // the first channel ends after its task
  // The second join waits until the task is being trained; its download fails once the
  // second session's channel is open.
  shared_->before_join = [this](int number) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (number == 2) shared_->cv.wait_for(lock, kWait, [&] { return shared_->downloads > 0; });
  };
  shared_->before_download = [this](const v1::DownloadModelRequest& request) {
    EXPECT_EQ(request.session(), "session-1");
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->cv.wait_for(lock, kWait, [&] { return shared_->channels >= 2; });
    return DataLossError("model version 0 of job job-1: tensor 'fc1.weight': content checksum does not match");
  };
  // The first session ends once the task is in hand.
  shared_->before_task = [this](size_t index) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (index == 1) shared_->cv.wait_for(lock, kWait, [&] { return shared_->downloads > 0; });
  };
  Start({Train(1, 1), AcceptedVerdict()});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("DATA_LOSS", 0), 0u) << upload.failure();
  EXPECT_EQ(upload.session(), "session-1");
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 2u);
}

using ::tessera::testing::CapturedLog;

// A worker that joins again while it trains forgets the old session's cancels with it: a task
// cancelled before the join was uploaded under the old session, which the coordinator refuses
// (it takes only its current session's updates). No update of an ended session is uploaded
// now, and the log says why.
TEST_F(AgentTest, AnUpdateOfASessionThatEndedIsNotUploaded) {
  CapturedLog log;
  shared_->numbered_sessions = true;
  shared_->next_session = std::vector<v1::Task>{Train(2, 1)};  // the first channel ends after its script
  bool trained = false;
  // Round 1 is cancelled once trained; its upload waits until the second session's channel is open.
  WorkerOptions options;
  options.after_training = [this, &trained](const v1::TrainTask& task) {
    if (task.round() != 1) return;
    std::unique_lock<std::mutex> lock(shared_->mu);
    trained = true;
    shared_->cv.notify_all();
    shared_->cv.wait_for(lock, kWait, [&] { return shared_->channels >= 2; });
  };
  shared_->before_task = [this, &trained](size_t index) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (index == 1) shared_->cv.wait_for(lock, kWait, [&] { return trained; });
  };
  Start({Train(1, 1), Cancel(1, 1)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(2, 1, &upload)) << "the new session's task was not uploaded";  // taken after round 1
  EXPECT_EQ(upload.session(), "session-2");
  for (const v1::UpdateHeader& h : Uploads()) {
    EXPECT_NE(h.round(), 1u) << "round 1 was uploaded under " << h.session();
  }
  EXPECT_NE(log.text().find("job 'job-1' round 1 attempt 1: trained in a session that has ended (the worker "
                            "joined again since); its update is not uploaded, as the coordinator takes a session's "
                            "own updates only"),
            std::string::npos)
      << log.text();
}

// A worker whose session ended (the coordinator closed its task channel) trained the task in
// hand to its end, for an update the coordinator would refuse, and held its device meanwhile.
// Training now stops at its next step, as at a cancel: here the first, as the channel closed
// while the model was downloading. With the session ended and no new one yet (its second join
// waits until the task is done with), and with the worker joined again.
TEST_F(AgentTest, TheEndOfItsSessionStopsATasksTraining) {
  for (const bool rejoined : {false, true}) {
    SCOPED_TRACE(rejoined ? "joined again" : "between sessions");
    shared_ = std::make_shared<ScriptedCoordinator::Shared>();
    shared_->numbered_sessions = true;
    shared_->next_session = std::vector<v1::Task>{};  // the first channel ends after its task
    std::optional<Status> failed;
    bool trained = false;
    WorkerOptions options;
    options.after_training = [this, &trained](const v1::TrainTask&) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      trained = true;
      shared_->cv.notify_all();
    };
    options.after_failed_training = [this, &failed](const v1::TrainTask&, const Status& why) {
      std::lock_guard<std::mutex> lock(shared_->mu);
      failed = why;
      shared_->cv.notify_all();
    };
    // The second join starts once the first session is over; without `rejoined` it is answered
    // once the task is done with.
    bool joining = false;
    shared_->before_join = [&, this](int number) {
      std::unique_lock<std::mutex> lock(shared_->mu);
      if (number != 2) return;
      joining = true;
      shared_->cv.notify_all();
      if (!rejoined) shared_->cv.wait_for(lock, kWait, [&] { return trained || failed.has_value(); });
    };
    shared_->before_download = [&, this](const v1::DownloadModelRequest&) {
      std::unique_lock<std::mutex> lock(shared_->mu);
      shared_->cv.wait_for(lock, kWait, [&] { return rejoined ? shared_->joins.size() >= 2 : joining; });
      return Status::Ok();
    };
    // The first session ends once the task is in hand.
    shared_->before_task = [this](size_t index) {
      std::unique_lock<std::mutex> lock(shared_->mu);
      if (index == 1) shared_->cv.wait_for(lock, kWait, [&] { return shared_->downloads > 0; });
    };
    Start({Train(1, 1), AcceptedVerdict()}, {}, options);
    {
      std::unique_lock<std::mutex> lock(shared_->mu);
      ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return trained || failed.has_value(); }));
      EXPECT_FALSE(trained) << "the task of an ended session was trained to its end";
      ASSERT_TRUE(failed.has_value());
      EXPECT_EQ(failed->code(), StatusCode::kCancelled) << failed->ToString();
      EXPECT_NE(failed->message().find("job job-1 round 1: its session ended"), std::string::npos)
          << failed->ToString();
      EXPECT_NE(failed->message().find("stopped after 0 steps"), std::string::npos) << failed->ToString();
    }
    agent_->Stop();
    thread_.join();
    EXPECT_TRUE(Uploads().empty()) << "an ended session's task uploaded or reported something";
    agent_.reset();
  }
}

// The end of a job (a cancel of its round 0: the job was cancelled or finished) stops the
// training of its task in hand at the next step, as a cancel of the task's own round does.
TEST_F(AgentTest, TheEndOfItsJobStopsATasksTraining) {
  std::optional<Status> failed;
  WorkerOptions options;
  options.after_failed_training = [this, &failed](const v1::TrainTask&, const Status& why) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    failed = why;
    shared_->cv.notify_all();
  };
  shared_->before_download = [this](const v1::DownloadModelRequest&) {
    EXPECT_TRUE(Deliver(Cancel(0, 0)));
    return Status::Ok();
  };
  Start({Train(1, 1)}, {}, options);
  std::unique_lock<std::mutex> lock(shared_->mu);
  ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return failed.has_value() || !shared_->uploads.empty(); }));
  ASSERT_TRUE(failed.has_value()) << "the task of an ended job was trained and uploaded";
  EXPECT_EQ(failed->code(), StatusCode::kCancelled) << failed->ToString();
  EXPECT_NE(failed->message().find("stopped after 0 steps"), std::string::npos) << failed->ToString();
}

// What the coordinator says about a cancel or a refused update is logged on one line, escaped
// and bounded: a reason that quotes a job or a worker cannot forge log lines or fill the log.
TEST_F(AgentTest, TheCoordinatorsReasonsAreLoggedEscapedAndBounded) {
  CapturedLog log;
  const std::string hostile = "late\n[2026-01-01 00:00:00.000] [w1] [info] forged" + std::string(1 << 20, 'x');
  v1::Task cancel = Cancel(9, 1);
  cancel.mutable_cancel()->set_reason(hostile);
  v1::Task verdict;
  verdict.mutable_verdict()->set_job_id("job-1");
  verdict.mutable_verdict()->set_round(8);
  verdict.mutable_verdict()->set_accepted(false);
  verdict.mutable_verdict()->set_reason(hostile);
  shared_->refuse_reason = hostile;
  Start({cancel, verdict, Train(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  agent_->Stop();
  thread_.join();  // the trainer has logged what became of its update
  EXPECT_EQ(agent_->updates_refused(), 1u);
  const std::string text = log.text();
  EXPECT_EQ(text.find("\n[2026-01-01"), std::string::npos) << "a reason forged a log line";
  EXPECT_EQ(text.find(std::string(1024, 'x')), std::string::npos) << "a reason was logged whole";
  for (const char* logged : {"round 9 attempt 1 of job 'job-1' cancelled: late\\n[2026-01-01",
                             "update for job 'job-1' round 8 refused: late\\n[2026-01-01",
                             "update refused: late\\n[2026-01-01"}) {
    EXPECT_NE(text.find(logged), std::string::npos) << logged << " not in:\n" << text.substr(0, 4096);
  }
}

// Tasks queue while the worker trains. Only the newest task of a job matters, and past 64
// jobs' tasks (a coordinator handing out far more than one worker does) the oldest is dropped,
// saying so: the queue stays bounded whatever the worker is sent.
TEST_F(AgentTest, TheTaskQueueHoldsOneTaskPerJobAndAtMostSixtyFour) {
  // Held by the hooks, which the trainer's thread may still be leaving when the test ends.
  struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    bool busy = false, open = false;
  };
  auto gate = std::make_shared<Gate>();
  shared_->before_download = [gate](const v1::DownloadModelRequest& request) {
    if (request.job_id() == "job-busy") {
      std::unique_lock<std::mutex> lock(gate->mu);
      gate->busy = true;
      gate->cv.notify_all();
      gate->cv.wait(lock, [&] { return gate->open; });
    }
    return Status::Ok();
  };
  // The rest is handed over once the worker is busy with the first task.
  shared_->before_task = [gate](size_t index) {
    if (index != 1) return;
    std::unique_lock<std::mutex> lock(gate->mu);
    gate->cv.wait(lock, [&] { return gate->busy; });
  };
  std::vector<v1::Task> script = {Train(1, 1, "job-busy")};
  for (uint32_t round = 1; round <= 3; ++round) script.push_back(Train(round, 1, "job-0"));
  for (int k = 1; k <= 70; ++k) script.push_back(Train(1, 1, "job-" + std::to_string(k)));
  CapturedLog log;
  Start(script);
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return shared_->scripts_delivered > 0; }));
  }
  const std::string text = log.text();
  // 71 jobs queued behind the busy one: job-0 (its round 3; rounds 1 and 2 were superseded
  // without a word) and job-1 to job-6 make way for the 64 newest.
  size_t drops = 0;
  for (size_t at = text.find("dropped the task of job"); at != std::string::npos;
       at = text.find("dropped the task of job", at + 1)) {
    ++drops;
  }
  EXPECT_EQ(drops, 7u) << text;
  EXPECT_NE(text.find("64 tasks queued: dropped the task of job 'job-0' round 3"), std::string::npos) << text;
  EXPECT_NE(text.find("dropped the task of job 'job-6' round 1"), std::string::npos) << text;
  EXPECT_EQ(text.find("dropped the task of job 'job-7'"), std::string::npos) << text;
  agent_->Stop();
  {
    std::lock_guard<std::mutex> lock(gate->mu);
    gate->open = true;
  }
  gate->cv.notify_all();
}

// A task whose job id is not of the coordinator's form (a line break in it would forge log
// lines) is ignored, named escaped; the next one trains.
TEST_F(AgentTest, ATaskWithAJobIdOutsideTheCoordinatorsFormIsIgnored) {
  CapturedLog log;
  Start({Train(1, 1, "job-1\n[2026-01-01 forged"), Train(1, 1, "../job-2"), Train(2, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(2, 1, &upload));
  EXPECT_EQ(upload.job_id(), "job-1");
  agent_->Stop();
  thread_.join();
  const std::string text = log.text();
  EXPECT_EQ(text.find("\n[2026-01-01"), std::string::npos) << "a job id forged a log line";
  EXPECT_NE(text.find("a task for job 'job-1\\n[2026-01-01 forged' round 1 was ignored"), std::string::npos) << text;
  EXPECT_NE(text.find("a task for job '../job-2' round 1 was ignored"), std::string::npos) << text;
}

// A task's spec and its own fields (model sets, cohort, collectives backend) are checked
// before any of them is used: one outside the coordinator's own bounds is reported as the
// round's failure, naming the field, escaped and bounded in the report and in the log, where
// it used to go into them as it was.
TEST_F(AgentTest, ATaskOutsideTheCoordinatorsBoundsIsReportedEscaped) {
  CapturedLog log;
  const std::string hostile = "x\n[2026-01-01 00:00:00.000] [w1] [info] forged" + std::string(1 << 16, 'x');
  v1::Task dataset = Train(1, 1, "job-a");
  dataset.mutable_train()->mutable_spec()->mutable_data()->set_dataset(hostile);
  v1::Task model_set = Train(1, 1, "job-b");
  model_set.mutable_train()->add_model_sets(hostile);
  v1::Task backend = Train(1, 1, "job-c");
  backend.mutable_train()->set_cohort("site-1");
  backend.mutable_train()->set_cohort_size(2);
  backend.mutable_train()->set_rendezvous_prefix("rendezvous/job-c/1/1/");
  backend.mutable_train()->set_collective_backend(hostile);
  v1::Task batch = Train(1, 1, "job-d");
  batch.mutable_train()->mutable_spec()->set_batch_size(wire::kMaxBatchSize + 1);
  Start({dataset, model_set, backend, batch});
  for (const auto& [job, field] : {std::pair<std::string, std::string>{"job-a", "data.dataset"},
                                   {"job-b", "model set"},
                                   {"job-c", "collectives backend"},
                                   {"job-d", "batch_size"}}) {
    SCOPED_TRACE(job);
    v1::UpdateHeader upload;
    ASSERT_TRUE(WaitForUpload(1, 1, &upload, job));
    EXPECT_NE(upload.failure().find(field), std::string::npos) << upload.failure().substr(0, 1024);
    EXPECT_EQ(upload.failure().find('\n'), std::string::npos) << "the report holds a line break";
    EXPECT_LT(upload.failure().size(), 4096u);
  }
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    EXPECT_EQ(shared_->downloads, 0) << "a task outside the bounds was acted on";
  }
  agent_->Stop();
  thread_.join();
  const std::string text = log.text();
  EXPECT_EQ(text.find("\n[2026-01-01"), std::string::npos) << "a task forged a log line";
  EXPECT_EQ(text.find(std::string(1024, 'x')), std::string::npos) << "a task's field was logged whole";
}

// A task's fields that contradict each other or the job are refused before anything is
// downloaded, naming the field. A lone worker's task that gave a cohort rank other than 0 was
// trained and then left to a cohort leader that does not exist: nothing was uploaded or
// reported, and the round waited for its deadline. A party outside the partition was found
// only after the model's download, and a model set named twice only in the download.
TEST_F(AgentTest, ATaskWhoseFieldsDisagreeIsReportedBeforeItsDownload) {
  v1::Task rank = Train(1, 1, "job-e");
  rank.mutable_train()->set_cohort_rank(3);
  v1::Task party = Train(1, 1, "job-f");
  party.mutable_train()->set_party_index(5);
  v1::Task sets = Train(1, 1, "job-g");
  sets.mutable_train()->add_model_sets("server_control");
  sets.mutable_train()->add_model_sets("server_control");
  Start({rank, party, sets, Train(1, 1, "job-z")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // trained after the others
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  ExpectReportedInvalid(Uploads(), {{"job-e", "cohort_rank 3"},
                                     {"job-f", "party_index 5"},
                                     {"job-g", "model set 'server_control' twice"}});
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "a task whose fields disagree was downloaded";
}

// A cohort task's size and backend are checked against what a coordinator can send before
// anything is downloaded. A size past INT_MAX went into the communicator as a negative int, one
// below it had the p2p transport allocate a slot per rank, and an unknown backend was found
// only by the rendezvous, after the model's download.
TEST_F(AgentTest, ACohortTaskOutsideTheCoordinatorsBoundsIsReportedBeforeItsDownload) {
  auto cohort_task = [](const std::string& job, uint32_t size, const std::string& backend) {
    v1::Task task = Train(1, 1, job);
    v1::TrainTask* train = task.mutable_train();
    train->set_cohort("site");
    train->set_cohort_rank(0);
    train->set_cohort_size(size);
    train->set_collective_backend(backend);
    train->set_rendezvous_prefix("rendezvous/" + job + "/1/1/site/");
    return task;
  };
  Start({cohort_task("job-h", 4097, "p2p"), cohort_task("job-i", 0x80000001u, "p2p"),
         cohort_task("job-j", 2, "local"), Train(1, 1, "job-z")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // trained after the others
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  ExpectReportedInvalid(Uploads(),
                        {{"job-h", "rank 0 of a cohort of 4097, expected a rank below a size of 1 to 4096"},
                         {"job-i", "of a cohort of 2147483649"},
                         {"job-j", "collectives backend 'local', expected auto, gloo, mpi, nccl or p2p"}});
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "a cohort task outside the bounds was downloaded";
}

// The coordinator bounds a job's model once it knows the data's shape, and fills that shape
// into every job it runs. A task of another dataset without it passed the worker's checks with
// any model, and the download was allowed as many bytes as that model named (here 16 GiB), each
// allocated and zeroed as a manifest declared it. The model is bounded before the download now.
TEST_F(AgentTest, ATaskWhoseModelIsPastTheCoordinatorsBoundIsReportedBeforeItsDownload) {
  v1::Task big = Train(1, 1, "job-k");
  v1::JobSpec* spec = big.mutable_train()->mutable_spec();
  spec->mutable_data()->set_dataset("tabular");
  spec->mutable_data()->set_format("idx");
  spec->mutable_data()->set_path("/nonexistent/tabular");
  spec->mutable_model()->clear_hidden();
  spec->mutable_model()->add_hidden(wire::kMaxHiddenWidth);
  spec->mutable_model()->add_hidden(wire::kMaxHiddenWidth);
  Start({big, Train(1, 1, "job-z")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // trained after the other
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  ExpectReportedInvalid(Uploads(), {{"job-k", "the task's model has 4347133962 parameters"}});
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "a model past the bound was downloaded";
}

// A label outside the job's classes is found by the partition of the training split, whose
// error said only "partition: label 12 at index 2": the operator of a worker could not tell
// which of its files held it. It names the labels' file now, for Fashion-MNIST and for a
// dataset in another format.
TEST_F(AgentTest, ALabelOutsideTheClassesIsReportedWithItsFile) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / "agent_test_bad_labels";
  std::filesystem::create_directories(dir);
  const std::string labels = (dir / "train-labels-idx1-ubyte").string();
  ASSERT_TRUE(WriteIdxPair((dir / "train-images-idx3-ubyte").string(), labels, 28, 28,
                           std::vector<uint8_t>(4 * 28 * 28, 7), {1, 2, 12, 3})
                  .ok());
  v1::Task fashion = Train(1, 1, "job-l");
  fashion.mutable_train()->mutable_spec()->mutable_data()->set_path(dir.string());
  v1::Task idx = Train(1, 1, "job-m");
  v1::DataSpec* data = idx.mutable_train()->mutable_spec()->mutable_data();
  data->set_dataset("digits");
  data->set_format("idx");
  data->set_path(dir.string());
  data->mutable_input_shape()->set_channels(1);
  data->mutable_input_shape()->set_rows(28);
  data->mutable_input_shape()->set_cols(28);
  data->mutable_input_shape()->set_classes(10);
  Start({fashion, idx});
  for (const std::string job : {"job-l", "job-m"}) {
    SCOPED_TRACE(job);
    v1::UpdateHeader upload;
    ASSERT_TRUE(WaitForUpload(1, 1, &upload, job));
    EXPECT_NE(upload.failure().find(labels + ": partition: label 12 at index 2 is outside [0, 10)"), std::string::npos)
        << upload.failure();
  }
}

// A cancel of round 0 ends a whole job, so a task of round 0 could not be cancelled on its own:
// a coordinator numbers rounds from 1, and such a task was trained and uploaded as any other.
// It is reported now, before its download.
TEST_F(AgentTest, ATaskOfRoundZeroIsReportedBeforeItsDownload) {
  v1::Task zero = Train(0, 1, "job-n");
  zero.mutable_train()->set_model_version(0);
  Start({zero, Train(1, 1, "job-z")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // trained after the other
  ASSERT_TRUE(WaitForUpload(0, 1, &upload, "job-n"));
  EXPECT_EQ(upload.failure(), "INVALID_ARGUMENT: job job-n round 0: the task's round is 0; rounds are numbered from 1");
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "the task of round 0 was downloaded";
}

// Cancels were kept sixteen at a time, and a queued task's cancel was looked up only when the
// task was taken: a worker behind on twenty jobs whose rounds were all cancelled forgot the
// first cancels and trained and uploaded those tasks, and the task in hand, cancelled before
// them, was trained and uploaded too. A cancel now drops the queued tasks it covers, and the
// cancel of the task in hand is kept however many come after it.
TEST_F(AgentTest, ManyCancelsForgetNeitherAQueuedTasksNorTheOneInHand) {
  constexpr int kQueued = 20;
  std::vector<v1::Task> script = {Train(1, 1)};
  for (int i = 0; i < kQueued; ++i) script.push_back(Train(1, 1, "job-q" + std::to_string(i)));
  script.push_back(Cancel(1, 1));
  for (int i = 0; i < kQueued; ++i) {
    v1::Task cancel = Cancel(1, 1);
    cancel.mutable_cancel()->set_job_id("job-q" + std::to_string(i));
    script.push_back(cancel);
  }
  script.push_back(Train(1, 1, "job-z"));
  // The cancels come once job-1 is in hand, which waits in its download until all have come.
  shared_->before_task = [this](size_t index) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (index == kQueued + 1) shared_->cv.wait_for(lock, kWait, [&] { return shared_->downloads > 0; });
  };
  shared_->before_download = [this](const v1::DownloadModelRequest& request) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (request.job_id() == "job-1") shared_->cv.wait_for(lock, kWait, [&] { return shared_->scripts_delivered > 0; });
    return Status::Ok();
  };
  Start(script);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // queued after the others
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  for (const v1::UpdateHeader& h : Uploads()) {
    EXPECT_EQ(h.job_id(), "job-z") << "a cancelled task was uploaded: " << h.failure();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 2) << "a cancelled queued task was trained";
  EXPECT_EQ(shared_->uploads_cancelled, 0) << "a cancelled task was trained to its upload";
}

// A task whose deadline has passed on this worker's clock as it arrives (the round is over, or
// this worker's clock runs ahead of the coordinator's) was downloaded and set up only to stop at
// its first step, and nothing was said: a worker whose clock ran ahead silently did no round.
// It is reported now, naming the deadline and this worker's clock, and nothing is downloaded.
TEST_F(AgentTest, ATaskPastItsDeadlineOnArrivalIsReportedWithoutADownload) {
  const int64_t now_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  v1::Task late = Train(1, 1);
  late.mutable_train()->set_deadline_unix_ms(now_unix_ms - 60000);
  Start({late, Train(1, 1, "job-z")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));  // queued after job-1's
  const auto uploads = Uploads();
  const auto found =
      std::find_if(uploads.begin(), uploads.end(), [](const v1::UpdateHeader& h) { return h.job_id() == "job-1"; });
  ASSERT_NE(found, uploads.end()) << "job-1's task was not reported";
  upload = *found;
  EXPECT_EQ(upload.failure().rfind("DEADLINE_EXCEEDED", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("job job-1 round 1: the task's deadline_unix_ms " +
                                  std::to_string(now_unix_ms - 60000) + " has passed on this worker's clock"),
            std::string::npos)
      << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 1) << "a task past its deadline was downloaded";
}

// A join refused (a wrong token, a certificate the coordinator does not take) will not fix
// itself: Run() returns the refusal.
TEST_F(AgentTest, ARefusedJoinEndsTheWorker) {
  shared_->join_refusal = PermissionDeniedError("join: wrong join token for worker 'w1'");
  Start({});
  thread_.join();
  EXPECT_EQ(run_status_.code(), StatusCode::kPermissionDenied) << run_status_.ToString();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 1u);
}

// A backoff of 0 rejoined a coordinator that was down with no wait at all, for ever (doubling 0
// gives 0). Run() refuses it, and a maximum below the initial backoff, before it joins.
TEST_F(AgentTest, ABackoffOfZeroIsRefused) {
  // Without the check the worker would join at once: the first join ends it, so Run() returns OK.
  shared_->before_join = [this](int) { agent_->Stop(); };
  shared_->join_refusal = UnavailableError("join: the coordinator is down");
  WorkerOptions options;
  options.backoff_initial_ms = 0;
  Start({}, {}, options);
  thread_.join();
  EXPECT_EQ(run_status_.code(), StatusCode::kInvalidArgument) << run_status_.ToString();
  EXPECT_EQ(run_status_.message(),
            "worker options: backoff_initial_ms must be at least 1 and backoff_max_ms at least backoff_initial_ms; "
            "got 0 and 5000");
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    EXPECT_EQ(shared_->joins.size(), 0u);
  }
  agent_.reset();
  options.backoff_initial_ms = 100;
  options.backoff_max_ms = 50;
  Start({}, {}, options);
  thread_.join();
  EXPECT_EQ(run_status_.code(), StatusCode::kInvalidArgument) << run_status_.ToString();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 0u);
}

// The same codes from the task channel of a session that joined (a coordinator of another
// version refusing what the worker says there) end the session, not the worker: it joins
// again after its backoff and trains what the next session hands it.
TEST_F(AgentTest, AnInvalidArgumentFromTheTaskChannelIsRetried) {
  shared_->next_session = std::vector<v1::Task>{Train(1, 1)};
  shared_->first_channel_end = InvalidArgumentError("task session: the first message must be 'open'");
  Start({});
  v1::UpdateHeader header;
  ASSERT_TRUE(WaitForUpload(1, 1, &header)) << "the worker did not join again";
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 2u);
}

TEST_F(AgentTest, APermissionDeniedFromTheTaskChannelIsRetried) {
  shared_->next_session = std::vector<v1::Task>{Train(1, 1)};
  shared_->first_channel_end = PermissionDeniedError("task channel: a coordinator of another version");
  Start({});
  v1::UpdateHeader header;
  ASSERT_TRUE(WaitForUpload(1, 1, &header)) << "the worker did not join again";
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 2u);
}

}  // namespace
}  // namespace tessera::worker
