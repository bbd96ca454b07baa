#include "proto/job_rounds.h"

namespace tessera::wire {

grpc::Status GetJobWithRounds(v1::JobService::StubInterface& stub, const std::string& job_id,
                              const std::function<void(grpc::ClientContext*)>& prepare, v1::GetJobResponse* out,
                              uint32_t from_round) {
  out->Clear();
  const auto fail = [out](grpc::Status status) {
    out->Clear();
    return status;
  };
  for (int page = 0; page < kMaxRoundPages; ++page) {
    grpc::ClientContext ctx;
    if (prepare) prepare(&ctx);
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    request.set_include_rounds(true);
    request.set_from_round(from_round);
    v1::GetJobResponse reply;
    if (grpc::Status s = stub.GetJob(&ctx, request, &reply); !s.ok()) return fail(s);
    // Each page must move forward: its rounds past the last one taken, the next page past them.
    if (reply.rounds_size() > 0 && out->rounds_size() > 0 &&
        reply.rounds(0).round() <= out->rounds(out->rounds_size() - 1).round()) {
      return fail(grpc::Status(grpc::StatusCode::INTERNAL,
                               "the coordinator's page of rounds from " + std::to_string(from_round) +
                                   " repeats round " + std::to_string(reply.rounds(0).round())));
    }
    *out->mutable_job() = std::move(*reply.mutable_job());
    for (auto& round : *reply.mutable_rounds()) *out->add_rounds() = std::move(round);
    if (reply.next_round() == 0) return grpc::Status::OK;
    if (reply.rounds_size() == 0 || reply.next_round() <= out->rounds(out->rounds_size() - 1).round()) {
      return fail(grpc::Status(grpc::StatusCode::INTERNAL,
                               "the coordinator's page of rounds from " + std::to_string(from_round) +
                                   " points back to round " + std::to_string(reply.next_round())));
    }
    from_round = reply.next_round();
  }
  return fail(grpc::Status(grpc::StatusCode::INTERNAL, "more than " + std::to_string(kMaxRoundPages) +
                                                           " pages of rounds"));
}

}  // namespace tessera::wire
