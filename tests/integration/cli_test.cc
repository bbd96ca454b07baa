// The `tessera` command line against a real coordinator and workers: the per-worker round
// table, an over-selected round's cancelled worker, dead workers aging out of the list, JSON output, a watch that outlives a coordinator
// restart; and the binary itself: help per command, --version, the hint when no coordinator
// answers.
#include <gtest/gtest.h>

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <fstream>
#include <set>
#include <sstream>

#include "cli/job_client.h"
#include "tests/integration/harness.h"
#include "tests/integration/process.h"

namespace tessera::testing {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs the `tessera` binary to its end; returns its exit status and output.
std::pair<int, std::string> RunCli(const TempDir& dir, std::vector<std::string> args,
                                   std::vector<std::string> env = {}) {
  static int runs = 0;
  const std::string log = (dir.path() / ("cli-" + std::to_string(++runs) + ".log")).string();
  args.insert(args.begin(), TESSERA_CLI_BIN);
  Process cli(args, log, env, {"TESSERA_COORDINATOR"});
  auto status = cli.WaitExit(std::chrono::seconds(60));
  if (!status) return {-1, ReadAll(log)};
  return {WIFEXITED(*status) ? WEXITSTATUS(*status) : -1, ReadAll(log)};
}

TEST(CliTest, RoundsShowsEveryWorkerAndNamesTheSlowest) {
  TempDir dir("cli-rounds");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "r" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  auto job = (*coordinator)->SubmitJob(SmallJob(2, 2, 2000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(60));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();

  std::ostringstream table;
  ASSERT_TRUE(cli::RoundsCommand(*stub, job->id(), std::nullopt, table).ok());
  const std::string text = table.str();
  EXPECT_NE(text.find("round 1 (attempt"), std::string::npos) << text;
  EXPECT_NE(text.find("round 2 (attempt"), std::string::npos) << text;
  // Round 2's critical path: the accepted report that arrived last, as the record names it.
  const auto& r2 = done.rounds(1);
  const std::string critical = r2.latency().critical_worker();
  ASSERT_FALSE(critical.empty());
  double last = -1;
  for (const auto& w : r2.workers()) last = std::max(last, w.reported_ms());
  for (const auto& w : r2.workers()) {
    if (w.worker_id() == critical) {
      EXPECT_EQ(w.reported_ms(), last) << "the critical worker reported last";
    }
    EXPECT_GT(w.data_load_ms(), 0) << w.worker_id();
    EXPECT_GT(w.download_done_ms(), 0) << w.worker_id();
  }
  const auto& l = r2.latency();
  const double named = l.selection_ms() + l.critical_download_ms() + l.critical_data_load_ms() +
                       l.critical_compute_ms() + l.critical_upload_ms() + l.after_last_report_ms() +
                       l.aggregation_ms() + l.evaluation_ms() + l.commit_ms();
  // The phases add up: "other" is what the named ones leave (none when they overlap).
  if (l.other_ms() > 0) {
    EXPECT_NEAR(named + l.other_ms(), l.total_ms(), 1e-6);
  } else {
    EXPECT_GE(named, l.total_ms() - 1e-6);
  }
  std::ostringstream one;
  ASSERT_TRUE(cli::RoundsCommand(*stub, job->id(), 2u, one).ok());
  EXPECT_EQ(one.str().find("round 1 "), std::string::npos) << one.str();
  for (const auto& w : r2.workers()) EXPECT_NE(one.str().find(w.worker_id()), std::string::npos) << one.str();
  const size_t marked = one.str().find("<- critical path (last report)");
  ASSERT_NE(marked, std::string::npos) << one.str();
  const size_t line = one.str().rfind('\n', marked);
  EXPECT_NE(one.str().substr(line, marked - line).find(critical), std::string::npos)
      << "the marked line is not " << critical << "'s:\n" << one.str();
  EXPECT_NE(one.str().find("critical path: selection"), std::string::npos) << one.str();

  // The trace: valid JSON, a track per worker, spans per phase.
  std::ostringstream trace;
  ASSERT_TRUE(cli::TraceCommand(*stub, job->id(), std::nullopt, trace).ok());
  google::protobuf::Struct parsed;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(trace.str(), &parsed).ok()) << trace.str();
  const auto& events = parsed.fields().at("traceEvents").list_value().values();
  std::set<std::string> threads, spans;
  for (const auto& e : events) {
    const auto& f = e.struct_value().fields();
    if (f.at("ph").string_value() == "M" && f.at("name").string_value() == "thread_name") {
      threads.insert(f.at("args").struct_value().fields().at("name").string_value());
    } else if (f.at("ph").string_value() == "X") {
      spans.insert(f.at("name").string_value());
      EXPECT_GE(f.at("ts").number_value(), 0) << trace.str();
    }
  }
  EXPECT_EQ(threads, (std::set<std::string>{"coordinator", "worker r1", "worker r2"}));
  for (const char* name : {"round 1", "round 2", "selection", "download", "data loading", "compute", "upload",
                           "evaluation", "commit"}) {
    EXPECT_TRUE(spans.count(name)) << name << " missing from\n" << trace.str();
  }
  std::ostringstream one_round;
  ASSERT_TRUE(cli::TraceCommand(*stub, job->id(), 2u, one_round).ok());
  EXPECT_EQ(one_round.str().find("\"round 1\""), std::string::npos);

  std::ostringstream missing;
  Status none = cli::RoundsCommand(*stub, job->id(), 7u, missing);
  EXPECT_EQ(none.code(), StatusCode::kNotFound);
  EXPECT_EQ(none.message(), "job " + job->id() + " has no committed round 7 (2 committed)");

  std::ostringstream json;
  ASSERT_TRUE(cli::JobsCommand(*stub, json, {.json = true}).ok());
  EXPECT_EQ(json.str().front(), '{') << json.str();
  EXPECT_NE(json.str().find("\"id\":\"" + job->id() + "\""), std::string::npos) << json.str();
  EXPECT_NE(json.str().find("\"state\":\"JOB_SUCCEEDED\""), std::string::npos) << json.str();
  EXPECT_EQ(json.str().find('\n'), json.str().size() - 1) << "one object on one line";
}

// Deadline selection with over-selection on real workers: every round takes all three for
// two wanted, closes once two updates are in, and a worker still training then is cancelled
// (the real worker stops) and shown as over-selected, not as a straggler. Which worker is
// last is the machine's business: each report is checked whatever its outcome.
TEST(CliTest, AnOverSelectedRoundClosesWithItsTargetAndRoundsShowsTheCancelledWorker) {
  TempDir dir("cli-over-selection");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 3; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "o" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 3, std::chrono::seconds(20)));
  v1::JobSpec spec = SmallJob(3, 3, 3000);
  spec.set_clients_per_round(2);
  spec.set_min_clients(2);
  spec.mutable_selection()->set_policy("deadline");
  spec.mutable_selection()->set_over_selection(0.5);
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(120));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 3);
  int over_selected = 0;
  for (const auto& r : done.rounds()) {
    EXPECT_EQ(r.attempt(), 1u) << "round " << r.round();
    EXPECT_EQ(r.clients_selected(), 3u) << "ceil(2 x 1.5) of the three";
    EXPECT_GE(r.clients_reported(), 2u);
    for (const auto& w : r.workers()) {
      if (w.outcome() == "accepted") continue;
      EXPECT_EQ(w.outcome(), "dropped: over-selected, the round had its 2 updates") << "round " << r.round();
      EXPECT_GT(w.dropped_ms(), 0);
      ++over_selected;
    }
  }
  std::ostringstream table;
  ASSERT_TRUE(cli::RoundsCommand(*stub, job->id(), std::nullopt, table).ok());
  size_t shown = 0;
  for (size_t at = table.str().find("the round had its updates (not a failure)"); at != std::string::npos;
       at = table.str().find("the round had its updates (not a failure)", at + 1)) {
    ++shown;
  }
  EXPECT_EQ(shown, static_cast<size_t>(over_selected)) << table.str();
  EXPECT_EQ(table.str().find("straggler"), std::string::npos) << table.str();
  // A cancelled worker's update that crossed the cancel is refused without counting against it.
  grpc::ClientContext ctx;
  v1::ListWorkersResponse listed;
  ASSERT_TRUE(stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &listed).ok());
  uint32_t completed = 0;
  for (const auto& w : listed.workers()) {
    EXPECT_EQ(w.updates_rejected(), 0u) << w.worker_id();
    completed += w.rounds_completed();
  }
  EXPECT_EQ(completed, 9u - over_selected);
}

TEST(CliTest, WorkersThatStoppedAreListedOnlyWithAll) {
  TempDir dir("cli-workers");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  auto stays = std::make_unique<WorkerThread>(address, "stays");
  auto leaves = std::make_unique<WorkerThread>(address, "leaves");
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  leaves.reset();
  ASSERT_TRUE(WaitUntil(
      [&] {
        grpc::ClientContext ctx;
        v1::ListWorkersResponse response;
        if (!stub->ListWorkers(&ctx, v1::ListWorkersRequest(), &response).ok()) return false;
        for (const auto& w : response.workers()) {
          if (w.worker_id() == "leaves" && !w.alive()) return true;
        }
        return false;
      },
      std::chrono::seconds(20)));
  std::ostringstream alive;
  ASSERT_TRUE(cli::WorkersCommand(*stub, alive).ok());
  EXPECT_NE(alive.str().find("stays"), std::string::npos) << alive.str();
  EXPECT_EQ(alive.str().find("leaves"), std::string::npos) << alive.str();
  EXPECT_NE(alive.str().find("1 worker no longer sending heartbeats not shown (tessera workers --all shows them)"),
            std::string::npos)
      << alive.str();
  EXPECT_NE(alive.str().find("LAST SEEN"), std::string::npos) << alive.str();
  std::ostringstream all;
  ASSERT_TRUE(cli::WorkersCommand(*stub, all, /*all=*/true).ok());
  EXPECT_NE(all.str().find("leaves"), std::string::npos) << all.str();
  EXPECT_NE(all.str().find("stays"), std::string::npos) << all.str();
}

TEST(CliTest, AWatchOutlivesACoordinatorRestartAndShowsEachRoundOnce) {
  TempDir dir("cli-watch");
  auto options = TestCoordinatorOptions(dir.str());
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const int port = (*coordinator)->port();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "v" + std::to_string(i)));
  auto stub = JobStub(port);
  ASSERT_TRUE(WaitForWorkers(*stub, 2, std::chrono::seconds(20)));
  // Forty rounds: the test sees round 1 committed by polling every 50 ms, and rounds of this
  // job took 15 ms on a fast machine, so a short job could end before the workers stop and
  // leave nothing to resume. Once they stop, the job waits for them.
  auto job = (*coordinator)->SubmitJob(SmallJob(40, 2, 2000));
  ASSERT_TRUE(job.ok()) << job.status().ToString();

  std::ostringstream watched;
  Status watch;
  std::thread watcher([&] {
    cli::WatchOptions w;
    w.reconnect_for = std::chrono::seconds(60);
    watch = cli::WatchCommand(*stub, job->id(), watched, w);
  });
  ASSERT_TRUE(WaitUntil([&] { return (*coordinator)->GetJob(job->id()).ok() &&
                                     (*coordinator)->GetJob(job->id())->rounds_committed() >= 1; },
                        std::chrono::seconds(60)));
  // The workers stop first, so that the job cannot run to its end before the restart; they
  // come back to the restarted coordinator under the same names.
  workers.clear();
  (*coordinator)->Shutdown();
  coordinator->reset();
  options.listen_address = address;  // where the workers and the watch look for it
  auto restarted = server::Coordinator::Start(options);
  ASSERT_TRUE(restarted.ok()) << restarted.status().ToString();
  for (int i = 1; i <= 2; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "v" + std::to_string(i)));
  watcher.join();
  ASSERT_TRUE(watch.ok()) << watch.ToString() << "\n" << watched.str();
  const std::string text = watched.str();
  EXPECT_NE(text.find("lost the coordinator; reconnecting"), std::string::npos) << text;
  EXPECT_NE(text.find("reconnected to the coordinator"), std::string::npos) << text;
  EXPECT_NE(text.find("final test accuracy"), std::string::npos) << text;
  for (int r = 1; r <= 4; ++r) {
    // Each round's row starts with its number, right-aligned in five columns.
    const std::string row = "\n    " + std::to_string(r) + " ";
    const size_t first = text.find(row);
    ASSERT_NE(first, std::string::npos) << "round " << r << " missing:\n" << text;
    const size_t summary = text.find("final test accuracy");
    EXPECT_EQ(text.substr(0, summary).find(row, first + 1), std::string::npos) << "round " << r << " twice:\n" << text;
  }
}

TEST(CliTest, TheBinaryHelpsPerCommandAndHintsWhenNoCoordinatorAnswers) {
  TempDir dir("cli-binary");
  auto [help_code, help] = RunCli(dir, {"watch", "-h"});
  EXPECT_EQ(help_code, 0) << help;
  EXPECT_NE(help.find("Usage: tessera watch JOB"), std::string::npos) << help;
  EXPECT_NE(help.find("--json"), std::string::npos) << help;
  EXPECT_NE(help.find("Connection flags:"), std::string::npos) << help;
  EXPECT_EQ(help.find("--coordinator-host"), std::string::npos) << "provision's flags are not watch's:\n" << help;
  // Every flag's help stays in its column: a line of a flag list starts with a space.
  for (const char* command : {"devices", "align", "watch", "provision"}) {
    auto [code, text] = RunCli(dir, {command, "--help"});
    EXPECT_EQ(code, 0) << text;
    std::istringstream lines(text.substr(text.find("Flags:")));
    for (std::string line; std::getline(lines, line);) {
      if (line.empty() || line.back() == ':') continue;
      EXPECT_EQ(line.front(), ' ') << command << ": a help line out of its column: " << line;
    }
  }
  auto [help2_code, help2] = RunCli(dir, {"help", "rounds"});
  EXPECT_EQ(help2_code, 0) << help2;
  EXPECT_NE(help2.find("Usage: tessera rounds JOB"), std::string::npos) << help2;
  auto [version_code, version] = RunCli(dir, {"--version"});
  EXPECT_EQ(version_code, 0) << version;
  EXPECT_EQ(version.rfind("tessera ", 0), 0u) << version;
  auto [version_help_code, version_help] = RunCli(dir, {"version", "--help"});
  EXPECT_EQ(version_help_code, 0) << version_help;
  EXPECT_NE(version_help.find("Usage: tessera version"), std::string::npos) << version_help;
  // A local command's own error, said once after its name.
  auto [threshold_code, threshold] = RunCli(dir, {"align", "--a", "cpu", "--b", "cpu", "--threshold", "0"});
  EXPECT_EQ(threshold_code, 2) << threshold;
  EXPECT_NE(threshold.find("tessera align: --threshold: expected a positive finite number, got 0"), std::string::npos)
      << threshold;
  auto [unknown_code, unknown] = RunCli(dir, {"wacth", "job-1"});
  EXPECT_EQ(unknown_code, 2);
  EXPECT_NE(unknown.find("unknown command 'wacth' (tessera help lists them)"), std::string::npos) << unknown;
  // A job id or worker name that is no name is a typo: refused, and shown escaped.
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--insecure", "status", "job-1\x1b[2J"}, "tessera status: job 'job-1\\x1b[2J': expected 1 to 64 letters"},
           {{"--insecure", "watch", std::string(65, 'j')}, "tessera watch: job 'jjjj"},
           {{"--insecure", "workers", "forget", "a b"}, "tessera workers: worker 'a b': expected 1 to 128 letters"}}) {
    auto [name_code, name_said] = RunCli(dir, args);
    EXPECT_EQ(name_code, 2) << name_said;
    EXPECT_NE(name_said.find(says), std::string::npos) << name_said;
    EXPECT_EQ(name_said.find('\x1b'), std::string::npos) << name_said;
  }
  // A remote command's usage error is said as one before its connection's settings are looked
  // at (here there are none: no --tls-dir, no --insecure).
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"export", "job-1", "-o", "model.txt"}, "tessera export: -o 'model.txt': expected a file ending in .npz"},
           {{"workers", "forget"}, "tessera workers: expected forget and one argument, the worker's name, got 1"},
           {{"status"}, "tessera status: expected one argument, the job id, got 0"},
           {{"trace", "job-1"}, "tessera trace: give the file to write with -o FILE"}}) {
    auto [usage_code, usage] = RunCli(dir, args);
    EXPECT_EQ(usage_code, 2) << usage;
    EXPECT_NE(usage.find(says), std::string::npos) << usage;
    EXPECT_EQ(usage.find("verified with TLS"), std::string::npos) << usage;
  }
  auto [stray_code, stray] = RunCli(dir, {"jobs", "--round", "3"});
  EXPECT_EQ(stray_code, 2);
  EXPECT_NE(stray.find("--round does not apply"), std::string::npos) << stray;

  auto [bench_help_code, bench_help] = RunCli(dir, {"bench", "collectives", "--help"});
  EXPECT_EQ(bench_help_code, 0) << bench_help;
  EXPECT_NE(bench_help.find("Usage: tessera bench collectives"), std::string::npos) << bench_help;
  auto [bench_typo_code, bench_typo] = RunCli(dir, {"bench", "collectives", "--ranks", "2,x"});
  EXPECT_EQ(bench_typo_code, 2) << bench_typo;
  EXPECT_NE(bench_typo.find("flag --ranks: expected comma-separated integers from 1 to 64, got '2,x'"), std::string::npos)
      << bench_typo;
  // --all lists the stopped workers too; with forget it is a mistake, not ignored.
  auto [forget_all_code, forget_all] = RunCli(dir, {"workers", "forget", "w1", "--all"});
  EXPECT_EQ(forget_all_code, 2) << forget_all;
  EXPECT_NE(forget_all.find("tessera workers forget: --all applies to the list"), std::string::npos) << forget_all;
  // `tessera bench --help` is bench's help, as `tessera CMD --help` is every command's.
  auto [bench_flag_code, bench_flag] = RunCli(dir, {"bench", "--help"});
  EXPECT_EQ(bench_flag_code, 0) << bench_flag;
  EXPECT_NE(bench_flag.find("Usage: tessera bench collectives"), std::string::npos) << bench_flag;

  // mpirun's variables are checked as a flag is; --store-dir is for mpirun's ranks alone.
  const std::vector<std::string> tiny{"bench", "collectives", "--backends", "p2p", "--min-bytes", "4",
                                      "--max-bytes", "4", "--store-dir", (dir.path() / "store").string()};
  const std::vector<std::pair<std::vector<std::string>, std::string>> worlds = {
      {{}, "--store-dir is for ranks launched by mpirun, and OMPI_COMM_WORLD_SIZE is unset"},
      {{"OMPI_COMM_WORLD_SIZE=four", "OMPI_COMM_WORLD_RANK=0"},
       "OMPI_COMM_WORLD_SIZE: expected 1 to 1048576, got 'four'"},
      {{"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=2"}, "OMPI_COMM_WORLD_RANK: expected 0 to 1, got '2'"},
      {{"OMPI_COMM_WORLD_RANK=0"}, "OMPI_COMM_WORLD_RANK is set without OMPI_COMM_WORLD_SIZE"},
  };
  for (const auto& [env, says] : worlds) {
    auto [world_code, world] = RunCli(dir, tiny, env);
    EXPECT_EQ(world_code, 2) << world;
    EXPECT_NE(world.find("tessera bench collectives: " + says), std::string::npos) << world;
  }
  std::vector<std::string> ranks = tiny;
  ranks.insert(ranks.end(), {"--ranks", "2"});
  auto [ranks_code, ranks_said] = RunCli(dir, ranks, {"OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=0"});
  EXPECT_EQ(ranks_code, 2) << ranks_said;
  EXPECT_NE(ranks_said.find("--ranks is for ranks forked here; under mpirun the rank count is mpirun's"),
            std::string::npos)
      << ranks_said;
  // A directory whose name breaks the text report's lines and looks like its notes: each
  // object still names it whole.
  const std::string provision_out = (dir.path() / "made (\nhere)").string();
  auto [provision_code, provisioned] =
      RunCli(dir, {"provision", "--out", provision_out, "--coordinator-host", "localhost",
                   "--workers", "a", "--operators", "o", "--json"});
  EXPECT_EQ(provision_code, 0) << provisioned;
  size_t objects = 0;
  std::istringstream lines(provisioned);
  for (std::string line; std::getline(lines, line);) {
    google::protobuf::Struct identity;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(line, &identity).ok()) << line;
    EXPECT_TRUE(identity.fields().at("made").bool_value()) << line;
    EXPECT_EQ(identity.fields().at("dir").string_value().rfind(provision_out + "/", 0), 0u) << line;
    EXPECT_EQ(identity.fields().at("note").string_value().rfind("made", 0), 0u) << line;
    ++objects;
  }
  EXPECT_EQ(objects, 4u) << "the CA, the coordinator, a worker and an operator:\n" << provisioned;

  // A port nothing listens on: bind one, note it, close it.
  int port = 0;
  {
    auto coordinator = server::Coordinator::Start(TestCoordinatorOptions((dir.path() / "gone").string()));
    ASSERT_TRUE(coordinator.ok());
    port = (*coordinator)->port();
  }
  const std::string pki = TestPki::Get().WriteOperatorDir((dir.path() / "pki").string());
  auto [code, text] = RunCli(dir, {"--tls-dir", pki, "jobs"}, {"TESSERA_COORDINATOR=127.0.0.1:" + std::to_string(port)});
  EXPECT_EQ(code, 1) << text;
  EXPECT_NE(text.find("no coordinator answered at 127.0.0.1:" + std::to_string(port) + " (from $TESSERA_COORDINATOR)"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("--coordinator HOST:PORT or TESSERA_COORDINATOR=HOST:PORT"), std::string::npos) << text;
  // A submit that fails names the spec's file as the user gave it, escaped.
  const std::string spec = (dir.path() / "job\x1b[2J.toml").string();
  std::ofstream(spec) << "name = \"t\"\nrounds = 2\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n";
  auto [submit_code, submitted] =
      RunCli(dir, {"--tls-dir", pki, "submit", spec}, {"TESSERA_COORDINATOR=127.0.0.1:" + std::to_string(port)});
  EXPECT_EQ(submit_code, 1) << submitted;
  EXPECT_EQ(submitted.find('\x1b'), std::string::npos) << submitted;
  EXPECT_NE(submitted.find("tessera: submit '" + (dir.path() / "job\\x1b[2J.toml").string() + "': "), std::string::npos)
      << submitted;
}

// A local command's usage error exits 2, as a remote one's does, with one message that names
// the command once.
TEST(CliTest, ALocalCommandsUsageErrorExitsTwo) {
  TempDir dir("cli-usage");
  for (const auto& [args, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"devices", "--model", "mlp", "--json"},
            "tessera devices: --json lists the devices without a risk list; drop --model or --json\n"},
           {{"devices", "--device", "tpu"}, "tessera devices: unknown device 'tpu'; known devices: "},
           {{"provision", "--coordinator-host", "localhost", "--workers", "a"},
            "tessera provision: --out is required: the directory to write into\n"},
           {{"provision", "--out", (dir.path() / "pki").string(), "--coordinator-host", "localhost", "--workers",
             "a,a"},
            "tessera provision: --workers: 'a' is listed twice\n"}}) {
    auto [code, said] = RunCli(dir, args);
    EXPECT_EQ(code, 2) << said;
    EXPECT_EQ(said.rfind(says, 0), 0u) << said;
    EXPECT_EQ(said.find("devices: devices:"), std::string::npos) << said;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "pki")) << "nothing is written for a usage error";
}

}  // namespace
}  // namespace tessera::testing
