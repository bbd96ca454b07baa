// Upload admission: the coordinator tells workers at join that it admits uploads, and answers
// an upload's header with the stream's initial metadata only once the update fits its upload
// memory. With room for one update at a time, the second upload is admitted only after the
// first has been received, and both are accepted. A newer upload of an update ends the older
// one still open, and is taken; an upload stopped midway is not judged, and its update is taken
// when sent again. An over-selected worker that stops its upload at the cancel is not counted
// as refused. An admitted update whose upload stalls until the coordinator ends it is refused
// in its round, which then no longer waits for it.
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <thread>

#include "proto/update_envelope.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::testing {
namespace {

// A worker whose protocol runs by hand (HandWorker); it keeps its last train task, and uploads
// over a raw stub with the same identity.
class ManualWorker {
 public:
  ManualWorker(int port, const std::string& name)
      : stub_(WorkerStub(port, name)),
        hand_(std::make_unique<HandWorker>("127.0.0.1:" + std::to_string(port), name, [this](const v1::TrainTask& t) {
          std::lock_guard<std::mutex> lock(mu_);
          task_ = t;
        })) {}

  const v1::JoinResponse& joined() const { return hand_->joined(); }
  std::optional<v1::TrainTask> task() {
    std::lock_guard<std::mutex> lock(mu_);
    return task_;
  }

  // The header of an unchanged model's update for `task`, and its bytes.
  void BuildUpdate(const v1::TrainTask& task, v1::UpdateChunkMessage* header, wire::UpdateBytes* bytes) {
    auto model = hand_->Download(task);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    TensorSet delta = *model;
    for (auto& t : delta) std::fill(t.values.begin(), t.values.end(), 0.0f);
    v1::UpdateHeader& h = *header->mutable_header();
    h.set_worker_id(joined().worker_id());
    h.set_session(joined().session());
    h.set_job_id(task.job_id());
    h.set_round(task.round());
    h.set_attempt(task.attempt());
    h.set_base_model_version(task.model_version());
    h.set_samples(100);
    wire::AppendUpdateSet(wire::kDeltaSet, delta, UpdateEncoding::kFloat32, 0, 1 << 20, &h, bytes);
  }

  v1::WorkerService::Stub* stub() { return stub_.get(); }

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::mutex mu_;
  std::optional<v1::TrainTask> task_;
  std::unique_ptr<HandWorker> hand_;  // last: its threads end before the members above go
};

// One upload by hand: the header now, the chunks when the test says.
struct HandUpload {
  explicit HandUpload(v1::WorkerService::Stub* stub) {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    writer = stub->UploadUpdate(&ctx, &result);
  }
  // Sends every chunk of `bytes` and ends the stream; the verdict is in `result`.
  void SendAndFinish(const wire::UpdateBytes& bytes) {
    Status sent = wire::ForEachChunk(bytes, 1 << 20, [&](const v1::TensorChunk& chunk) {
      v1::UpdateChunkMessage m;
      *m.mutable_chunk() = chunk;
      return writer->Write(m) ? Status::Ok() : CancelledError("the coordinator closed the upload");
    });
    EXPECT_TRUE(sent.ok()) << sent.ToString();
    writer->WritesDone();
    grpc::Status finished = writer->Finish();
    EXPECT_TRUE(finished.ok()) << finished.error_message();
  }
  grpc::ClientContext ctx;
  v1::UploadResult result;
  std::unique_ptr<grpc::ClientWriter<v1::UpdateChunkMessage>> writer;
};

TEST(UploadAdmissionTest, AnUpdateIsAdmittedBeforeItsTensorsAndOneWaitsWhileTheMemoryIsTaken) {
  TempDir dir("admission");
  auto options = TestCoordinatorOptions(dir.str());
  options.upload_buffer_bytes = 1;  // one update at a time
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  ManualWorker w1(port, "w1"), w2(port, "w2");
  EXPECT_TRUE(w1.joined().upload_admission());
  EXPECT_TRUE(w1.joined().upload_xxh3());  // its tensors travel with XXH3-128 checksums
  auto job = (*coordinator)->SubmitJob(SmallJob(1, 2));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return w1.task() && w2.task(); }, std::chrono::seconds(60)));

  v1::UpdateChunkMessage header1, header2;
  wire::UpdateBytes bytes1, bytes2;
  w1.BuildUpdate(*w1.task(), &header1, &bytes1);
  w2.BuildUpdate(*w2.task(), &header2, &bytes2);

  // The first header is answered with the admission before any tensor is sent.
  HandUpload up1(w1.stub());
  ASSERT_TRUE(up1.writer->Write(header1));
  auto admitted1 = std::async(std::launch::async, [&] { up1.writer->WaitForInitialMetadata(); });
  ASSERT_EQ(admitted1.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "no admission for an upload that fits the coordinator's memory";

  // The second waits while the first holds the memory...
  HandUpload up2(w2.stub());
  ASSERT_TRUE(up2.writer->Write(header2));
  std::atomic<bool> admitted2{false};
  auto waiting2 = std::async(std::launch::async, [&] {
    up2.writer->WaitForInitialMetadata();
    admitted2 = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(admitted2) << "admitted while the only update the memory holds was still being received";

  // ...and is admitted once the first is received.
  up1.SendAndFinish(bytes1);
  EXPECT_TRUE(up1.result.accepted()) << up1.result.reason();

  ASSERT_EQ(waiting2.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  EXPECT_TRUE(admitted2);
  up2.SendAndFinish(bytes2);
  EXPECT_TRUE(up2.result.accepted()) << up2.result.reason();

  auto stub = JobStub(port);
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  EXPECT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
}

// Waits for an upload's admission (the stream's initial metadata); false if none came.
bool AwaitAdmission(HandUpload& up) {
  auto admitted = std::async(std::launch::async, [&] { up.writer->WaitForInitialMetadata(); });
  return admitted.wait_for(std::chrono::seconds(60)) == std::future_status::ready;
}

TEST(UploadAdmissionTest, ANewerUploadOfAnUpdateEndsTheOlderOneAndIsTaken) {
  TempDir dir("admission-twice");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  ManualWorker w1(port, "w1"), w2(port, "w2");
  auto job = (*coordinator)->SubmitJob(SmallJob(1, 2));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return w1.task() && w2.task(); }, std::chrono::seconds(60)));
  v1::UpdateChunkMessage header;
  wire::UpdateBytes bytes;
  w1.BuildUpdate(*w1.task(), &header, &bytes);

  HandUpload older(w1.stub());
  ASSERT_TRUE(older.writer->Write(header));
  ASSERT_TRUE(AwaitAdmission(older));

  // The same update again while the first upload is open (as a worker sends it on another
  // connection when its own broke): the newer is taken whole.
  HandUpload newer(w1.stub());
  ASSERT_TRUE(newer.writer->Write(header));
  newer.SendAndFinish(bytes);
  EXPECT_TRUE(newer.result.accepted()) << newer.result.reason();

  // The older was ended without its update being judged: nothing is held against the worker.
  older.writer->WritesDone();
  EXPECT_EQ(older.writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  auto status = (*coordinator)->registry().Describe("w1");
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->updates_rejected(), 0u);
}

TEST(UploadAdmissionTest, AnUploadStoppedMidwayIsNotJudgedAndItsUpdateIsTakenWhenSentAgain) {
  TempDir dir("admission-again");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  ManualWorker w1(port, "w1");
  auto job = (*coordinator)->SubmitJob(SmallJob(1, 1));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return w1.task().has_value(); }, std::chrono::seconds(60)));
  v1::UpdateChunkMessage header;
  wire::UpdateBytes bytes;
  w1.BuildUpdate(*w1.task(), &header, &bytes);

  // Admitted, then the call goes away before any tensor came (a connection that broke).
  HandUpload broken(w1.stub());
  ASSERT_TRUE(broken.writer->Write(header));
  ASSERT_TRUE(AwaitAdmission(broken));
  broken.ctx.TryCancel();
  EXPECT_EQ(broken.writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Once it has ended at the coordinator, only the task channel is open.
  ASSERT_TRUE(WaitUntil([&] { return (*coordinator)->streams().open() == 1; }, std::chrono::seconds(60)));

  HandUpload again(w1.stub());
  ASSERT_TRUE(again.writer->Write(header));
  again.SendAndFinish(bytes);
  EXPECT_TRUE(again.result.accepted()) << again.result.reason();
  auto status = (*coordinator)->registry().Describe("w1");
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->updates_rejected(), 0u);
}

TEST(UploadAdmissionTest, AnOverSelectedWorkerThatStopsItsUploadAtTheCancelIsNotCountedAsRefused) {
  TempDir dir("admission-over-selected");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  ManualWorker w1(port, "w1"), w2(port, "w2");
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(60)));
  // One update a round, two workers selected: the second is over-selected once the first's is in.
  v1::JobSpec spec = SmallJob(2, 2);
  spec.set_clients_per_round(1);
  spec.set_min_clients(1);
  spec.mutable_selection()->set_over_selection(1);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return w1.task() && w2.task(); }, std::chrono::seconds(60)));
  v1::UpdateChunkMessage header1, header2;
  wire::UpdateBytes bytes1, bytes2;
  w1.BuildUpdate(*w1.task(), &header1, &bytes1);
  w2.BuildUpdate(*w2.task(), &header2, &bytes2);

  // w2's update is admitted while the round is open; its tensors have not come yet.
  HandUpload late(w2.stub());
  ASSERT_TRUE(late.writer->Write(header2));
  ASSERT_TRUE(AwaitAdmission(late));

  // w1's update closes the round, and w2 is cancelled as over-selected.
  HandUpload taken(w1.stub());
  ASSERT_TRUE(taken.writer->Write(header1));
  taken.SendAndFinish(bytes1);
  EXPECT_TRUE(taken.result.accepted()) << taken.result.reason();
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto runner = (*coordinator)->Runner(job->id());
        return runner && runner->CancelledAsOverSelected(header2.header());
      },
      std::chrono::seconds(60)));

  // As a worker does at the cancel, w2 stops its upload.
  late.ctx.TryCancel();
  EXPECT_EQ(late.writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // Once the upload has ended at the coordinator, only the two task channels are open.
  ASSERT_TRUE(WaitUntil([&] { return (*coordinator)->streams().open() == 2; }, std::chrono::seconds(60)));
  auto status = (*coordinator)->registry().Describe("w2");
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->updates_rejected(), 0u);
}

TEST(UploadAdmissionTest, AnUpdateWhoseUploadStallsIsRefusedInItsRoundWhenTheUploadIsEnded) {
  TempDir dir("admission-stalled");
  auto options = TestCoordinatorOptions(dir.str());
  options.streams.idle_timeout = std::chrono::milliseconds(2000);
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  ManualWorker w1(port, "w1");
  v1::JobSpec spec = SmallJob(1, 1);
  spec.set_round_deadline_ms(3600000);  // far past the test: only a refusal ends w1's part in the round
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return w1.task().has_value(); }, std::chrono::seconds(60)));
  v1::UpdateChunkMessage header;
  wire::UpdateBytes bytes;
  w1.BuildUpdate(*w1.task(), &header, &bytes);
  ASSERT_EQ(w1.task()->attempt(), 1u);

  // Admitted, then nothing: the coordinator ends the upload at its idle timeout.
  HandUpload stalled(w1.stub());
  ASSERT_TRUE(stalled.writer->Write(header));
  ASSERT_TRUE(AwaitAdmission(stalled));
  grpc::Status ended = stalled.writer->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << ended.error_message();
  EXPECT_EQ(ended.error_message(),
            "upload from worker 'w1': nothing received or taken for 2000 ms, its idle timeout (idle_timeout)");

  // The worker does not send that update again: its round stops waiting for it.
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto runner = (*coordinator)->Runner(job->id());
        if (!runner) return true;
        auto open = runner->SelectedRound("w1", "check");
        return !open.ok() || open->attempt != 1;
      },
      std::chrono::seconds(60)))
      << "w1 is still to report in attempt 1 of round 1";
  auto status = (*coordinator)->registry().Describe("w1");
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(status->updates_rejected(), 1u);
}

}  // namespace
}  // namespace tessera::testing
