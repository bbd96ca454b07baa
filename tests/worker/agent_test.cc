// The worker agent against a scripted coordinator (a fake CoordinatorClient): what it does
// with the tasks, cancels and verdicts it is sent, on real data and a real CPU device.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <vector>

#include "collectives/store/hash_store.h"
#include "core/model/model.h"
#include "core/train/client_algorithms.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "proto/tensor_transfer.h"
#include "proto/update_assembler.h"
#include "worker/agent.h"

namespace tessera::worker {
namespace {

constexpr auto kWait = std::chrono::seconds(120);

v1::JobSpec TinyJob() {
  v1::JobSpec spec;
  spec.set_name("tiny");
  spec.mutable_model()->set_name("mlp");
  spec.mutable_model()->add_hidden(16);
  spec.mutable_data()->set_dataset("fashion-mnist");
  spec.mutable_data()->set_max_train_samples(512);
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  spec.mutable_data()->mutable_partition()->set_parties(1);
  spec.set_strategy("fedavg");
  spec.set_rounds(3);
  spec.set_clients_per_round(1);
  spec.set_min_clients(1);
  spec.set_round_deadline_ms(600000);
  spec.set_local_epochs(1);
  spec.set_batch_size(32);
  spec.mutable_optimizer()->set_name("sgd");
  spec.mutable_optimizer()->set_learning_rate(0.01);
  spec.set_seed(5);
  return spec;
}

v1::Task Train(uint32_t round, uint32_t attempt, const std::string& job = "job-1") {
  v1::Task task;
  auto* train = task.mutable_train();
  train->set_job_id(job);
  train->set_round(round);
  train->set_attempt(attempt);
  train->set_model_version(round - 1);
  *train->mutable_spec() = TinyJob();
  return task;
}

v1::Task Cancel(uint32_t round, uint32_t attempt) {
  v1::Task task;
  task.mutable_cancel()->set_job_id("job-1");
  task.mutable_cancel()->set_round(round);
  task.mutable_cancel()->set_attempt(attempt);
  task.mutable_cancel()->set_reason("the round's deadline passed");
  return task;
}

// A coordinator that hands out a script of tasks on the first task channel, serves the
// model, and records every upload.
class ScriptedCoordinator final : public CoordinatorClient {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<v1::UpdateHeader> uploads;
    std::string refuse_reason;  // when set, every update is refused with it
    std::vector<TensorSet> uploaded;  // each upload's tensors decoded, every set's in order, as `uploads`
    std::vector<uint64_t> uploaded_bytes;  // each upload's bytes as sent
    double topk_fraction = 0;              // the job's, to read top-k sets
    std::vector<v1::JoinRequest> joins;
    bool numbered_sessions = false;  // each join gets a new session, "session-N"; else "session-1"
    // Called before each join is answered, outside the lock, with its number (from 1).
    std::function<void(int)> before_join;
    int channels = 0;  // task channels opened
    bool cancelled = false;
    int downloads = 0;
    std::vector<uint64_t> download_bounds;  // what each download was allowed to hold
    // Called before each download is served, outside the lock; a status that is not OK is
    // that download's answer.
    std::function<Status(const v1::DownloadModelRequest&)> before_download;
    // When set, the first task channel ends after its script (the coordinator went away) and
    // the next one gets these tasks.
    std::optional<std::vector<v1::Task>> next_session;
    // The rendezvous store a cohort's members meet in; without it the store RPCs fail.
    std::shared_ptr<collectives::HashStore> store;
  };

  // `download_sets`: tensors the model download carries after the model (a task's model_sets).
  ScriptedCoordinator(std::vector<v1::Task> script, std::shared_ptr<Shared> shared, TensorSet download_sets = {})
      : script_(std::move(script)), shared_(std::move(shared)), download_sets_(std::move(download_sets)) {
    auto device = CreateDevice("cpu");
    auto model = CreateModel(wire::ToModelConfig(TinyJob()), device->get());
    model_ = (*model)->GetState().value();
  }

  const TensorSet& model() const { return model_; }

  Result<v1::JoinResponse> Join(const v1::JoinRequest& request) override {
    int number = 0;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      number = static_cast<int>(shared_->joins.size()) + 1;
    }
    if (shared_->before_join) shared_->before_join(number);
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->joins.push_back(request);
      shared_->cv.notify_all();
    }
    v1::JoinResponse response;
    response.set_worker_id(request.name());
    response.set_session("session-" + std::to_string(shared_->numbered_sessions ? number : 1));
    response.set_heartbeat_interval_ms(200);
    response.set_heartbeat_timeout_ms(600000);
    return response;
  }
  Status Heartbeat(const v1::HeartbeatRequest&) override { return Status::Ok(); }

  Status RunTaskChannel(const v1::TaskChannelRequest&, const std::function<void(const v1::Task&)>& on_task) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      ++shared_->channels;
      shared_->cv.notify_all();
    }
    for (const auto& task : script_) on_task(task);
    script_.clear();  // a reconnect gets nothing new
    std::unique_lock<std::mutex> lock(shared_->mu);
    if (shared_->next_session) {
      script_ = std::move(*shared_->next_session);
      shared_->next_session.reset();
      return UnavailableError("the coordinator went away");
    }
    shared_->cv.wait(lock, [&] { return shared_->cancelled; });
    shared_->cancelled = false;
    return CancelledError("task channel cancelled");
  }
  void CancelTaskChannel() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->cancelled = true;
    shared_->cv.notify_all();
  }
  Result<TensorSet> DownloadModel(const v1::DownloadModelRequest& request, uint64_t max_bytes) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      ++shared_->downloads;
      shared_->download_bounds.push_back(max_bytes);
      shared_->cv.notify_all();
    }
    if (shared_->before_download) RETURN_IF_ERROR(shared_->before_download(request));
    TensorSet download = model_;
    download.insert(download.end(), download_sets_.begin(), download_sets_.end());
    return download;
  }
  // Read back as the coordinator reads it (proto/update_assembler.h).
  Result<v1::UploadResult> UploadUpdate(const v1::UpdateHeader& header, std::shared_ptr<const wire::UpdateBytes> shared,
                                        uint32_t chunk_bytes) override {
    const wire::UpdateBytes& tensors = *shared;
    std::lock_guard<std::mutex> lock(shared_->mu);
    TensorSet decoded;
    uint64_t bytes = 0;
    if (header.failure().empty()) {
      ASSIGN_OR_RETURN(auto sets, wire::UpdateSets(header, "upload"));
      wire::UpdateAssembler assembler("upload", 1 << 30, shared_->topk_fraction);
      RETURN_IF_ERROR(assembler.Start(sets));
      RETURN_IF_ERROR(wire::ForEachChunk(tensors, chunk_bytes, [&](const v1::TensorChunk& c) { return assembler.Add(c); }));
      ASSIGN_OR_RETURN(auto by_name, assembler.Finish());
      for (const auto& set : sets) {
        for (NamedTensor& t : by_name[std::string(set.name)]) decoded.push_back(std::move(t));
      }
      bytes = assembler.bytes_received();
    }
    shared_->uploads.push_back(header);
    shared_->uploaded.push_back(std::move(decoded));
    shared_->uploaded_bytes.push_back(bytes);
    shared_->cv.notify_all();
    v1::UploadResult result;
    result.set_accepted(shared_->refuse_reason.empty());
    result.set_reason(shared_->refuse_reason);
    return result;
  }
  Status StoreSet(const v1::StoreRequest& request) override {
    if (!shared_->store) return UnimplementedError("no store");
    return shared_->store->Set(request.key(), request.value());
  }
  Result<std::string> StoreGet(const v1::StoreRequest& request) override {
    if (!shared_->store) return UnimplementedError("no store");
    return shared_->store->Get(request.key(), std::chrono::milliseconds(request.wait_ms()));
  }
  Result<int64_t> StoreAdd(const v1::StoreRequest& request) override {
    if (!shared_->store) return UnimplementedError("no store");
    return shared_->store->Add(request.key(), request.delta());
  }

 private:
  std::vector<v1::Task> script_;
  std::shared_ptr<Shared> shared_;
  TensorSet download_sets_;
  TensorSet model_;
};

class AgentTest : public ::testing::Test {
 protected:
  void Start(std::vector<v1::Task> script, TensorSet download_sets = {}, WorkerOptions options = {}) {
    options.name = "w1";
    options.join_token = "token";
    agent_ = std::make_unique<WorkerAgent>(
        options, std::make_unique<ScriptedCoordinator>(std::move(script), shared_, std::move(download_sets)));
    thread_ = std::thread([this] { run_status_ = agent_->Run(); });
  }
  void TearDown() override {
    if (agent_) agent_->Stop();
    if (thread_.joinable()) thread_.join();
  }
  // Waits for an upload for (round, attempt); false after kWait.
  bool WaitForUpload(uint32_t round, uint32_t attempt, v1::UpdateHeader* out, const std::string& job = "job-1") {
    std::unique_lock<std::mutex> lock(shared_->mu);
    return shared_->cv.wait_for(lock, kWait, [&] {
      for (const auto& h : shared_->uploads) {
        if (h.job_id() == job && h.round() == round && h.attempt() == attempt) {
          *out = h;
          return true;
        }
      }
      return false;
    });
  }
  std::vector<v1::UpdateHeader> Uploads() {
    std::lock_guard<std::mutex> lock(shared_->mu);
    return shared_->uploads;
  }
  // The tensors of the first upload for `round`.
  TensorSet Uploaded(uint32_t round) {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (size_t i = 0; i < shared_->uploads.size(); ++i) {
      if (shared_->uploads[i].round() == round) return shared_->uploaded[i];
    }
    return {};
  }
  // Waits until the agent has joined; its join request.
  v1::JoinRequest Joined() {
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->cv.wait_for(lock, kWait, [&] { return !shared_->joins.empty(); });
    return shared_->joins.empty() ? v1::JoinRequest() : shared_->joins.front();
  }

  void ExpectScaffoldUpload(double momentum);

  std::shared_ptr<ScriptedCoordinator::Shared> shared_ = std::make_shared<ScriptedCoordinator::Shared>();
  std::unique_ptr<WorkerAgent> agent_;
  std::thread thread_;
  Status run_status_;
};

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
// otherwise, bit for bit. A compressed job's update stays a delta.
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
  Start({delta, trained, int8});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-3"));
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

TEST_F(AgentTest, AScaffoldRoundDownloadsTheVariatesAndUploadsTheirChange) { ExpectScaffoldUpload(0.0); }

TEST_F(AgentTest, AScaffoldRoundUnderMomentumDividesByTheStepsTaken) {
  ExpectScaffoldUpload(0.9);  // K = 16 (a_i = 86.68 is reported for FedNova, not used)
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

// An emulated device profile written to a file; `memory_bytes` its capacity.
std::string WriteProfile(const std::string& file, const std::string& name, uint64_t memory_bytes) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / file).string();
  std::ofstream(path) << "[" << name << "]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 8.0\n"
                      << "memory_bandwidth_gbps = 100\nmemory_bytes = " << memory_bytes << "\nhost_link_gbps = 4\n"
                      << "power_watts = 20\nprecision = \"fp32\"\nnative_ops = [\"all\"]\n";
  return path;
}

// A device that fails (out of memory, a driver error) sends the round to the job's fallback
// device class. A job names a class, never a file: "emu:FILE.toml" would have the worker read
// a file the job chose. The round is reported failed instead, and a class still serves.
TEST_F(AgentTest, AJobsFallbackDeviceIsNeverAProfileFileOnTheWorker) {
  WorkerOptions options;
  options.device = "emu:" + WriteProfile("agent_test_tiny.toml", "tiny-npu", 64 << 10);  // the model does not fit
  v1::Task named_file = Train(1, 1);
  named_file.mutable_train()->mutable_spec()->set_fallback_device(
      "emu:" + WriteProfile("agent_test_job_named.toml", "job-npu", uint64_t{1} << 30));
  v1::Task named_class = Train(1, 1, "job-2");
  named_class.mutable_train()->mutable_spec()->set_fallback_device("emu:generic");
  Start({named_file, named_class}, {}, options);
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("RESOURCE_EXHAUSTED", 0), 0u) << upload.failure();
  EXPECT_NE(upload.failure().find("the job's fallback device 'emu:"), std::string::npos) << upload.failure();
  EXPECT_NE(upload.failure().find("is not a device class of this worker"), std::string::npos) << upload.failure();
  ASSERT_TRUE(WaitForUpload(1, 1, &upload, "job-2"));
  EXPECT_TRUE(upload.failure().empty()) << upload.failure();
  EXPECT_EQ(upload.samples(), 512u);
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->downloads, 3) << "job-1 trained again on the file it named";
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
  Start({Train(1, 1)});
  v1::UpdateHeader upload;
  ASSERT_TRUE(WaitForUpload(1, 1, &upload));
  EXPECT_EQ(upload.failure().rfind("DATA_LOSS", 0), 0u) << upload.failure();
  EXPECT_EQ(upload.session(), "session-1");
  std::lock_guard<std::mutex> lock(shared_->mu);
  EXPECT_EQ(shared_->joins.size(), 2u);
}

// Everything logged while it lives.
class CapturedLog {
 public:
  CapturedLog() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(stream_)) {
    spdlog::default_logger()->sinks().push_back(sink_);
  }
  ~CapturedLog() {
    auto& sinks = spdlog::default_logger()->sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() {
    spdlog::default_logger()->flush();
    return stream_.str();
  }

 private:
  std::ostringstream stream_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

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

}  // namespace
}  // namespace tessera::worker
