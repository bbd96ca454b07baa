// A JobService stub scripted in the test's thread, with no channel between: WatchJob answers
// with the streams given, one per call; GetJob with the reply given. Its replies are never
// serialized, so that they may hold what the wire would refuse (a string that is not UTF-8).
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::cli {

// One WatchJob stream: events from `next` until it returns false, then `status`.
class ScriptedReader final : public grpc::ClientReaderInterface<v1::JobEvent> {
 public:
  ScriptedReader(std::function<bool(v1::JobEvent*)> next, grpc::Status status)
      : next_(std::move(next)), status_(std::move(status)) {}
  bool Read(v1::JobEvent* event) override {
    event->Clear();
    return next_(event);
  }
  bool NextMessageSize(uint32_t* size) override {
    *size = 64 << 20;
    return true;
  }
  grpc::Status Finish() override { return status_; }
  void WaitForInitialMetadata() override {}

 private:
  std::function<bool(v1::JobEvent*)> next_;
  grpc::Status status_;
};

// A JobService stub that answers WatchJob with the streams given, one per call, GetJob with
// `job` when it is set, and nothing else.
class ScriptedStub final : public v1::JobService::StubInterface {
 public:
  struct Stream {
    std::function<bool(v1::JobEvent*)> next;
    grpc::Status status = grpc::Status::OK;
  };
  std::deque<Stream> streams;
  std::vector<uint32_t> from_rounds;  // each WatchJob's from_round
  std::optional<v1::GetJobResponse> job;  // GetJob's reply, whatever the request; unset: not scripted

  grpc::ClientReaderInterface<v1::JobEvent>* WatchJobRaw(grpc::ClientContext*, const v1::WatchJobRequest& request) override {
    from_rounds.push_back(request.from_round());
    if (streams.empty()) return new ScriptedReader([](v1::JobEvent*) { return false; }, Unimplemented());
    Stream s = std::move(streams.front());
    streams.pop_front();
    return new ScriptedReader(std::move(s.next), s.status);
  }

  grpc::Status SubmitJob(grpc::ClientContext*, const v1::SubmitJobRequest&, v1::SubmitJobResponse*) override { return Unimplemented(); }
  grpc::Status GetJob(grpc::ClientContext*, const v1::GetJobRequest&, v1::GetJobResponse* response) override {
    if (!job) return Unimplemented();
    *response = *job;
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ClientContext*, const v1::ListJobsRequest&, v1::ListJobsResponse*) override { return Unimplemented(); }
  grpc::Status CancelJob(grpc::ClientContext*, const v1::CancelJobRequest&, v1::CancelJobResponse*) override { return Unimplemented(); }
  grpc::Status ListWorkers(grpc::ClientContext*, const v1::ListWorkersRequest&, v1::ListWorkersResponse*) override { return Unimplemented(); }
  grpc::Status ForgetWorker(grpc::ClientContext*, const v1::ForgetWorkerRequest&, v1::ForgetWorkerResponse*) override { return Unimplemented(); }
  grpc::Status DeleteJob(grpc::ClientContext*, const v1::DeleteJobRequest&, v1::DeleteJobResponse*) override { return Unimplemented(); }

 private:
  template <typename T>
  using Unary = grpc::ClientAsyncResponseReaderInterface<T>;
  template <typename T>
  using Streamed = grpc::ClientAsyncReaderInterface<T>;
  using Cq = grpc::CompletionQueue;
  using Ctx = grpc::ClientContext;
  static grpc::Status Unimplemented() { return grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "not scripted"); }
  Unary<v1::SubmitJobResponse>* AsyncSubmitJobRaw(Ctx*, const v1::SubmitJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::SubmitJobResponse>* PrepareAsyncSubmitJobRaw(Ctx*, const v1::SubmitJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::GetJobResponse>* AsyncGetJobRaw(Ctx*, const v1::GetJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::GetJobResponse>* PrepareAsyncGetJobRaw(Ctx*, const v1::GetJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::ListJobsResponse>* AsyncListJobsRaw(Ctx*, const v1::ListJobsRequest&, Cq*) override { return nullptr; }
  Unary<v1::ListJobsResponse>* PrepareAsyncListJobsRaw(Ctx*, const v1::ListJobsRequest&, Cq*) override { return nullptr; }
  Unary<v1::CancelJobResponse>* AsyncCancelJobRaw(Ctx*, const v1::CancelJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::CancelJobResponse>* PrepareAsyncCancelJobRaw(Ctx*, const v1::CancelJobRequest&, Cq*) override { return nullptr; }
  Streamed<v1::JobEvent>* AsyncWatchJobRaw(Ctx*, const v1::WatchJobRequest&, Cq*, void*) override { return nullptr; }
  Streamed<v1::JobEvent>* PrepareAsyncWatchJobRaw(Ctx*, const v1::WatchJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::ListWorkersResponse>* AsyncListWorkersRaw(Ctx*, const v1::ListWorkersRequest&, Cq*) override { return nullptr; }
  Unary<v1::ListWorkersResponse>* PrepareAsyncListWorkersRaw(Ctx*, const v1::ListWorkersRequest&, Cq*) override { return nullptr; }
  grpc::ClientReaderInterface<v1::ModelChunkMessage>* ExportModelRaw(Ctx*, const v1::ExportModelRequest&) override { return nullptr; }
  Streamed<v1::ModelChunkMessage>* AsyncExportModelRaw(Ctx*, const v1::ExportModelRequest&, Cq*, void*) override { return nullptr; }
  Streamed<v1::ModelChunkMessage>* PrepareAsyncExportModelRaw(Ctx*, const v1::ExportModelRequest&, Cq*) override { return nullptr; }
  Unary<v1::ForgetWorkerResponse>* AsyncForgetWorkerRaw(Ctx*, const v1::ForgetWorkerRequest&, Cq*) override { return nullptr; }
  Unary<v1::ForgetWorkerResponse>* PrepareAsyncForgetWorkerRaw(Ctx*, const v1::ForgetWorkerRequest&, Cq*) override { return nullptr; }
  Unary<v1::DeleteJobResponse>* AsyncDeleteJobRaw(Ctx*, const v1::DeleteJobRequest&, Cq*) override { return nullptr; }
  Unary<v1::DeleteJobResponse>* PrepareAsyncDeleteJobRaw(Ctx*, const v1::DeleteJobRequest&, Cq*) override { return nullptr; }
};


}  // namespace tessera::cli
