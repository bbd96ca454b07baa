// External trainers (worker/external_trainer.h, python/tessera_client): real workers that hand
// each round to a child process. The PyTorch example (examples/pytorch/train_mcmahan.py)
// federated over ten workers; and trainers that crash, hang, reply garbage, send a model of
// the wrong shape, or refuse, each a clear per-worker outcome in the round record while the
// round commits with the well-behaved ones.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "cli/job_spec.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

const std::string kSource = TESSERA_SOURCE_DIR;

// The trainers import tessera_client from the source tree, as `pip install ./python` would.
void UseSourcePythonPackage() { setenv("PYTHONPATH", (kSource + "/python").c_str(), 1); }

worker::WorkerOptions WithTrainer(const std::string& flag) {
  worker::WorkerOptions options;
  auto command = worker::ParseTrainerFlag(flag);
  EXPECT_TRUE(command.ok()) << command.status().ToString();
  options.trainers.push_back(*command);
  return options;
}

// A trainer's program is checked at the worker's start, as posix_spawnp would look it up.
TEST(ExternalTrainerTest, TheProgramIsAnExecutableFileByPathOrInPath) {
  auto command = worker::ParseTrainerFlag("t=sh -c true");
  ASSERT_TRUE(command.ok());
  EXPECT_TRUE(worker::CheckTrainerProgram(*command, "/nonexistent:/bin:/usr/bin").ok());
  Status missing = worker::CheckTrainerProgram(*command, "/nonexistent::");
  EXPECT_EQ(missing.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(missing.message().find("--trainer t: the program 'sh' is not an executable file in any directory of PATH "
                                   "('/nonexistent::')"),
            std::string::npos)
      << missing.message();
  command->argv[0] = "/bin/sh";
  EXPECT_TRUE(worker::CheckTrainerProgram(*command, "").ok());
  TempDir dir("trainer-program");
  const std::string plain = dir.str() + "/train.py";  // a file, not executable
  std::ofstream(plain) << "print('hi')\n";
  std::filesystem::permissions(plain, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  command->argv[0] = plain;
  EXPECT_NE(worker::CheckTrainerProgram(*command, "").message().find("train.py' is not an executable file"),
            std::string::npos);
  command->argv[0] = "/bin";  // a directory
  EXPECT_FALSE(worker::CheckTrainerProgram(*command, "").ok());
}

TEST(ExternalTrainerTest, ThePyTorchMcMahanExampleTrainsFederatedOverTenWorkers) {
  if (!SystemPythonHas("torch, numpy")) {
    GTEST_SKIP() << "Debian's python3-torch is not installed (/usr/bin/python3 cannot import torch); scripts/setup.sh "
                    "installs it";
  }
  UseSourcePythonPackage();
  TempDir dir("external-torch");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (int i = 1; i <= 10; ++i) {
    workers.push_back(std::make_unique<WorkerThread>(
        address, "torch" + std::to_string(i),
        WithTrainer("pytorch=/usr/bin/python3 " + kSource + "/examples/pytorch/train_mcmahan.py")));
  }
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, 10, std::chrono::seconds(30)));
  auto spec = ParseJobSpecFile(kSource + "/examples/pytorch-mcmahan.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  spec->set_rounds(2);
  spec->set_min_clients(10);
  spec->mutable_data()->set_max_train_samples(3000);
  spec->mutable_data()->set_max_test_samples(1000);
  auto job = (*coordinator)->SubmitJob(*spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(600));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 2);
  for (const auto& round : done.rounds()) {
    EXPECT_EQ(round.clients_reported(), 10u);
    for (const auto& w : round.workers()) {
      EXPECT_EQ(w.outcome(), "accepted") << w.worker_id();
      EXPECT_EQ(w.samples(), 300u) << w.worker_id();
      EXPECT_GT(w.train_loss(), 0.0) << w.worker_id();
    }
  }
  // Trained in PyTorch, evaluated by the coordinator's native model of the same layout.
  EXPECT_GT(done.rounds(1).test_accuracy(), 0.5);
  EXPECT_GT(done.rounds(1).test_accuracy(), done.rounds(0).test_accuracy() - 0.02);
}

TEST(ExternalTrainerTest, ATrainerThatCrashesHangsOrRepliesBadlyFailsOnlyItsWorkerAndSaysWhy) {
  if (!SystemPythonHas("numpy")) {
    GTEST_SKIP() << "Debian's python3-numpy is not installed (/usr/bin/python3 cannot import numpy); scripts/setup.sh "
                    "installs it";
  }
  UseSourcePythonPackage();
  TempDir dir("external-bad");
  auto coordinator = server::Coordinator::Start(TestCoordinatorOptions(dir.str()));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  const std::string script = "/usr/bin/python3 " + kSource + "/tests/integration/trainers/misbehaving.py ";
  const std::vector<std::string> modes = {"identity", "identity", "crash",  "hang",
                                          "garbage",  "shape",    "refuse", "nanloss"};
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (size_t i = 0; i < modes.size(); ++i) {
    workers.push_back(std::make_unique<WorkerThread>(address, "x" + std::to_string(i) + "-" + modes[i],
                                                     WithTrainer("custom=" + script + modes[i])));
  }
  // A worker without the trainer the job names.
  workers.push_back(std::make_unique<WorkerThread>(address, "x8-none"));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, modes.size() + 1, std::chrono::seconds(30)));
  v1::JobSpec spec = SmallJob(1, static_cast<uint32_t>(modes.size() + 1), 800);
  spec.mutable_model()->set_trainer("custom");
  spec.set_min_clients(2);
  spec.set_max_round_attempts(1);
  spec.set_round_deadline_ms(15000);  // the hanging trainer is stopped here
  auto job = (*coordinator)->SubmitJob(spec);
  ASSERT_TRUE(job.ok()) << job.status().ToString();
  auto done = WaitForJob(*stub, job->id(), std::chrono::seconds(120));
  ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << done.job().error();
  ASSERT_EQ(done.rounds_size(), 1);
  std::map<std::string, std::string> outcome;
  for (const auto& w : done.rounds(0).workers()) outcome[w.worker_id()] = w.outcome();
  EXPECT_EQ(outcome["x0-identity"], "accepted");
  EXPECT_EQ(outcome["x1-identity"], "accepted");
  auto expect = [&](const std::string& worker, const std::vector<std::string>& parts) {
    for (const auto& part : parts) {
      EXPECT_NE(outcome[worker].find(part), std::string::npos) << worker << ": " << outcome[worker];
    }
  };
  expect("x2-crash", {"failed: ", "external trainer 'custom'", "exited with status 3"});
  expect("x3-hang", {"dropped"});  // past the deadline the coordinator no longer waits; the worker kills it
  expect("x4-garbage", {"failed: ", "not a JSON object", "this is not json"});
  expect("x5-shape", {"failed: ", "its trained model", "shape"});
  // Its message is far longer than a reply line may be: tessera_client cuts it, so it arrives.
  expect("x6-refuse", {"failed: ", "could not train", "no GPU memory left for this round"});
  // A loss that is not a number is refused by tessera_client before anything is sent (JSON
  // has no NaN), so the trainer can say so.
  expect("x7-nanloss", {"failed: ", "could not train", "loss must be a finite number, got nan"});
  expect("x8-none", {"failed: ", "does not run", "--trainer flags: none"});
}

}  // namespace
}  // namespace tessera::testing
