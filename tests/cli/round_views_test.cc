// What `tessera trace` and `tessera workers` print from a coordinator's reply that carries long
// strings (a worker's failure as the coordinator keeps it, escaped and cut at 512 characters; a
// device's name): the trace still parses as JSON, and each worker keeps a line of its own.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "base/escape.h"
#include "cli/job_client.h"
#include "tests/cli/scripted_stub.h"
#include "tests/fresh_directory.h"

namespace tessera::cli {
namespace {

// The failure text a worker sent, as the coordinator keeps it in the round's record.
std::string KeptFailure() { return EscapeUntrusted(std::string(600, 'x') + "\x01", 512); }

class FakeJobService final : public v1::JobService::Service {
 public:
  std::string failed_outcome = "failed: " + KeptFailure();  // w2's

  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::GetJobResponse* response) override {
    v1::Job& job = *response->mutable_job();
    job.set_id(request->job_id());
    job.set_state(v1::JOB_SUCCEEDED);
    job.set_rounds_committed(1);
    v1::RoundRecord& round = *response->add_rounds();
    round.set_job_id(request->job_id());
    round.set_round(1);
    round.set_attempt(1);
    round.set_committed_unix_ms(1'700'000'000'000);
    round.mutable_latency()->set_selection_ms(1);
    round.mutable_latency()->set_total_ms(100);
    round.mutable_latency()->set_commit_ms(2);
    round.mutable_latency()->set_critical_worker("w1");
    v1::WorkerRoundReport& ok = *round.add_workers();
    ok.set_worker_id("w1");
    ok.set_outcome("accepted");
    ok.set_compute_ms(50);
    ok.set_reported_ms(60);
    v1::WorkerRoundReport& failed = *round.add_workers();
    failed.set_worker_id("w2");
    failed.set_outcome(failed_outcome);
    failed.set_compute_ms(30);
    failed.set_reported_ms(40);
    return grpc::Status::OK;
  }

  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    for (const char* name : {"w1", "w2"}) {
      v1::WorkerStatus& w = *response->add_workers();
      w.set_worker_id(name);
      w.set_alive(true);
      w.set_state("idle");
      // As the coordinator keeps it: escaped, 128 characters of up to four bytes each.
      w.mutable_device()->set_name(EscapeUntrusted(std::string(200, '\x7f'), 128));
    }
    return grpc::Status::OK;
  }
};

class RoundViewsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    stub_ = v1::JobService::NewStub(server_->InProcessChannel(grpc::ChannelArguments()));
  }
  void TearDown() override { server_->Shutdown(); }

  FakeJobService service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::JobService::Stub> stub_;
};

TEST_F(RoundViewsTest, ATraceWithALongFailureIsValidJsonThatKeepsTheWholeOutcome) {
  std::ostringstream trace;
  Status traced = TraceCommand(*stub_, "job-1-abc", std::nullopt, trace);
  ASSERT_TRUE(traced.ok()) << traced.ToString();
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(trace.str(), &parsed).ok()) << trace.str();
  bool found = false;
  for (const auto& e : parsed.fields().at("traceEvents").list_value().values()) {
    const auto& f = e.struct_value().fields();
    if (f.at("ph").string_value() != "X" || f.at("name").string_value() != "compute") continue;
    const auto& args = f.at("args").struct_value().fields();
    if (args.at("outcome").string_value() == "failed: " + KeptFailure()) found = true;
  }
  EXPECT_TRUE(found) << "w2's compute span carries its whole outcome\n" << trace.str();
}

// A round record's strings reach the trace as they came: should one not be UTF-8 (a worker's
// outcome), the trace file is still valid JSON (a strict parser, Python's, reads it), each byte
// that is not part of a UTF-8 character shown as U+FFFD.
TEST_F(RoundViewsTest, ATraceOfAnOutcomeThatIsNotUtf8IsValidJson) {
  service_.failed_outcome = "failed: \xff\xfe \"quoted\" \xc3 \xe2\x82 end \xc3\xa9";
  // Handed over without the wire, which would refuse a string that is not UTF-8.
  ScriptedStub stub;
  v1::GetJobRequest request;
  request.set_job_id("job-1-abc");
  ASSERT_TRUE(service_.GetJob(nullptr, &request, &stub.job.emplace()).ok());
  const std::filesystem::path dir = testing::FreshTestDirectory("tessera-trace-utf8");
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / "trace.json";
  std::ostringstream note;
  Status traced = TraceToFile(stub, "job-1-abc", std::nullopt, path.string(), note);
  ASSERT_TRUE(traced.ok()) << traced.ToString();
  const std::string check = "python3 -c 'import json, sys; t = json.load(open(sys.argv[1], encoding=\"utf-8\")); "
                            "sys.exit(0 if any(e.get(\"args\", {}).get(\"outcome\") == "
                            "\"failed: \\ufffd\\ufffd \\\"quoted\\\" \\ufffd \\ufffd\\ufffd end \\u00e9\" "
                            "for e in t[\"traceEvents\"]) else 3)' " + path.string();
  EXPECT_EQ(std::system(check.c_str()), 0) << check;
  std::filesystem::remove_all(dir);
}

// trace -o FILE writes the file whole: a link at FILE is replaced, not followed (the file it
// points to keeps its bytes), and a trace that fails leaves FILE as it was.
TEST_F(RoundViewsTest, ATraceFileReplacesALinkAndAFailedTraceLeavesTheFileAlone) {
  const std::filesystem::path dir = testing::FreshTestDirectory("tessera-trace-file");
  std::filesystem::create_directories(dir);
  const std::filesystem::path victim = dir / "victim.txt", path = dir / "trace.json";
  std::ofstream(victim) << "keep";
  std::filesystem::create_symlink(victim, path);
  std::ostringstream note;
  Status traced = TraceToFile(*stub_, "job-1-abc", std::nullopt, path.string(), note);
  ASSERT_TRUE(traced.ok()) << traced.ToString();
  std::ifstream kept(victim);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), "keep");
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  std::ifstream written(path);
  const std::string trace{std::istreambuf_iterator<char>(written), {}};
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(trace, &parsed).ok()) << trace;
  EXPECT_NE(note.str().find("wrote " + std::to_string(trace.size()) + " bytes to"), std::string::npos) << note.str();

  // Round 9 was never committed: nothing is written.
  Status missing = TraceToFile(*stub_, "job-1-abc", 9, path.string(), note);
  EXPECT_EQ(missing.code(), StatusCode::kNotFound) << missing.ToString();
  std::ifstream again(path);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(again), {}), trace);
  EXPECT_FALSE(std::filesystem::exists(path.string() + ".tmp"));
  std::filesystem::remove_all(dir);
}

// A submit the coordinator refuses names the spec's file as the user gave it: escaped.
TEST_F(RoundViewsTest, ASubmitThatFailsNamesItsFileEscaped) {
  const std::filesystem::path dir = testing::FreshTestDirectory("tessera-submit-name");
  std::filesystem::create_directories(dir);
  const std::filesystem::path spec = dir / "job\x1b[2J\nforged.toml";
  std::ofstream(spec) << "name = \"t\"\nrounds = 2\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n";
  std::ostringstream out;
  Status submitted = SubmitCommand(*stub_, spec.string(), out);  // the fake coordinator has no SubmitJob
  ASSERT_FALSE(submitted.ok());
  EXPECT_EQ(submitted.message().find('\x1b'), std::string::npos) << submitted.message();
  EXPECT_EQ(submitted.message().find('\n'), std::string::npos) << submitted.message();
  EXPECT_EQ(submitted.message().rfind("submit '" + (dir / "job\\x1b[2J\\nforged.toml").string() + "'", 0), 0u)
      << submitted.message();
  std::filesystem::remove_all(dir);
}

TEST_F(RoundViewsTest, EachWorkerHasALineOfItsOwnWhateverItsDeviceName) {
  std::ostringstream out;
  Status listed = WorkersCommand(*stub_, out);
  ASSERT_TRUE(listed.ok()) << listed.ToString();
  std::istringstream lines(out.str());
  std::vector<std::string> rows;
  for (std::string line; std::getline(lines, line);) rows.push_back(line);
  ASSERT_EQ(rows.size(), 3u) << out.str();
  EXPECT_EQ(rows[1].rfind("w1 ", 0), 0u) << out.str();
  EXPECT_EQ(rows[2].rfind("w2 ", 0), 0u) << out.str();
  EXPECT_NE(rows[1].find(EscapeUntrusted(std::string(200, '\x7f'), 128)), std::string::npos) << out.str();
}

// Worker names and outcomes reach the trace as the coordinator kept them, which may hold the
// characters that reorder text (U+202E would show "w1<RLO>exe.txt" as "w1txt.exe"): each is
// a \uXXXX escape in the JSON, which still reads back as the string sent.
TEST(TraceTextTest, CharactersThatReorderTextAreEscapedInTheTrace) {
  const std::vector<std::pair<std::string, std::string>> marks = {
      {"\xd8\x9c", "\\u061c"},     {"\xe2\x80\x8e", "\\u200e"}, {"\xe2\x80\x8f", "\\u200f"},
      {"\xe2\x80\xaa", "\\u202a"}, {"\xe2\x80\xab", "\\u202b"}, {"\xe2\x80\xac", "\\u202c"},
      {"\xe2\x80\xad", "\\u202d"}, {"\xe2\x80\xae", "\\u202e"}, {"\xe2\x81\xa6", "\\u2066"},
      {"\xe2\x81\xa7", "\\u2067"}, {"\xe2\x81\xa8", "\\u2068"}, {"\xe2\x81\xa9", "\\u2069"}};
  ScriptedStub stub;
  v1::Job& job = *stub.job.emplace().mutable_job();
  job.set_id("job-1");
  job.set_rounds_committed(1);
  v1::RoundRecord& round = *stub.job->add_rounds();
  round.set_round(1);
  round.set_attempt(1);
  round.mutable_latency()->set_total_ms(100);
  round.mutable_latency()->set_critical_worker("w0" + marks[0].first);
  for (size_t i = 0; i < marks.size(); ++i) {
    v1::WorkerRoundReport& w = *round.add_workers();
    w.set_worker_id("w" + std::to_string(i) + marks[i].first + "exe.txt");
    w.set_outcome("failed: " + marks[i].first + "gnp.exe");
    w.set_compute_ms(30);
    w.set_reported_ms(40);
  }
  std::ostringstream out;
  Status traced = TraceCommand(stub, "job-1", std::nullopt, out);
  ASSERT_TRUE(traced.ok()) << traced.ToString();
  const std::string trace = out.str();
  for (const auto& [raw, escaped] : marks) EXPECT_EQ(trace.find(raw), std::string::npos) << escaped << "\n" << trace;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(trace, &parsed).ok()) << trace;
  std::set<std::string> names, outcomes;
  for (const auto& e : parsed.fields().at("traceEvents").list_value().values()) {
    const auto& f = e.struct_value().fields();
    const auto& args = f.at("args").struct_value().fields();
    if (f.at("ph").string_value() == "M" && f.at("name").string_value() == "thread_name") {
      names.insert(args.at("name").string_value());
    } else if (auto outcome = args.find("outcome"); outcome != args.end()) {
      outcomes.insert(outcome->second.string_value());
    }
  }
  for (size_t i = 0; i < marks.size(); ++i) {
    const auto& [raw, escaped] = marks[i];
    EXPECT_NE(trace.find("w" + std::to_string(i) + escaped + "exe.txt"), std::string::npos) << escaped << "\n" << trace;
    EXPECT_NE(trace.find("failed: " + escaped + "gnp.exe"), std::string::npos) << escaped << "\n" << trace;
    EXPECT_EQ(names.count("worker w" + std::to_string(i) + raw + "exe.txt"), 1u) << escaped;
    EXPECT_EQ(outcomes.count("failed: " + raw + "gnp.exe"), 1u) << escaped;
  }
  EXPECT_NE(trace.find("\"critical_worker\":\"w0\\u061c\""), std::string::npos) << trace;
}

// A coordinator that lists the workers given.
class WorkersListService final : public v1::JobService::Service {
 public:
  std::vector<v1::WorkerStatus> workers;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    for (const auto& w : workers) *response->add_workers() = w;
    return grpc::Status::OK;
  }
};

// The "(emulated)" label follows the worker's `emulated` field, not the words in its device's
// name: an emulated device whose name holds "emulated" elsewhere is labelled, the label is put
// back after a long name's cut, and a device that is not emulated never shows it.
TEST(WorkersTextTest, TheEmulatedLabelFollowsTheEmulatedField) {
  const std::string long_name = "emu:/profiles/emulated-" + std::string(700, 'x') + ".json (emulated)";
  const std::vector<std::tuple<std::string, bool, std::string>> cases = {
      // worker, emulated, device name as the coordinator keeps it
      {"e-path", true, "emu:/profiles/emulated-npu.json"},
      {"e-named", true, "emu:ascend-910b (emulated)"},
      {"e-long", true, long_name},
      {"r-word", false, "emulated-lab-gpu"},
      {"r-label", false, "cpu (emulated)"},
      {"r-plain", false, "cpu (OpenBLAS, 2 threads)"},
  };
  WorkersListService service;
  for (const auto& [id, emulated, name] : cases) {
    v1::WorkerStatus& w = service.workers.emplace_back();
    w.set_worker_id(id);
    w.set_alive(true);
    w.set_state("idle");
    w.mutable_device()->set_name(name);
    w.mutable_device()->set_emulated(emulated);
  }
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto stub = v1::JobService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  std::ostringstream out;
  Status listed = WorkersCommand(*stub, out);
  ASSERT_TRUE(listed.ok()) << listed.ToString();
  std::map<std::string, std::string> rows;  // worker -> its line
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);) rows[line.substr(0, line.find(' '))] = line;
  const auto ends_with = [&](const std::string& id, const std::string& tail) {
    const std::string& row = rows[id];
    return row.size() >= tail.size() && row.compare(row.size() - tail.size(), tail.size(), tail) == 0;
  };
  EXPECT_TRUE(ends_with("e-path", "  emu:/profiles/emulated-npu.json (emulated)")) << out.str();
  EXPECT_TRUE(ends_with("e-named", "  emu:ascend-910b (emulated)")) << out.str();
  EXPECT_TRUE(ends_with("e-long", " bytes) (emulated)")) << out.str();
  EXPECT_TRUE(ends_with("r-word", "  emulated-lab-gpu")) << out.str();
  EXPECT_TRUE(ends_with("r-label", "  cpu")) << out.str();
  EXPECT_TRUE(ends_with("r-plain", "  cpu (OpenBLAS, 2 threads)")) << out.str();
  for (const auto& [id, row] : rows) {
    const size_t first = row.find("(emulated)");
    EXPECT_EQ(row.find("(emulated)", first == std::string::npos ? first : first + 1), std::string::npos)
        << "labelled once at most: " << row;
  }
  server->Shutdown();
}

// A coordinator whose replies carry terminal controls in every string a command shows: ESC
// sequences, BEL, DEL and a C1 control (U+009B, CSI for a terminal that takes 8-bit controls).
const std::string kControls = "\x1b[2J\x1b]0;owned\x07\x7f\xc2\x9b";

class HostileJobService final : public v1::JobService::Service {
 public:
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request, v1::GetJobResponse* response) override {
    v1::Job& job = *response->mutable_job();
    job.set_id(request->job_id() + kControls);
    job.set_state(v1::JOB_FAILED);
    job.set_error("diverged" + kControls);
    job.set_rounds_committed(1);
    job.mutable_spec()->mutable_model()->set_name("mlp" + kControls);
    v1::RoundRecord& round = *response->add_rounds();
    round.set_round(1);
    round.set_attempt(1);
    round.mutable_latency()->set_total_ms(100);
    round.mutable_latency()->set_critical_worker("w1" + kControls);
    for (const char* outcome : {"accepted", "dropped: late"}) {
      v1::WorkerRoundReport& w = *round.add_workers();
      w.set_worker_id("w1" + kControls);
      w.set_cohort(std::string(outcome) == "accepted" ? "" : "c" + kControls);
      w.set_outcome(outcome + kControls);
      w.set_download_done_ms(5);
      w.set_download_ms(5);
      w.set_compute_ms(30);
      w.set_reported_ms(std::string(outcome) == "accepted" ? 40 : 0);
    }
    return grpc::Status::OK;
  }
  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest*, v1::SubmitJobResponse* response) override {
    response->mutable_job()->set_id("job-1" + kControls);
    return grpc::Status::OK;
  }
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*, v1::ListJobsResponse* response) override {
    response->add_jobs()->set_id("job-1" + kControls);
    return grpc::Status::OK;
  }
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                           v1::ListWorkersResponse* response) override {
    v1::WorkerStatus& w = *response->add_workers();
    w.set_worker_id("w1" + kControls);
    w.set_alive(true);
    w.set_state("idle" + kControls);
    w.set_cohort("c" + kControls);
    w.mutable_device()->set_name("gpu" + kControls);
    return grpc::Status::OK;
  }
};

TEST(HostileRepliesTest, NoCommandPutsTheCoordinatorsControlCharactersOnTheTerminal) {
  HostileJobService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  auto server = builder.BuildAndStart();
  auto stub = v1::JobService::NewStub(server->InProcessChannel(grpc::ChannelArguments()));
  const std::string spec = ::testing::TempDir() + "hostile-replies-job.toml";
  std::ofstream(spec) << "name = \"t\"\nrounds = 2\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n";
  const std::vector<std::pair<std::string, std::function<Status(std::ostream&)>>> commands = {
      {"submit", [&](std::ostream& out) { return SubmitCommand(*stub, spec, out); }},
      {"status", [&](std::ostream& out) { return StatusCommand(*stub, "job-1", out); }},
      {"rounds", [&](std::ostream& out) { return RoundsCommand(*stub, "job-1", std::nullopt, out); }},
      {"trace", [&](std::ostream& out) { return TraceCommand(*stub, "job-1", std::nullopt, out); }},
      {"jobs", [&](std::ostream& out) { return JobsCommand(*stub, out); }},
      {"workers", [&](std::ostream& out) { return WorkersCommand(*stub, out); }},
  };
  for (const auto& [name, run] : commands) {
    std::ostringstream out;
    Status ran = run(out);
    ASSERT_TRUE(ran.ok()) << name << ": " << ran.ToString();
    const std::string text = out.str();
    for (const std::string control : {"\x1b", "\x07", "\x7f", "\xc2\x9b"}) {
      EXPECT_EQ(text.find(control), std::string::npos) << name << " shows a control character:\n" << text;
    }
    EXPECT_NE(text.find(name == "trace" ? "\\u001b[2J" : "\\x1b[2J"), std::string::npos) << name << " shows it escaped:\n" << text;
  }
  std::ostringstream trace;
  ASSERT_TRUE(TraceCommand(*stub, "job-1", std::nullopt, trace).ok());
  google::protobuf::Struct parsed;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(trace.str(), &parsed).ok()) << trace.str();
  EXPECT_NE(trace.str().find("\\u001b[2J"), std::string::npos) << trace.str();
  EXPECT_NE(trace.str().find("\\u009b"), std::string::npos) << trace.str();
  std::ostringstream status;
  ASSERT_TRUE(StatusCommand(*stub, "job-1", status).ok());
  EXPECT_NE(status.str().find("diverged\\x1b[2J"), std::string::npos) << status.str();
  server->Shutdown();
}

}  // namespace
}  // namespace tessera::cli
