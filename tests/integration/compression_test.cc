// [compression] end to end: a coordinator on port 0 and three workers on threads over gRPC,
// one short job per encoding on real Fashion-MNIST. Every round commits with every update
// accepted; the bytes the round records for its updates shrink by the encoding's ratio to
// float32 (counted exactly from the model's layout); the models sent are the same whatever
// the encoding; and the model learns. A model sent compressed (`download`) likewise: inside
// the tasks and by DownloadModel, the bytes each worker downloads are the encoding's.
#include <gtest/gtest.h>

#include <cstdio>
#include <sstream>

#include "cli/job_client.h"
#include "core/model/model.h"
#include "core/update_codec.h"
#include "proto/job_mapping.h"
#include "tests/integration/harness.h"

namespace tessera::testing {
namespace {

constexpr uint32_t kRounds = 3;
constexpr uint32_t kWorkers = 3;

struct Encoded {
  const char* name;
  v1::Encoding encoding;
  double fraction;
};

TEST(CompressionJobTest, EachEncodingCommitsAndSendsFewerBytes) {
  TempDir dir("compression");
  auto options = TestCoordinatorOptions(dir.str());
  options.chunk_bytes = 16384;
  auto coordinator = server::Coordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  std::vector<std::unique_ptr<WorkerThread>> workers;
  for (uint32_t i = 1; i <= kWorkers; ++i) workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i)));
  auto stub = JobStub((*coordinator)->port());
  ASSERT_TRUE(WaitForWorkers(*stub, kWorkers, std::chrono::seconds(30)));

  const v1::JobSpec base = SmallJob(kRounds, kWorkers, 3000);
  // The MLP's tensors (784x64, 64, 64x10, 10): what each encoding sends of them, by hand.
  auto parameters = CountParameters(wire::ToModelConfig(base));
  ASSERT_TRUE(parameters.ok());
  const uint64_t n = static_cast<uint64_t>(*parameters);
  ASSERT_EQ(n, 784u * 64 + 64 + 64 * 10 + 10);
  const uint64_t float32_bytes = 4 * n;                            // per update
  const uint64_t int8_bytes = n + 4 * 4;                           // a scale per tensor
  const uint64_t topk_bytes = 8 * (502 + 1 + 7 + 1);               // ceil(1% of each tensor) pairs
  const Encoded encodings[] = {{"float32", v1::ENCODING_FLOAT32, 0},
                               {"float16", v1::ENCODING_FLOAT16, 0},
                               {"bfloat16", v1::ENCODING_BFLOAT16, 0},
                               {"int8", v1::ENCODING_INT8, 0},
                               {"topk", v1::ENCODING_TOPK, 0.01}};
  const std::map<std::string, uint64_t> expected_update = {{"float32", float32_bytes}, {"float16", float32_bytes / 2},
                                                           {"bfloat16", float32_bytes / 2}, {"int8", int8_bytes},
                                                           {"topk", topk_bytes}};
  std::map<std::string, double> accuracy;
  std::map<std::string, uint64_t> round_upload;
  for (const Encoded& e : encodings) {
    SCOPED_TRACE(e.name);
    v1::JobSpec spec = base;
    spec.set_name(std::string("compression-") + e.name);
    spec.mutable_compression()->set_encoding(e.encoding);
    spec.mutable_compression()->set_fraction(e.fraction);
    auto job = (*coordinator)->SubmitJob(spec);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    const v1::GetJobResponse done = WaitForJob(*stub, job->id(), std::chrono::seconds(600));
    std::string log = done.job().error();
    for (const auto& r : done.rounds()) {
      for (const auto& w : r.workers()) log += "\nround " + std::to_string(r.round()) + " " + w.worker_id() + ": " + w.outcome();
    }
    ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << log;
    ASSERT_EQ(done.rounds_size(), static_cast<int>(kRounds)) << log;
    for (const auto& r : done.rounds()) {
      EXPECT_EQ(r.clients_reported(), kWorkers) << log;
      uint64_t workers_sum = 0;
      for (const auto& w : r.workers()) {
        EXPECT_EQ(w.outcome(), "accepted") << log;
        EXPECT_EQ(w.upload_bytes(), expected_update.at(e.name)) << w.worker_id();
        EXPECT_EQ(w.download_bytes(), float32_bytes) << w.worker_id() << ": the model travels in float32";
        workers_sum += w.upload_bytes();
      }
      EXPECT_EQ(r.upload_bytes(), workers_sum);
      EXPECT_EQ(r.upload_bytes(), kWorkers * expected_update.at(e.name));
      EXPECT_EQ(r.download_bytes(), kWorkers * float32_bytes);
    }
    round_upload[e.name] = done.rounds(0).upload_bytes();
    if (e.encoding == v1::ENCODING_TOPK) {
      // What the operator sees: the encoding in `tessera status`, the bytes in its rows and in
      // `tessera rounds`.
      std::ostringstream status, rounds;
      ASSERT_TRUE(cli::StatusCommand(*stub, job->id(), status).ok());
      EXPECT_NE(status.str().find("updates:   topk (fraction 0.01, with error feedback)"), std::string::npos)
          << status.str();
      const std::string row = cli::RoundRow(done.rounds(0));
      EXPECT_NE(status.str().find(row), std::string::npos) << status.str();
      char kib[64];
      std::snprintf(kib, sizeof(kib), "%.1f KiB of updates accepted", done.rounds(0).upload_bytes() / 1024.0);
      ASSERT_TRUE(cli::RoundsCommand(*stub, job->id(), 1u, rounds).ok());
      EXPECT_NE(rounds.str().find(kib), std::string::npos) << rounds.str();
      std::snprintf(kib, sizeof(kib), "%9.1f", done.rounds(0).upload_bytes() / 1024.0);
      EXPECT_NE(row.find(kib), std::string::npos) << row;
    }
    const auto& first = done.rounds(0);
    const auto& last = done.rounds(static_cast<int>(kRounds) - 1);
    accuracy[e.name] = last.test_accuracy();
    EXPECT_GT(last.test_accuracy(), first.test_accuracy()) << log;
  }
  for (const Encoded& e : encodings) {
    std::printf("%-8s %8llu update bytes a round (%.4f of float32), accuracy %.2f%% after %u rounds\n", e.name,
                static_cast<unsigned long long>(round_upload[e.name]),
                static_cast<double>(round_upload[e.name]) / static_cast<double>(round_upload["float32"]),
                100 * accuracy[e.name], kRounds);
  }
  // The ratios to float32, as docs/JOBS.md gives them: 1/2, 1/2, about 1/4, about 2%.
  const double float32 = static_cast<double>(round_upload["float32"]);
  EXPECT_DOUBLE_EQ(round_upload["float16"] / float32, 0.5);
  EXPECT_DOUBLE_EQ(round_upload["bfloat16"] / float32, 0.5);
  EXPECT_GT(round_upload["int8"] / float32, 0.25);
  EXPECT_LT(round_upload["int8"] / float32, 0.2501);
  EXPECT_GT(round_upload["topk"] / float32, 0.019);
  EXPECT_LT(round_upload["topk"] / float32, 0.021);
  // The dense encodings learn as float32 does; top-k at 1% learns, more slowly.
  for (const char* dense : {"float32", "float16", "bfloat16", "int8"}) {
    EXPECT_GT(accuracy[dense], 0.65) << dense;
    EXPECT_NEAR(accuracy[dense], accuracy["float32"], 0.03) << dense;
  }
  EXPECT_GT(accuracy["topk"], 0.3);
}

// The model sent in float16 inside the tasks (the MLP's 203,560 bytes fit them), then in int8
// by DownloadModel (no model inside a task): each round commits, each worker's download is the
// encoding's bytes, the updates stay float32, and the model learns.
TEST(CompressionJobTest, AModelSentCompressedCommitsAndEachWorkerDownloadsTheEncodingsBytes) {
  struct Case {
    const char* name;
    v1::Encoding download;
    uint64_t inline_model_bytes;
  };
  for (const Case& c : {Case{"float16", v1::ENCODING_FLOAT16, uint64_t{256} << 10}, Case{"int8", v1::ENCODING_INT8, 0}}) {
    SCOPED_TRACE(c.name);
    TempDir dir(std::string("download-") + c.name);
    auto options = TestCoordinatorOptions(dir.str());
    options.chunk_bytes = 16384;
    options.runner.inline_model_bytes = c.inline_model_bytes;
    auto coordinator = server::Coordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
    const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
    std::vector<std::unique_ptr<WorkerThread>> workers;
    for (uint32_t i = 1; i <= kWorkers; ++i) {
      workers.push_back(std::make_unique<WorkerThread>(address, "w" + std::to_string(i)));
    }
    auto stub = JobStub((*coordinator)->port());
    ASSERT_TRUE(WaitForWorkers(*stub, kWorkers, std::chrono::seconds(30)));

    v1::JobSpec spec = SmallJob(kRounds, kWorkers, 3000);
    spec.set_name(std::string("download-") + c.name);
    spec.mutable_compression()->set_download(c.download);
    auto parameters = CountParameters(wire::ToModelConfig(spec));
    ASSERT_TRUE(parameters.ok());
    const uint64_t n = static_cast<uint64_t>(*parameters);
    const uint64_t download = c.download == v1::ENCODING_FLOAT16 ? 2 * n : n + 4 * 4;  // int8: a scale per tensor
    auto job = (*coordinator)->SubmitJob(spec);
    ASSERT_TRUE(job.ok()) << job.status().ToString();
    const v1::GetJobResponse done = WaitForJob(*stub, job->id(), std::chrono::seconds(600));
    std::string log = done.job().error();
    for (const auto& r : done.rounds()) {
      for (const auto& w : r.workers()) log += "\nround " + std::to_string(r.round()) + " " + w.worker_id() + ": " + w.outcome();
    }
    ASSERT_EQ(done.job().state(), v1::JOB_SUCCEEDED) << log;
    ASSERT_EQ(done.rounds_size(), static_cast<int>(kRounds)) << log;
    for (const auto& r : done.rounds()) {
      EXPECT_EQ(r.clients_reported(), kWorkers) << log;
      for (const auto& w : r.workers()) {
        EXPECT_EQ(w.outcome(), "accepted") << log;
        EXPECT_EQ(w.download_bytes(), download) << w.worker_id();
        EXPECT_EQ(w.upload_bytes(), 4 * n) << w.worker_id() << ": the updates travel in float32";
      }
      EXPECT_EQ(r.download_bytes(), kWorkers * download);
    }
    std::ostringstream status;
    ASSERT_TRUE(cli::StatusCommand(*stub, job->id(), status).ok());
    EXPECT_NE(status.str().find(std::string("downloads: ") + c.name + " (the model as sent to the workers"),
              std::string::npos)
        << status.str();
    const double accuracy = done.rounds(static_cast<int>(kRounds) - 1).test_accuracy();
    std::printf("model sent in %-8s %8llu bytes a worker (%.4f of float32), accuracy %.2f%% after %u rounds\n", c.name,
                static_cast<unsigned long long>(download), static_cast<double>(download) / (4.0 * n), 100 * accuracy,
                kRounds);
    EXPECT_GT(accuracy, done.rounds(0).test_accuracy()) << log;
    EXPECT_GT(accuracy, 0.65) << log;
  }
}

}  // namespace
}  // namespace tessera::testing
