// Strings from the wire at the coordinator's doors: a name that forges a log line, a device
// name with terminal escapes, a megabyte job id, a job name with a newline. Each is refused or
// escaped and bounded before it reaches a log, an error or an operator's screen; a client that
// repeats a refused join costs a few log lines, not one per attempt.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/captured_log.h"
#include "tests/integration/harness.h"
#include "tessera/v1/worker_service.grpc.pb.h"

namespace tessera::testing {
namespace {

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class HostileInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto started = server::Coordinator::Start(TestCoordinatorOptions(dir_.str()));
    ASSERT_TRUE(started.ok()) << started.status().ToString();
    coordinator_ = std::move(started).value();
    workers_ = WorkerStub(coordinator_->port(), "w1");
    jobs_ = JobStub(coordinator_->port());
  }

  grpc::Status Join(v1::JoinRequest request, v1::JoinResponse* response = nullptr) {
    if (request.join_token().empty()) request.set_join_token(kToken);
    grpc::ClientContext ctx;
    v1::JoinResponse ignored;
    return workers_->Join(&ctx, request, response ? response : &ignored);
  }

  CapturedLog log_;
  TempDir dir_{"hostile"};
  std::unique_ptr<server::Coordinator> coordinator_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
};

TEST_F(HostileInputTest, ANameThatForgesALogLineIsRefusedAndShownEscaped) {
  v1::JoinRequest join;
  join.set_name("w1\n2024-01-01 00:00:00.000 [coordinator] info job job-1-000000 SUCCEEDED");
  grpc::Status s = Join(join);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  // Cut at 64 characters, with the whole length.
  EXPECT_EQ(s.error_message(),
            "join: field 'name' 'w1\\n2024-01-01 00:00:00.000 [coordinator] info job job-1-000000 S\xE2\x80\xA6(72 "
            "bytes)': expected 1 to 128 letters, digits, '-', '_' or '.'");
  EXPECT_EQ(log_.text().find("\n2024-01-01 00:00:00.000 [coordinator]"), std::string::npos) << log_.text();
}

TEST_F(HostileInputTest, WhatAWorkerSaysAboutItsDeviceIsEscapedAndBoundedBeforeOperatorsSeeIt) {
  v1::JoinRequest join;
  join.set_name("w1");
  join.mutable_device()->set_name("gpu\x1b[2J\n" + std::string(100000, 'x'));
  (*join.mutable_device()->mutable_properties())["key\n"] = "value\r\n";
  v1::JoinResponse joined;
  ASSERT_TRUE(Join(join, &joined).ok());
  v1::HeartbeatRequest beat;
  beat.set_worker_id(joined.worker_id());
  beat.set_session(joined.session());
  beat.set_state("training\n" + std::string(1000, 's'));
  grpc::ClientContext beat_ctx;
  v1::HeartbeatResponse beat_response;
  ASSERT_TRUE(workers_->Heartbeat(&beat_ctx, beat, &beat_response).ok());

  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  ASSERT_EQ(listed.workers_size(), 1);
  const auto& w = listed.workers(0);
  EXPECT_EQ(w.device().name(), "gpu\\x1b[2J\\n" + std::string(120, 'x') + "\xE2\x80\xA6(100008 bytes)");
  ASSERT_EQ(w.device().properties().count("key\\n"), 1u);
  EXPECT_EQ(w.device().properties().at("key\\n"), "value\\r\\n");
  EXPECT_EQ(w.state(), "training\\n" + std::string(23, 's') + "\xE2\x80\xA6(1009 bytes)");
  EXPECT_EQ(log_.text().find("\x1b[2J"), std::string::npos);
}

// An emulated device is labelled so wherever it appears. One with a long profile path had its
// name cut before its "(emulated)": the label comes back after the cut.
TEST_F(HostileInputTest, AnEmulatedDevicesNameCutShortKeepsItsLabel) {
  v1::JoinRequest join;
  join.set_name("w1");
  const std::string path = "/" + std::string(200, 'p') + ".toml";
  join.mutable_device()->set_name("emu:" + path + " (emulated)");
  join.mutable_device()->set_emulated(true);
  ASSERT_TRUE(Join(join).ok());
  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).device().name(),
            "emu:/" + std::string(123, 'p') + "\xE2\x80\xA6(221 bytes) (emulated)");
  EXPECT_TRUE(listed.workers(0).device().emulated());
}

// The label follows the `emulated` field, not the words in the name: a device that is not
// emulated loses a label its worker wrote, and an emulated one whose name holds "(emulated)"
// elsewhere is labelled at the end all the same.
TEST_F(HostileInputTest, TheEmulatedLabelFollowsTheEmulatedField) {
  const std::vector<std::tuple<std::string, bool, std::string, std::string>> cases = {
      // worker, emulated, the name it joins with, the name the coordinator keeps
      {"r-label", false, "cpu (emulated)", "cpu"},
      {"r-twice", false, "cpu (emulated) (emulated)", "cpu"},
      {"r-plain", false, "emulated-lab-gpu", "emulated-lab-gpu"},
      {"e-inside", true, "emu:/profiles/x (emulated).toml", "emu:/profiles/x (emulated).toml (emulated)"},
      {"e-named", true, "emu:edge-npu (emulated)", "emu:edge-npu (emulated)"},
      {"e-bare", true, "emu:edge-npu", "emu:edge-npu (emulated)"},
  };
  for (const auto& [worker, emulated, name, kept] : cases) {
    v1::JoinRequest join;
    join.set_name(worker);
    join.mutable_device()->set_name(name);
    join.mutable_device()->set_emulated(emulated);
    join.set_join_token(kToken);
    grpc::ClientContext ctx;
    v1::JoinResponse joined;
    const grpc::Status s = WorkerStub(coordinator_->port(), worker)->Join(&ctx, join, &joined);
    ASSERT_TRUE(s.ok()) << worker << ": " << s.error_message();
  }
  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(jobs_->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  std::map<std::string, v1::WorkerStatus> by_name;
  for (const auto& w : listed.workers()) by_name[w.name()] = w;
  for (const auto& [worker, emulated, name, kept] : cases) {
    ASSERT_EQ(by_name.count(worker), 1u) << worker;
    EXPECT_EQ(by_name[worker].device().name(), kept) << worker;
    EXPECT_EQ(by_name[worker].device().emulated(), emulated) << worker;
  }
}

TEST_F(HostileInputTest, AMegabyteJobIdIsRefusedWithoutBeingEchoed) {
  grpc::ClientContext ctx;
  v1::GetJobRequest request;
  request.set_job_id(std::string(1 << 20, 'j'));
  v1::GetJobResponse response;
  grpc::Status s = jobs_->GetJob(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(), "get job: field 'job_id' '" + std::string(64, 'j') +
                                   "\xE2\x80\xA6(1048576 bytes)': expected a job id such as job-1-3fa9c2");
}

TEST_F(HostileInputTest, AJobNameWithANewlineIsRefused) {
  v1::JobSpec spec = SmallJob(1, 1);
  spec.set_name("nightly\n2024-01-01 00:00:00.000 [coordinator] warn forged");
  grpc::ClientContext ctx;
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec;
  v1::SubmitJobResponse response;
  grpc::Status s = jobs_->SubmitJob(&ctx, request, &response);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(s.error_message(),
            "spec.name: expected at most 128 bytes without control characters, got \"nightly\\n2024-01-01 "
            "00:00:00.000 [coordinator] warn forged\"");
}

TEST_F(HostileInputTest, AJoinRepeatedWithAWrongTokenIsLoggedAFewTimesNotEveryTime) {
  for (int i = 0; i < 40; ++i) {
    v1::JoinRequest join;
    join.set_name("w1");
    join.set_join_token("wrong-token");
    EXPECT_EQ(Join(join).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  const std::string text = log_.text();
  EXPECT_EQ(Count(text, "the join token does not match"), 5u) << text;
}

}  // namespace
}  // namespace tessera::testing
