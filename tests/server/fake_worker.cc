#include "fake_worker.h"

#include <algorithm>
#include <atomic>
#include <random>

#include "proto/tensor_transfer.h"

namespace tessera::server {

void Gate::Open() {
  std::lock_guard<std::mutex> lock(mu_);
  open_ = true;
  cv_.notify_all();
}

void Gate::Pass() {
  std::unique_lock<std::mutex> lock(mu_);
  reached_ = true;
  cv_.notify_all();
  cv_.wait(lock, [&] { return open_; });
}

bool Gate::AwaitReached(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, limit, [&] { return reached_; });
}

bool Gate::reached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reached_;
}

FakeAction FakeAction::Upload(float fill) {
  FakeAction action;
  action.delta = [fill](const TensorSet& global) {
    TensorSet delta = global;
    for (auto& t : delta) std::fill(t.values.begin(), t.values.end(), fill);
    return delta;
  };
  return action;
}

FakeAction FakeAction::UploadUnchanged() { return Upload(0.0f); }

FakeAction FakeAction::UploadRandom(uint64_t seed, float scale) {
  FakeAction action;
  action.delta = [seed, scale](const TensorSet& global) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> uniform(-scale, scale);
    TensorSet delta = global;
    for (auto& t : delta) {
      for (float& v : t.values) v = uniform(rng);
    }
    return delta;
  };
  return action;
}

FakeAction FakeAction::UploadGiven(TensorSet delta) {
  FakeAction action;
  action.delta = [delta = std::move(delta)](const TensorSet&) { return delta; };
  return action;
}

FakeAction FakeAction::Fail(std::string reason) {
  FakeAction action;
  action.kind = Kind::kFail;
  action.failure = std::move(reason);
  return action;
}

FakeAction FakeAction::Hang() {
  FakeAction action;
  action.kind = Kind::kHang;
  return action;
}

FakeAction FakeAction::Vanish() {
  FakeAction action;
  action.kind = Kind::kVanish;
  return action;
}

FakeAction FakeAction::UploadLate(std::shared_ptr<Gate> gate, float fill) {
  FakeAction action = Upload(fill);
  action.before_admit = std::move(gate);
  return action;
}

FakeAction FakeAction::MalformedManifest() {
  FakeAction action = Upload();
  action.kind = Kind::kMalformedManifest;
  return action;
}

FakeAction& FakeAction::WithSamples(uint64_t n) {
  samples = n;
  return *this;
}

FakeAction& FakeAction::WithTamper(std::function<void(v1::UpdateHeader*, TensorSet*)> change) {
  tamper = std::move(change);
  return *this;
}

FakeAction& FakeAction::StopBeforeSubmit(std::shared_ptr<Gate> gate) {
  before_submit = std::move(gate);
  return *this;
}

FakeAction& FakeAction::UploadToCurrentRunner() {
  upload_to_current_runner = true;
  return *this;
}

// One task channel of the worker, as the server end of a stream would be: the registry
// tells it when tasks are queued and when a newer channel replaced it.
class FakeWorker::Channel final : public TaskChannelSink {
 public:
  explicit Channel(std::weak_ptr<FakeWorker> worker) : worker_(std::move(worker)) {}
  void TasksQueued() override {
    if (superseded_) return;
    if (auto worker = worker_.lock()) {
      worker->PassDeliveryGate();
      worker->TasksQueued();
    }
  }
  void Superseded() override { superseded_ = true; }

 private:
  const std::weak_ptr<FakeWorker> worker_;
  std::atomic<bool> superseded_{false};
};

FakeWorker::FakeWorker(WorkerRegistry* registry, std::string name, Script script, RunnerLookup runner)
    : registry_(registry), name_(std::move(name)), script_(std::move(script)), runner_(std::move(runner)) {}

FakeWorker::~FakeWorker() { Stop(); }

Status FakeWorker::Start() {
  v1::JoinRequest join;
  join.set_name(name_);
  join.mutable_device()->set_kind("cpu");
  ASSIGN_OR_RETURN(v1::JoinResponse joined, registry_->Join(join));
  const uint64_t generation = registry_->Generation(name_);
  auto channel = std::make_shared<Channel>(weak_from_this());
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = generation;
    session_ = joined.session();
    channel_ = channel;
  }
  RETURN_IF_ERROR(registry_->OpenChannel(name_, generation, channel));
  reader_ = std::thread([this] { ReadLoop(); });
  return Status::Ok();
}

void FakeWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (auto& gate : gates_) gate->Open();
  }
  cv_.notify_all();
  if (reader_.joinable()) reader_.join();  // no trainer starts after this
  std::vector<std::thread> trainers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    trainers.swap(trainers_);
  }
  for (auto& trainer : trainers) trainer.join();
}

void FakeWorker::Vanish() {
  std::shared_ptr<Channel> channel;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    vanished_ = true;
    channel = channel_;
    generation = generation_;
  }
  registry_->CloseChannel(name_, generation, channel.get());
}

Status FakeWorker::Rejoin() {
  v1::JoinRequest join;
  join.set_name(name_);
  join.mutable_device()->set_kind("cpu");
  ASSIGN_OR_RETURN(v1::JoinResponse joined, registry_->Join(join));
  const uint64_t generation = registry_->Generation(name_);
  auto channel = std::make_shared<Channel>(weak_from_this());
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_ = generation;
    session_ = joined.session();
    channel_ = channel;
    vanished_ = false;
  }
  RETURN_IF_ERROR(registry_->OpenChannel(name_, generation, channel));
  TasksQueued();
  return Status::Ok();
}

Status FakeWorker::ReopenChannel() {
  auto channel = std::make_shared<Channel>(weak_from_this());
  std::shared_ptr<Channel> old;
  uint64_t generation = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    old = channel_;
    generation = generation_;
  }
  RETURN_IF_ERROR(registry_->OpenChannel(name_, generation, channel));
  {
    std::lock_guard<std::mutex> lock(mu_);
    channel_ = channel;
  }
  registry_->CloseChannel(name_, generation, old.get());  // the old stream's late close
  TasksQueued();
  return Status::Ok();
}

Status FakeWorker::Heartbeat() {
  std::string session;
  {
    std::lock_guard<std::mutex> lock(mu_);
    session = session_;
  }
  return registry_->Heartbeat(name_, session, "idle");
}

uint64_t FakeWorker::generation() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_;
}

void FakeWorker::HoldNextDelivery(std::shared_ptr<Gate> gate) {
  std::lock_guard<std::mutex> lock(mu_);
  gates_.push_back(gate);
  if (stop_) gate->Open();
  delivery_gate_ = std::move(gate);
}

void FakeWorker::PassDeliveryGate() {
  std::shared_ptr<Gate> gate;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gate.swap(delivery_gate_);
  }
  if (gate) gate->Pass();
}

void FakeWorker::TasksQueued() {
  std::lock_guard<std::mutex> lock(mu_);
  queued_ = true;
  cv_.notify_all();
}

void FakeWorker::ReadLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || queued_; });
    if (stop_) return;
    queued_ = false;
    while (!stop_ && !vanished_) {
      const uint64_t generation = generation_;
      lock.unlock();
      bool closed = false;
      std::optional<v1::Task> task = registry_->TakeTask(name_, generation, &closed);
      lock.lock();
      if (!task) break;
      received_.push_back(*task);
      cv_.notify_all();
      if (!task->has_train()) continue;
      FakeTurn turn;
      turn.task = task->train();
      turns_.push_back(turn);
      trainers_.emplace_back([this, index = turns_.size() - 1, train = task->train()] { Act(index, train); });
    }
  }
}

void FakeWorker::Record(size_t turn, const std::function<void(FakeTurn&)>& change) {
  std::lock_guard<std::mutex> lock(mu_);
  change(turns_[turn]);
  cv_.notify_all();
}

void FakeWorker::Act(size_t turn, v1::TrainTask task) {
  const FakeAction action = script_(task);
  {
    std::lock_guard<std::mutex> lock(mu_);
    turns_[turn].kind = action.kind;
    for (const auto& gate : {action.before_admit, action.before_submit}) {
      if (!gate) continue;
      gates_.push_back(gate);
      if (stop_) gate->Open();
    }
  }
  switch (action.kind) {
    case FakeAction::Kind::kHang:
      return;
    case FakeAction::Kind::kVanish:
      Vanish();
      Record(turn, [](FakeTurn& t) { t.finished = true; });
      return;
    default:
      break;
  }
  std::shared_ptr<JobRunner> runner = runner_();
  if (!runner) {
    Record(turn, [&](FakeTurn& t) {
      t.downloaded = NotFoundError("job '" + task.job_id() + "' is not running");
      t.finished = true;
    });
    return;
  }
  v1::UpdateHeader header;
  header.set_worker_id(name_);
  header.set_job_id(task.job_id());
  header.set_round(task.round());
  header.set_attempt(task.attempt());
  header.set_base_model_version(task.model_version());
  if (action.kind == FakeAction::Kind::kFail) {
    // A failure header takes the upload's path: admitted, then noted.
    header.set_failure(action.failure);
    Status admitted = runner->AdmitUpload(header);
    if (!admitted.ok()) runner->RefuseArrival(header, admitted);
    Status noted = admitted.ok() ? runner->ReportFailure(header) : admitted;
    Record(turn, [&](FakeTurn& t) {
      t.admitted = admitted;
      t.verdict = noted;
      t.finished = true;
    });
    return;
  }

  // The download, as the worker service serves it: only to a participant of the open round.
  const std::string what =
      "download of model version " + std::to_string(task.model_version()) + " of job " + task.job_id();
  auto open = runner->SelectedRound(name_, what);
  Result<std::shared_ptr<const ModelVersion>> model =
      open.ok() ? runner->Model(task.model_version(), name_) : Result<std::shared_ptr<const ModelVersion>>(open.status());
  Record(turn, [&](FakeTurn& t) { t.downloaded = model.status(); });
  if (!model.ok()) {
    Record(turn, [](FakeTurn& t) { t.finished = true; });
    return;
  }
  runner->RecordDownload(name_, (*model)->version());
  TensorSet delta = action.delta((*model)->tensors());
  header.set_samples(action.samples);
  header.set_compute_ms(1);
  if (action.tamper) action.tamper(&header, &delta);
  *header.mutable_manifest() = wire::BuildManifest(delta);
  if (action.kind == FakeAction::Kind::kMalformedManifest && header.manifest().tensors_size() > 0) {
    auto* first = header.mutable_manifest()->mutable_tensors(0);
    first->add_shape(2);  // one dimension more than the model's
  }
  if (action.before_admit) action.before_admit->Pass();
  if (action.upload_to_current_runner) {
    runner = runner_();
    if (!runner) {
      Record(turn, [&](FakeTurn& t) {
        t.admitted = NotFoundError("job '" + task.job_id() + "' is not running");
        t.finished = true;
      });
      return;
    }
  }

  // The upload: its header is checked before its tensors are read; a malformed one from a
  // selected worker is recorded as refused, and one late by the protocol is not held against
  // it (server/rpc/update_intake.cc does the same).
  Status admitted = runner->AdmitUpload(header);
  Record(turn, [&](FakeTurn& t) { t.admitted = admitted; });
  if (!admitted.ok()) {
    runner->RefuseArrival(header, admitted);
    Record(turn, [](FakeTurn& t) { t.finished = true; });
    return;
  }
  if (action.before_submit) action.before_submit->Pass();
  Status verdict = runner->SubmitUpdate(header, delta, /*upload_ms=*/1);
  Record(turn, [&](FakeTurn& t) {
    t.verdict = verdict;
    t.finished = true;
  });
}

std::vector<v1::Task> FakeWorker::received() const {
  std::lock_guard<std::mutex> lock(mu_);
  return received_;
}

std::vector<FakeTurn> FakeWorker::turns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return turns_;
}

std::vector<v1::CancelTask> FakeWorker::cancels() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::CancelTask> cancels;
  for (const auto& task : received_) {
    if (IsTaskCancel(task)) cancels.push_back(task.cancel());
  }
  return cancels;
}

bool FakeWorker::Await(const std::function<bool(const std::vector<v1::Task>&, const std::vector<FakeTurn>&)>& done,
                       std::chrono::milliseconds limit) const {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, limit, [&] { return done(received_, turns_); });
}

bool FakeWorker::AwaitTrainTask(uint32_t round, uint32_t attempt, std::chrono::milliseconds limit) const {
  return Await(
      [&](const std::vector<v1::Task>&, const std::vector<FakeTurn>& turns) {
        return std::any_of(turns.begin(), turns.end(), [&](const FakeTurn& t) {
          return t.task.round() == round && t.task.attempt() == attempt;
        });
      },
      limit);
}

bool FakeWorker::AwaitFinished(uint32_t round, uint32_t attempt, std::chrono::milliseconds limit) const {
  return Await(
      [&](const std::vector<v1::Task>&, const std::vector<FakeTurn>& turns) {
        return std::any_of(turns.begin(), turns.end(), [&](const FakeTurn& t) {
          return t.task.round() == round && t.task.attempt() == attempt && t.finished;
        });
      },
      limit);
}

}  // namespace tessera::server
