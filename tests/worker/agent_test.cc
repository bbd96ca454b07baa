// The worker agent against a scripted coordinator (agent_fixture.h): what it does with the
// tasks, cancels and verdicts it is sent, on real data and a real CPU device.
#include "collectives/registry.h"
#include "tests/captured_log.h"
#include "tests/worker/agent_fixture.h"

namespace tessera::worker {
namespace {

TEST_F(AgentTest, ACancelledAttemptDoesNotStopTheRetryOfTheSameRound) {
  // Attempt 1 of round 1 is cancelled at its deadline; the worker is selected again for
  // attempt 2. The cancel names attempt 1 only: attempt 2 trains and uploads in full.
  Start({Train(1, 1), Cancel(1, 1), Train(1, 2)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 2, &upload)) << "no update for round 1 attempt 2: the retry was taken for cancelled";
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  EXPECT_EQ(upload.job_id(), "job-1");
  for (const auto& h : Uploads()) EXPECT_NE(h.attempt(), 1u) << "the cancelled attempt uploaded";
}

// A restarted coordinator resumes a round at the attempt it had: a cancel the worker got in
// its previous session must not stop the same (job, round, attempt) handed out again.
TEST_F(AgentTest, ACancelFromAnEarlierSessionDoesNotStopTheSameTaskHandedOutAgain) {
  shared_->next_session = std::vector<v1::Task>{Train(1, 1)};
  Start({Cancel(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload)) << "round 1 attempt 1 of the new session was taken for cancelled";
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 2u);
}

// A small model sent inside its task (TrainTask.inline_model) is trained from without a
// download call, checked as a download is: a damaged one is reported, never trained on.
TEST_F(AgentTest, AModelInsideItsTaskIsTrainedWithoutADownload) {
  auto device = CreateDevice("cpu");
  auto model = CreateModel(wire::ToModelConfig(TinyJob()), device->get());
  ASSERT_TRUE(model.ok());
  const TensorSet state = (*model)->GetState().value();
  v1::InlineModel inline_model;
  *inline_model.mutable_manifest() = wire::BuildManifest(state, 4096);
  ASSERT_TRUE(wire::ForEachChunk(state, 4096, 0, [&](const v1::TensorChunk& chunk) {
                *inline_model.add_chunks() = chunk;
                return Status::Ok();
              }).ok());
  ASSERT_GT(inline_model.chunks_size(), 1);
  v1::Task good = Train(1, 1);
  *good.mutable_train()->mutable_inline_model() = inline_model;
  v1::Task damaged = Train(1, 1, "job-2");  // another job's: not superseded by the first
  *damaged.mutable_train()->mutable_inline_model() = inline_model;
  damaged.mutable_train()->mutable_inline_model()->mutable_chunks(1)->mutable_data()->at(3) ^= 1;
  Start({good, damaged});
  EXPECT_TRUE(Joined().accepts_inline_model());
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  EXPECT_NE(upload.failure().find("(in its task)"), std::string::npos) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 0);
}

// A task whose coordinator takes the trained model (TrainTask.takes_trained_weights) gets it in
// the "delta" set, marked so: the global model plus the delta the same training sends
// otherwise, bit for bit. A compressed job's update stays a delta, and so does one of a job
// whose model travels compressed.
// --keep-round-memory: a round's memory stays with the worker until it has been idle for
// idle_release_ms, then goes back once; without the flag nothing is kept to hand back.
TEST_F(AgentTest, KeptRoundMemoryIsHandedBackOnceTheWorkerIsIdle) {
  WorkerOptions options;
  options.keep_round_memory = true;
  options.idle_release_ms = 50;
  Start({Train(1, 1)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (agent_->idle_releases() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(agent_->idle_releases(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(agent_->idle_releases(), 1u) << "released again with nothing kept";
}

// A job the coordinator says ended (a cancel of round 0) gives back the data the worker held
// for it, and a task of it still queued is not trained.
TEST_F(AgentTest, AJobThatEndedLetsGoOfItsData) {
  Start({Train(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  auto holds = [&](const std::string& job) {
    const std::vector<std::string> held = agent_->JobsHeld();
    return std::find(held.begin(), held.end(), job) != held.end();
  };
  EXPECT_TRUE(holds("job-1")) << "the share of a running job is kept between its rounds";
  v1::Task ended = Cancel(0, 0);
  ended.mutable_cancel()->set_reason("the job succeeded");
  ASSERT_TRUE(Deliver(ended));
  const auto until = std::chrono::steady_clock::now() + kWait;
  while (holds("job-1") && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(holds("job-1")) << "the ended job's data is still held";
  // A task of the ended job that comes late is not trained; another job's is.
  ASSERT_TRUE(Deliver(Train(2, 1)));
  ASSERT_TRUE(Deliver(Train(1, 1, "job-2")));
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));  // tasks are taken in order: job-1's came first
  for (const auto& h : Uploads()) EXPECT_FALSE(h.job_id() == "job-1" && h.round() == 2) << "the ended job trained";
}

// Ended jobs wait for the task thread to release them. Once sixteen waited, a further job's end
// was dropped and its data held until something replaced it. Only ends of jobs the worker holds
// something for wait now, and however many others come, the end of one it holds is kept.
TEST_F(AgentTest, TheEndOfAJobWhoseDataIsHeldIsKeptPastManyOtherEnds) {
  bool in_hook = false, ends_delivered = false;
  WorkerOptions options;
  options.after_training = [this, &in_hook, &ends_delivered](const v1::TrainTask&) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    in_hook = true;
    shared_->cv.notify_all();
    shared_->cv.wait_for(lock, kWait, [&] { return ends_delivered; });
  };
  Start({Train(1, 1)}, {}, options);
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return in_hook; }));
  }
  const std::vector<std::string> held = agent_->JobsHeld();
  EXPECT_NE(std::find(held.begin(), held.end(), "job-1"), held.end()) << "job-1's share is not held as it trains";
  // While job-1's task is in hand, twenty jobs this worker never held end, then job-1.
  for (int i = 0; i < 20; ++i) {
    v1::Task ended = Cancel(0, 0);
    ended.mutable_cancel()->set_job_id("job-e" + std::to_string(i));
    ASSERT_TRUE(Deliver(ended));
  }
  ASSERT_TRUE(Deliver(Cancel(0, 0)));
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    ends_delivered = true;
    shared_->cv.notify_all();
  }
  // The ended jobs are released before the next task is taken: a task of round 0, reported
  // before anything is loaded for it.
  ASSERT_TRUE(Deliver(Train(0, 1, "job-2")));
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(0, 1, &upload, "job-2"));
  EXPECT_FALSE(upload.failure().empty());
  EXPECT_TRUE(agent_->JobsHeld().empty()) << "the data of job " << agent_->JobsHeld().front() << " is still held";
}

// Two jobs on the worker's own files share one load; the share belongs to the job that used it
// last, so that job's end releases it.
TEST_F(AgentTest, ASharedLocalShareIsReleasedByTheEndOfTheLastJobThatUsedIt) {
  WorkerOptions options;
  options.data_dir = wire::DatasetDirectory(TinyJob());
  std::vector<v1::Task> script;
  for (const char* job : {"job-1", "job-2"}) {
    v1::Task task = Train(1, 1, job);
    task.mutable_train()->mutable_spec()->mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
    task.mutable_train()->mutable_spec()->mutable_data()->mutable_partition()->set_parties(0);
    script.push_back(task);
  }
  Start(script, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  ASSERT_TRUE(upload.failure().empty()) << upload.failure();
  v1::Task ended = Cancel(0, 0);
  ended.mutable_cancel()->set_job_id("job-2");
  ASSERT_TRUE(Deliver(ended));
  // Ended jobs are released before the next task: one of round 0, refused before any load.
  ASSERT_TRUE(Deliver(Train(0, 1, "job-3")));
  ASSERT_TRUE(WaitForUpload(0, 1, &upload, "job-3"));
  const std::vector<std::string> held = agent_->JobsHeld();
  EXPECT_TRUE(held.empty()) << "the share is still held, under job " << held.front();
}

// A heartbeat that fails for another reason than an unknown session (the coordinator
// unreachable, a refused certificate) is retried at the next beat: said once when it starts,
// not at every beat, and said again when beats get through.
TEST_F(AgentTest, FailedHeartbeatsAreSaidOnceAndTheirEnd) {
  tessera::testing::CapturedLog log;
  shared_->heartbeat = [](int number) {
    return number <= 3 ? PermissionDeniedError("the caller's certificate was revoked") : Status::Ok();
  };
  Start({});
  {
    std::unique_lock<std::mutex> lock(shared_->mu);
    ASSERT_TRUE(shared_->cv.wait_for(lock, kWait, [&] { return shared_->heartbeats >= 5; }));
  }
  const std::string text = log.text();
  const std::string failed = "heartbeat failed: the caller's certificate was revoked";
  const size_t first = text.find(failed);
  ASSERT_NE(first, std::string::npos) << text;
  EXPECT_EQ(text.find(failed, first + 1), std::string::npos) << "said at every beat:\n" << text;
  EXPECT_NE(text.find("heartbeats reach the coordinator again, after 3 failed"), std::string::npos) << text;
}

TEST_F(AgentTest, WithoutKeptRoundMemoryNothingIsHandedBackWhenIdle) {
  WorkerOptions options;
  options.idle_release_ms = 50;
  Start({Train(1, 1)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(agent_->idle_releases(), 0u);
}

TEST_F(AgentTest, ACoordinatorThatSubtractsGetsTheTrainedModel) {
  v1::Task delta = Train(1, 1);
  v1::Task trained = Train(1, 1, "job-2");  // the same training, another job's task
  trained.mutable_train()->set_takes_trained_weights(true);
  v1::Task int8 = Train(1, 1, "job-3");
  int8.mutable_train()->set_takes_trained_weights(true);
  int8.mutable_train()->mutable_spec()->mutable_compression()->set_encoding(v1::ENCODING_INT8);
  // A model sent compressed: the delta is from the model as decoded here, which the
  // coordinator does not hold.
  v1::Task decoded = Train(1, 1, "job-4");
  decoded.mutable_train()->set_takes_trained_weights(true);
  decoded.mutable_train()->mutable_spec()->mutable_compression()->set_download(v1::ENCODING_FLOAT16);
  Start({delta, trained, int8, decoded});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-3"));
  EXPECT_FALSE(upload.trained_weights());
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-4"));
  EXPECT_FALSE(upload.trained_weights());
  const TensorSet global = ScriptedCoordinator({}, shared_).model();
  std::map<std::string, std::pair<v1::UpdateHeader, TensorSet>> by_job;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (size_t i = 0; i < shared_->uploads.size(); ++i) {
      by_job[shared_->uploads[i].job_id()] = {shared_->uploads[i], shared_->uploaded[i]};
    }
  }
  ASSERT_EQ(by_job.count("job-1"), 1u);
  ASSERT_EQ(by_job.count("job-2"), 1u);
  EXPECT_FALSE(by_job["job-1"].first.trained_weights());
  EXPECT_TRUE(by_job["job-2"].first.trained_weights());
  const TensorSet& sent_delta = by_job["job-1"].second;
  const TensorSet& sent_model = by_job["job-2"].second;
  ASSERT_EQ(sent_delta.size(), global.size());
  ASSERT_EQ(sent_model.size(), global.size());
  size_t moved = 0;
  for (size_t i = 0; i < global.size(); ++i) {
    for (size_t j = 0; j < global[i].values.size(); ++j) {
      ASSERT_EQ(sent_model[i].values[j] - global[i].values[j], sent_delta[i].values[j]) << global[i].name << " " << j;
      moved += sent_delta[i].values[j] != 0.0f;
    }
  }
  EXPECT_GT(moved, 0u) << "the worker did not train";
}

TEST_F(AgentTest, ACancelWithoutAnAttemptStopsEveryAttemptOfItsRound) {
  // From a coordinator that does not send the attempt (0): the round is cancelled whole.
  // The trainer takes tasks in order, so once job-2's update is in, job-1's task is done.
  Start({Cancel(1, 0), Train(1, 2), Train(1, 1, "job-2")});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  for (const auto& h : Uploads()) EXPECT_NE(h.job_id(), "job-1") << "the cancelled round uploaded";
}

// Training stops at a cancel only between its steps: a cancel that comes once the last step
// is done (here, delivered as training ends) stops the upload. The worker stays healthy: the
// job's next round trains and uploads.
TEST_F(AgentTest, ACancelAfterTheLastTrainingStepStopsTheUpload) {
  ::tessera::testing::CapturedLog log;
  WorkerOptions options;
  options.after_training = [this](const v1::TrainTask& task) {
    if (task.round() != 1) return;
    EXPECT_TRUE(Deliver(Cancel(1, 1)));
    EXPECT_TRUE(Deliver(Train(2, 1)));
  };
  Start({Train(1, 1)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(2, 1, &upload)) << "the next round after a cancelled upload did not upload";
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  agent_->Stop();
  thread_.join();  // the trainer has logged what became of both rounds
  // The trainer takes tasks in order: round 1 was done with before round 2 began.
  for (const auto& h : Uploads()) EXPECT_NE(h.round(), 1u) << "the cancelled round uploaded";
  EXPECT_EQ(agent_->rounds_trained(), 1u);
  const std::string text = log.text();
  const std::string said = "job 'job-1' round 1 attempt 1: cancelled after training; its update is not uploaded";
  const size_t at = text.find(said);
  EXPECT_NE(at, std::string::npos) << text.substr(0, 4096);
  EXPECT_EQ(text.find(said, at + 1), std::string::npos) << "said more than once";
}

TEST_F(AgentTest, ACancelOfAnotherAttemptOrRoundAfterTrainingDoesNotStopTheUpload) {
  WorkerOptions options;
  options.after_training = [this](const v1::TrainTask&) {
    EXPECT_TRUE(Deliver(Cancel(1, 2)));
    EXPECT_TRUE(Deliver(Cancel(2, 1)));
    v1::Task other_job = Cancel(1, 1);
    other_job.mutable_cancel()->set_job_id("job-2");
    EXPECT_TRUE(Deliver(other_job));
  };
  Start({Train(1, 1)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload)) << "the upload was stopped by a cancel of another task";
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
}

// A cancel that comes while the update is on its way ends the upload there
// (CoordinatorClient::CancelUpload), logged once and not as a failed upload. The worker stays
// healthy: the job's next round trains and uploads.
TEST_F(AgentTest, ACancelWhileUploadingEndsTheUpload) {
  ::tessera::testing::CapturedLog log;
  shared_->during_upload = [this](const v1::UpdateHeader& header) {
    if (header.round() != 1) return;
    EXPECT_TRUE(Deliver(Cancel(1, 1)));
    EXPECT_TRUE(Deliver(Train(2, 1)));
  };
  Start({Train(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(2, 1, &upload)) << "the next round after a cancelled upload did not upload";
  agent_->Stop();
  thread_.join();
  for (const auto& h : Uploads()) EXPECT_NE(h.round(), 1u) << "the cancelled round's upload went on";
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    EXPECT_EQ(shared_->uploads_cancelled, 1);
  }
  EXPECT_EQ(agent_->rounds_trained(), 1u);
  const std::string text = log.text();
  const std::string said = "job 'job-1' round 1 attempt 1: cancelled while its update was uploading";
  const size_t at = text.find(said);
  EXPECT_NE(at, std::string::npos) << text.substr(0, 4096);
  EXPECT_EQ(text.find(said, at + 1), std::string::npos) << "said more than once";
  EXPECT_EQ(text.find("the coordinator cancelled the task"), std::string::npos) << "logged as a failed upload";
}

TEST_F(AgentTest, ACancelOfAnotherTaskWhileUploadingDoesNotEndTheUpload) {
  shared_->during_upload = [this](const v1::UpdateHeader&) {
    EXPECT_TRUE(Deliver(Cancel(1, 2)));
    EXPECT_TRUE(Deliver(Cancel(2, 1)));
    v1::Task other_job = Cancel(1, 1);
    other_job.mutable_cancel()->set_job_id("job-2");
    EXPECT_TRUE(Deliver(other_job));
  };
  Start({Train(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload)) << "the upload was ended by a cancel of another task";
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->upload_cancels.size(), 3u) << "a cancel did not reach the client";
  EXPECT_EQ(shared_->uploads_cancelled, 0);
}

}  // namespace

// SCAFFOLD's client: the download carries c and this seat's c_i after the model; the upload
// carries the delta and the variate's change, delta c_i = -c + (x - y) / (K lr), and the
// report gives the steps K and FedNova's normaliser a_i (K itself at momentum 0). The variate
// divides by K whatever the momentum (the correction runs outside it).
void AgentTest::ExpectScaffoldUpload(double momentum) {
  v1::Task task = Train(1, 1);
  task.mutable_train()->mutable_spec()->set_strategy("scaffold");
  task.mutable_train()->mutable_spec()->mutable_optimizer()->set_momentum(momentum);
  task.mutable_train()->add_model_sets("server_control");
  task.mutable_train()->add_model_sets("client_control");
  const TensorSet model = ScriptedCoordinator({}, shared_).model();
  TensorSet sets;
  for (const auto& [set, value] : {std::pair<std::string, float>{"server_control", 0.001f}, {"client_control", -0.002f}}) {
    for (const NamedTensor& t : model) sets.push_back({set + "/" + t.name, t.shape, std::vector<float>(t.values.size(), value)});
  }
  Start({task}, sets);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  ASSERT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.local_steps(), 16u);  // 512 samples in batches of 32, one epoch
  const double a = FedNovaNormalizer(16, static_cast<float>(momentum)).value();  // the trainer's momentum is a float
  EXPECT_DOUBLE_EQ(upload.step_normalizer(), a);
  ASSERT_EQ(upload.sets_size(), 2);
  EXPECT_EQ(upload.sets(0).name(), "delta");
  EXPECT_EQ(upload.sets(1).name(), "control_delta");
  const TensorSet tensors = Uploaded(1);
  ASSERT_EQ(tensors.size(), 2 * model.size());
  const double steps_lr = 16 * 0.01;
  double largest_delta = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    const NamedTensor& delta = tensors[i];
    const NamedTensor& control = tensors[model.size() + i];
    ASSERT_EQ(control.name, model[i].name);
    for (size_t j = 0; j < delta.values.size(); ++j) {
      largest_delta = std::max(largest_delta, std::fabs(double(delta.values[j])));
      ASSERT_NEAR(control.values[j], -0.001 - delta.values[j] / steps_lr, 1e-5) << control.name << " " << j;
    }
  }
  EXPECT_GT(largest_delta, 0.0) << "the worker did not train";
  // The download was allowed the model and its two sets, counted from the job, and no more.
  uint64_t model_bytes = 0;
  for (const NamedTensor& t : model) model_bytes += t.ByteSize();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->download_bounds, std::vector<uint64_t>{3 * model_bytes});
}

namespace {

TEST_F(AgentTest, AScaffoldRoundDownloadsTheVariatesAndUploadsTheirChange) { ExpectScaffoldUpload(0.0); }

TEST_F(AgentTest, AScaffoldRoundUnderMomentumDividesByTheStepsTaken) {
  ExpectScaffoldUpload(0.9);  // K = 16 (a_i = 86.68 is reported for FedNova, not used)
}

// A model's buffers (a batch norm's running statistics) have no variate: the coordinator keeps
// theirs at zero and ignores their entries, so the worker sends zeros there (the set keeps the
// model's layout), and the parameters' change as before.
TEST_F(AgentTest, AScaffoldRoundSendsNoVariateChangeForTheModelsBuffers) {
  v1::JobSpec spec = TinyJob();
  spec.set_strategy("scaffold");
  v1::ModelSpec& declared = *spec.mutable_model();
  declared.clear_hidden();
  declared.set_name("declared");
  v1::LayerSpec* conv = declared.add_layers();
  conv->set_type("conv2d");
  conv->set_out(2);
  conv->set_kernel(3);
  conv->set_padding(1);
  for (const char* type : {"batch_norm", "relu", "max_pool", "flatten", "linear"}) declared.add_layers()->set_type(type);
  shared_->model_job = spec;
  v1::Task task = Train(1, 1);
  *task.mutable_train()->mutable_spec() = spec;
  task.mutable_train()->add_model_sets("server_control");
  task.mutable_train()->add_model_sets("client_control");
  const TensorSet model = ScriptedCoordinator({}, shared_).model();
  TensorSet sets;
  for (const char* set : {"server_control", "client_control"}) {
    for (const NamedTensor& t : model) sets.push_back({std::string(set) + "/" + t.name, t.shape, std::vector<float>(t.values.size(), 0.0f)});
  }
  std::set<std::string> buffers;
  {
    auto device = CreateDevice("cpu");
    auto made = CreateModel(wire::ToModelConfig(spec), device->get());
    ASSERT_TRUE(made.ok()) << made.status().ToString();
    for (const ParameterView& view : (*made)->parameter_views()) {
      if (!view.trainable) buffers.insert(view.name);
    }
  }
  ASSERT_FALSE(buffers.empty()) << "the model has no buffers to test with";
  Start({task}, sets);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  ASSERT_TRUE(upload.failure().empty()) << upload.failure();
  const TensorSet tensors = Uploaded(1);
  ASSERT_EQ(tensors.size(), 2 * model.size()) << "the control change lost the model's layout";
  size_t buffers_moved = 0;
  double largest_parameter_change = 0;
  for (size_t i = 0; i < model.size(); ++i) {
    const NamedTensor& delta = tensors[i];
    const NamedTensor& control = tensors[model.size() + i];
    ASSERT_EQ(control.name, model[i].name);
    ASSERT_EQ(control.values.size(), model[i].values.size());
    if (buffers.count(control.name)) {
      // The running statistics moved in training: before, their change over K lr went here.
      for (float v : delta.values) buffers_moved += v != 0.0f;
      for (float v : control.values) EXPECT_EQ(v, 0.0f) << control.name;
    } else {
      for (float v : control.values) largest_parameter_change = std::max(largest_parameter_change, std::fabs(double(v)));
    }
  }
  EXPECT_GT(buffers_moved, 0u) << "the running statistics did not move";
  EXPECT_GT(largest_parameter_change, 0.0) << "the parameters' variate change is missing";
}

TEST_F(AgentTest, AScaffoldRoundWithoutTheVariatesIsReportedAsAFailure) {
  v1::Task task = Train(1, 1);
  task.mutable_train()->mutable_spec()->set_strategy("scaffold");
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_NE(upload.failure().find("must carry the sets 'server_control' and 'client_control'"), std::string::npos)
      << upload.failure();
}

// A task naming more sets than any strategy sends is refused before anything is downloaded.
TEST_F(AgentTest, ATaskNamingTooManyModelSetsIsReportedAsAFailure) {
  v1::Task task = Train(1, 1);
  for (int i = 0; i < 9; ++i) task.mutable_train()->add_model_sets("set" + std::to_string(i));
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_NE(upload.failure().find("the task names 9 model sets, expected at most 8"), std::string::npos)
      << upload.failure();
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 0);
}

// The sets' count is checked before their names: each name was compared with every one before
// it, so a task of a few hundred thousand sets held the task thread for minutes before the
// count refused it. Here the last name is not a name, which the comparisons reached first.
TEST_F(AgentTest, AModelSetsCountIsCheckedBeforeTheirNames) {
  v1::Task task = Train(1, 1);
  for (int i = 0; i < 9999; ++i) task.mutable_train()->add_model_sets("set" + std::to_string(i));
  task.mutable_train()->add_model_sets("not a name");
  Start({task});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_NE(upload.failure().find("the task names 10000 model sets, expected at most 8"), std::string::npos)
      << upload.failure();
}

// Round 1 for this worker as rank 0 of a two-member cohort whose other member never comes.
v1::Task LoneCohortTask(int64_t deadline_unix_ms) {
  v1::Task task = Train(1, 1);
  v1::TrainTask* train = task.mutable_train();
  train->set_cohort("site");
  train->set_cohort_rank(0);
  train->set_cohort_size(2);
  train->set_collective_backend("p2p");
  train->set_rendezvous_prefix("rendezvous/job-1/1/1/site/");
  train->set_deadline_unix_ms(deadline_unix_ms);
  return task;
}

// The rendezvous waits for the missing member as long as --cohort-timeout-s says, and the
// failure the coordinator is told names that bound.
TEST_F(AgentTest, ACohortRendezvousGivesUpAtTheCohortTimeout) {
  shared_->store = std::make_shared<collectives::HashStore>();
  WorkerOptions options;
  options.cohort = "site";
  options.cohort_timeout_s = 1;
  Start({LoneCohortTask(0)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("DEADLINE_EXCEEDED", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("cohort 'site' rendezvous, waiting up to 1000 ms, --cohort-timeout-s"),
            std::string::npos)
      << upload.failure();
}

// With the default cohort timeout (30 s), a round whose deadline is a second away waits for
// its missing member no longer than the round lasts.
TEST_F(AgentTest, ACohortRendezvousEndsAtTheRoundsDeadline) {
  shared_->store = std::make_shared<collectives::HashStore>();
  WorkerOptions options;
  options.cohort = "site";
  const int64_t now_unix_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  Start({LoneCohortTask(now_unix_ms + 1000)}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("DEADLINE_EXCEEDED", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("cohort 'site' rendezvous, waiting up to "), std::string::npos) << upload.failure();
  EXPECT_NE(upload.failure().find(" ms, the time left to the round's deadline"), std::string::npos)
      << upload.failure();
}

// A member cancelled as it meets its cohort stops waiting for the others: it waited out
// --cohort-timeout-s (here 150 s, up to a week) for a leader whose round was cancelled too,
// and the worker's next task waited with it.
TEST_F(AgentTest, ACancelEndsAMembersWaitForItsCohort) {
  shared_->store = std::make_shared<collectives::HashStore>();
  shared_->before_download = [this](const v1::DownloadModelRequest& request) {
    if (request.job_id() == "job-1") {
      EXPECT_TRUE(Deliver(Cancel(1, 1)));
    }
    return Status::Ok();
  };
  WorkerOptions options;
  options.cohort = "site";
  options.cohort_timeout_s = 150;
  v1::Task member = LoneCohortTask(0);
  member.mutable_train()->set_cohort_rank(1);  // waits for the leader's address
  Start({member, Train(1, 1, "job-z")}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-z"));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  for (const v1::UpdateHeader& h : Uploads()) EXPECT_NE(h.job_id(), "job-1") << h.failure();
}

// A member that leaves its cohort mid-round (its own training failed; it reports nothing, its
// leader does) closes its connections, and the leader's allreduce ends UNAVAILABLE naming it.
// The failure names the job, the round, the cohort, both ranks and the step.
// The leader took that code for a lost coordinator and reported nothing either, so the round
// waited out its deadline for a cohort whose members were all idle.
TEST_F(AgentTest, ALeaderReportsAPeerThatLeftTheCohortMidRound) {
  shared_->store = std::make_shared<collectives::HashStore>();
  WorkerOptions options;
  options.cohort = "site";
  Start({LoneCohortTask(0)}, {}, options);
  collectives::CommunicatorOptions peer;
  peer.backend = "p2p";
  peer.rank = 1;
  peer.size = 2;
  peer.prefix = "rendezvous/job-1/1/1/site/";
  peer.timeout_ms = 60000;
  auto joined = collectives::CreateCommunicator(peer, shared_->store);
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  joined->reset();  // rank 1 leaves before its first allreduce
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("UNAVAILABLE", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("job job-1 round 1: cohort 'site' rank 0 of 2: cohort gradient allreduce"),
            std::string::npos)
      << upload.failure();
  // The peer's close reads as an end of stream or, when it left data unread, as a reset.
  const std::string& failure = upload.failure();
  EXPECT_TRUE(failure.find("rank 0: rank 1 closed the connection") != std::string::npos ||
              failure.find("rank 0: connection to rank 1 failed") != std::string::npos)
      << failure;
}

// Gloo turns every rendezvous failure into UNAVAILABLE (here the store's refusal), which the
// leader took for a lost coordinator: it reported nothing and the round waited out its deadline.
TEST_F(AgentTest, ALeaderReportsAGlooRendezvousThatFailed) {
  WorkerOptions options;
  options.cohort = "site";
  v1::Task task = LoneCohortTask(0);
  task.mutable_train()->set_collective_backend("gloo");
  Start({task}, {}, options);  // no store: every store call fails
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("UNAVAILABLE: job job-1 round 1: cohort 'site' rendezvous", 0), 0u)
      << upload.failure();
  EXPECT_NE(upload.failure().find("gloo rank 0 rendezvous failed"), std::string::npos) << upload.failure();
}

// --pace-real-time reaches the emulated device the worker opens, which says so when it joins.
TEST_F(AgentTest, PacingReachesTheEmulatedDevice) {
  WorkerOptions options;
  options.device = "emu:edge-npu";
  options.pace_real_time = true;
  Start({}, {}, options);
  const v1::JoinRequest join = Joined();
  EXPECT_EQ(join.device().kind(), "emu:edge-npu");
  EXPECT_EQ(join.device().properties().at("pace_real_time"), "true");
}

TEST_F(AgentTest, AnEmulatedDeviceIsNotPacedByDefault) {
  WorkerOptions options;
  options.device = "emu:edge-npu";
  Start({}, {}, options);
  const v1::JoinRequest join = Joined();
  EXPECT_EQ(join.device().properties().at("pace_real_time"), "false");
}

// [compression]: the delta travels in the job's encoding. Top-k sends k = ceil(fraction x n)
// entries of each tensor (every other one reads back as 0) and at most about 8/4 x fraction
// of float32's bytes; int8 a quarter of them plus a scale per tensor.
TEST_F(AgentTest, TheDeltaTravelsInTheJobsEncoding) {
  shared_->topk_fraction = 0.1;
  v1::Task topk = Train(1, 1);
  topk.mutable_train()->mutable_spec()->mutable_compression()->set_encoding(v1::ENCODING_TOPK);
  topk.mutable_train()->mutable_spec()->mutable_compression()->set_fraction(0.1);
  v1::Task int8 = Train(1, 1, "job-2");
  int8.mutable_train()->mutable_spec()->mutable_compression()->set_encoding(v1::ENCODING_INT8);
  Start({topk, int8});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  const TensorSet model = ScriptedCoordinator({}, shared_).model();
  uint64_t model_bytes = 0, elements = 0;
  for (const NamedTensor& t : model) {
    model_bytes += t.ByteSize();
    elements += t.values.size();
  }
  std::lock_guard<std::mutex> lock(shared_->mu);
  ASSERT_EQ(shared_->uploads.size(), 2u);
  ASSERT_EQ(shared_->uploads[0].sets_size(), 1);
  EXPECT_EQ(shared_->uploads[0].sets(0).encoding(), v1::ENCODING_TOPK);
  const TensorSet& sparse = shared_->uploaded[0];
  ASSERT_EQ(sparse.size(), model.size());
  uint64_t sent = 0;
  for (const NamedTensor& t : sparse) {
    const auto nonzero = std::count_if(t.values.begin(), t.values.end(), [](float v) { return v != 0; });
    EXPECT_LE(static_cast<uint64_t>(nonzero), TopKCount(t.values.size(), 0.1)) << t.name;
    EXPECT_GT(nonzero, 0) << t.name << ": the worker sent nothing of it";
    sent += TopKCount(t.values.size(), 0.1);
  }
  EXPECT_EQ(shared_->uploaded_bytes[0], sent * 8);
  EXPECT_LT(shared_->uploaded_bytes[0], model_bytes / 4);  // 10% of the entries at 8 bytes each, plus rounding up
  EXPECT_EQ(shared_->uploads[1].sets(0).encoding(), v1::ENCODING_INT8);
  EXPECT_EQ(shared_->uploaded_bytes[1], elements + 4 * model.size());
  double largest = 0;
  for (const NamedTensor& t : shared_->uploaded[1]) {
    for (float v : t.values) largest = std::max(largest, std::fabs(double(v)));
  }
  EXPECT_GT(largest, 0.0) << "the int8 delta reads back as zero";
}

}  // namespace
}  // namespace tessera::worker
