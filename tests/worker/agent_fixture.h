// The worker agent against a scripted coordinator (a fake CoordinatorClient), shared by the
// agent's tests: a tiny job on real data and a real CPU device, the scripted coordinator that
// hands out tasks, cancels and verdicts, and the fixture that runs an agent against it.
#pragma once

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
#include <set>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "collectives/store/hash_store.h"
#include "core/model/model.h"
#include "core/train/client_algorithms.h"
#include "device/registry.h"
#include "proto/job_mapping.h"
#include "proto/tensor_transfer.h"
#include "proto/update_assembler.h"
#include "worker/agent.h"

// Not in an anonymous namespace: both test files must name one fixture class (GoogleTest
// refuses a suite whose tests use two).
namespace tessera::worker {

constexpr auto kWait = std::chrono::seconds(120);

// An emulated device profile written to a file; `memory_bytes` its capacity.
inline std::string WriteProfile(const std::string& file, const std::string& name, uint64_t memory_bytes) {
  const std::string path = (std::filesystem::path(::testing::TempDir()) / file).string();
  std::ofstream(path) << "[" << name << "]\npeak_tflops_fp32 = 1.0\npeak_tflops_fp16 = 8.0\n"
                      << "memory_bandwidth_gbps = 100\nmemory_bytes = " << memory_bytes << "\nhost_link_gbps = 4\n"
                      << "power_watts = 20\nprecision = \"fp32\"\nnative_ops = [\"all\"]\n";
  return path;
}

inline v1::JobSpec TinyJob() {
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

inline v1::Task Train(uint32_t round, uint32_t attempt, const std::string& job = "job-1") {
  v1::Task task;
  auto* train = task.mutable_train();
  train->set_job_id(job);
  train->set_round(round);
  train->set_attempt(attempt);
  train->set_model_version(round - 1);
  *train->mutable_spec() = TinyJob();
  return task;
}

inline v1::Task Cancel(uint32_t round, uint32_t attempt) {
  v1::Task task;
  task.mutable_cancel()->set_job_id("job-1");
  task.mutable_cancel()->set_round(round);
  task.mutable_cancel()->set_attempt(attempt);
  task.mutable_cancel()->set_reason("the round's deadline passed");
  return task;
}

// A task that asks nothing of the worker (an accepted update's verdict): put after a train task
// in a script, its before_task hook can wait until the worker has taken that task in hand
// (the tasks still queued when a session ends are dropped).
inline v1::Task AcceptedVerdict() {
  v1::Task task;
  task.mutable_verdict()->set_job_id("job-1");
  task.mutable_verdict()->set_accepted(true);
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
    std::vector<int64_t> upload_deadlines;  // the task deadline each upload was bounded by, as `uploads`
    double topk_fraction = 0;              // the job's, to read top-k sets
    std::vector<v1::JoinRequest> joins;
    bool numbered_sessions = false;  // each join gets a new session, "session-N"; else "session-1"
    // Called before each join is answered, outside the lock, with its number (from 1).
    std::function<void(int)> before_join;
    int channels = 0;  // task channels opened
    int scripts_delivered = 0;  // task channels that have handed over their whole script
    // Called before each task of the script is handed over, outside the lock, with its index.
    std::function<void(size_t)> before_task;
    bool cancelled = false;
    int downloads = 0;
    std::vector<uint64_t> download_bounds;  // what each download was allowed to hold
    // Called before each download is served, outside the lock; a status that is not OK is
    // that download's answer.
    std::function<Status(const v1::DownloadModelRequest&)> before_download;
    // When set, the first task channel ends after its script with `first_channel_end` (the
    // coordinator went away) and the next one gets these tasks.
    std::optional<std::vector<v1::Task>> next_session;
    Status first_channel_end = UnavailableError("the coordinator went away");
    Status join_refusal;  // when not OK, every join is answered with it
    // Each heartbeat's answer, by its number (from 1); without it every beat is OK.
    std::function<Status(int)> heartbeat;
    int heartbeats = 0;
    // Tasks the open channel hands over after its script, in order (AgentTest::Deliver), and
    // how many it has handed over.
    std::deque<v1::Task> later;
    int later_delivered = 0;
    // The rendezvous store a cohort's members meet in; without it the store RPCs fail.
    std::shared_ptr<collectives::HashStore> store;
    // Called as each upload is under way (its header sent, its chunks not yet), outside the
    // lock, with its header.
    std::function<void(const v1::UpdateHeader&)> during_upload;
    // CancelUpload's calls in this session (a join forgets them, as the gRPC client's), as
    // (job, round, attempt), in order.
    std::vector<std::tuple<std::string, uint32_t, uint32_t>> upload_cancels;
    int uploads_cancelled = 0;  // uploads ended by a CancelUpload of their task
    // The job whose model the coordinator serves (set before the coordinator is made), and a
    // change made to that model's initial values before it is served (unset: none).
    v1::JobSpec model_job = TinyJob();
    std::function<void(TensorSet&)> edit_model;
  };

  // `download_sets`: tensors the model download carries after the model (a task's model_sets).
  ScriptedCoordinator(std::vector<v1::Task> script, std::shared_ptr<Shared> shared, TensorSet download_sets = {})
      : script_(std::move(script)), shared_(std::move(shared)), download_sets_(std::move(download_sets)) {
    auto device = CreateDevice("cpu");
    auto model = CreateModel(wire::ToModelConfig(shared_->model_job), device->get());
    model_ = (*model)->GetState().value();
    if (shared_->edit_model) shared_->edit_model(model_);
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
      shared_->upload_cancels.clear();
      shared_->cv.notify_all();
      if (!shared_->join_refusal.ok()) return shared_->join_refusal;
    }
    v1::JoinResponse response;
    response.set_worker_id(request.name());
    response.set_session("session-" + std::to_string(shared_->numbered_sessions ? number : 1));
    response.set_heartbeat_interval_ms(200);
    response.set_heartbeat_timeout_ms(600000);
    return response;
  }
  Status Heartbeat(const v1::HeartbeatRequest&) override {
    int number = 0;
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      number = ++shared_->heartbeats;
      shared_->cv.notify_all();
    }
    return shared_->heartbeat ? shared_->heartbeat(number) : Status::Ok();
  }

  Status RunTaskChannel(const v1::TaskChannelRequest&, const std::function<void(const v1::Task&)>& on_task) override {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      ++shared_->channels;
      shared_->cv.notify_all();
    }
    for (size_t i = 0; i < script_.size(); ++i) {
      if (shared_->before_task) shared_->before_task(i);
      on_task(script_[i]);
    }
    script_.clear();  // a reconnect gets nothing new
    std::unique_lock<std::mutex> lock(shared_->mu);
    ++shared_->scripts_delivered;
    shared_->cv.notify_all();
    if (shared_->next_session) {
      script_ = std::move(*shared_->next_session);
      shared_->next_session.reset();
      return shared_->first_channel_end;
    }
    while (true) {
      shared_->cv.wait(lock, [&] { return shared_->cancelled || !shared_->later.empty(); });
      if (shared_->cancelled) break;
      const v1::Task task = std::move(shared_->later.front());
      shared_->later.pop_front();
      lock.unlock();
      on_task(task);
      lock.lock();
      ++shared_->later_delivered;
      shared_->cv.notify_all();
    }
    shared_->cancelled = false;
    return CancelledError("task channel cancelled");
  }
  void CancelTaskChannel() override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->cancelled = true;
    shared_->cv.notify_all();
  }
  Result<TensorSet> DownloadModel(const v1::DownloadModelRequest& request, uint64_t max_bytes, uint32_t, uint32_t,
                                  int64_t) override {
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
  // An upload whose task a CancelUpload names (attempt 0: any attempt), by the time its
  // during_upload hook returns, ends CANCELLED and is not recorded, as the gRPC client's.
  Result<v1::UploadResult> UploadUpdate(const v1::UpdateHeader& header, std::shared_ptr<const wire::UpdateBytes> shared,
                                        uint32_t chunk_bytes, int64_t deadline_unix_ms) override {
    const wire::UpdateBytes& tensors = *shared;
    if (shared_->during_upload) shared_->during_upload(header);
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (const auto& [job, round, attempt] : shared_->upload_cancels) {
      if (job == header.job_id() && round == header.round() && (attempt == 0 || attempt == header.attempt())) {
        ++shared_->uploads_cancelled;
        shared_->cv.notify_all();
        return CancelledError("upload: the coordinator cancelled the task");
      }
    }
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
    shared_->upload_deadlines.push_back(deadline_unix_ms);
    shared_->uploaded.push_back(std::move(decoded));
    shared_->uploaded_bytes.push_back(bytes);
    shared_->cv.notify_all();
    v1::UploadResult result;
    result.set_accepted(shared_->refuse_reason.empty());
    result.set_reason(shared_->refuse_reason);
    return result;
  }
  void CancelUpload(const std::string& job_id, uint32_t round, uint32_t attempt) override {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->upload_cancels.emplace_back(job_id, round, attempt);
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
  // Defined in agent_session_test.cc: a log rate limit holds while `script` is delivered.
  void ExpectLoggedAtABoundedRate(std::vector<v1::Task> script, const std::string& marker,
                                  const std::string& first_line, int64_t burst,
                                  std::chrono::steady_clock::duration window);
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
  // Hands `task` over on the open task channel, after its script; returns once the agent has
  // taken it in (false after kWait). Not from the channel's own thread.
  bool Deliver(v1::Task task) {
    std::unique_lock<std::mutex> lock(shared_->mu);
    shared_->later.push_back(std::move(task));
    const int delivered = shared_->later_delivered + static_cast<int>(shared_->later.size());
    shared_->cv.notify_all();
    return shared_->cv.wait_for(lock, kWait, [&] { return shared_->later_delivered >= delivered; });
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

}  // namespace tessera::worker
