// The external trainer's overhead per round against the native path, on the same model.
//
// Native: a worker moves the global model into its trainer (Model::SetState) and the trained
// model out (GetState) and computes the delta. External: the same model handed to a child
// process as an .npz (with the worker's share, written once), the process reads it and writes
// it back unchanged (python/tessera_client, no training: only the hand-over is timed), and
// the worker reads and checks it. Both run ROUNDS times on the same model; medians printed.
//
//   bench_external_trainer [--model mcmahan-cnn] [--rounds 10] [--samples 600]
//       [--python /usr/bin/python3] [--source DIR]   (DIR: the source tree, for python/)
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "base/flags.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "device/cpu/factory.h"
#include "worker/external_trainer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double MillisSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tessera;
  std::string model_name = "mcmahan-cnn", python = "/usr/bin/python3", source = TESSERA_SOURCE_DIR;
  int64_t rounds = 10, samples = 600;
  FlagSet flags;
  flags.String("model", &model_name, "the model: simplecnn, mlp or mcmahan-cnn");
  flags.Int("rounds", &rounds, "rounds to time", IntRange{2, 1000});
  flags.Int("samples", &samples, "images in the worker's share", IntRange{1, 60000});
  flags.String("python", &python, "the interpreter that runs the external trainer");
  flags.String("source", &source, "the source tree (for python/ and bench/identity_trainer.py)");
  if (Status s = flags.ParseFlagsOnly(argc, argv); !s.ok()) {
    std::cerr << "bench_external_trainer: " << s.message() << "\n";
    return 2;
  }
  auto device = CreateCpuDevice();
  ModelConfig config;
  config.name = model_name;
  auto model = CreateModel(config, device.get());
  if (!model.ok()) {
    std::cerr << model.status().message() << "\n";
    return 1;
  }
  const TensorSet global = (*model)->GetState().value();
  auto data = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/true);
  Dataset share;
  if (data.ok()) {
    share = std::move(data).value();
    share.count = std::min<int64_t>(share.count, samples);
    share.images.resize(static_cast<size_t>(share.count * share.SampleSize()));
    share.labels.resize(static_cast<size_t>(share.count));
  } else {
    share.count = samples;
    share.rows = share.cols = 28;
    share.images.assign(static_cast<size_t>(samples * 784), 0.5f);
    share.labels.assign(static_cast<size_t>(samples), 1);
  }

  // Native: in and out of the trainer, and the delta.
  std::vector<double> native;
  for (int64_t r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    if (Status s = (*model)->SetState(global); !s.ok()) return 1;
    TensorSet delta = DeltaFrom((*model)->GetState().value(), global);
    (void)delta;
    native.push_back(MillisSince(start));
  }

  // External: the same through a child process.
  setenv("PYTHONPATH", (source + "/python").c_str(), 1);
  std::string dir = (std::filesystem::temp_directory_path() / "tessera-bench-trainer.XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) return 1;
  auto command = worker::ParseTrainerFlag("identity=" + python + " " + source + "/bench/identity_trainer.py");
  if (!command.ok()) return 1;
  std::vector<double> handover, trainer, takeback, total;
  double first_round = 0;
  {
    worker::ExternalTrainer external(*command, dir);
    for (int64_t r = 0; r < rounds + 1; ++r) {
      worker::ExternalTrainerRequest request;
      request.job_id = "bench";
      request.round = static_cast<uint32_t>(r + 1);
      const auto start = Clock::now();
      auto result = external.Train(request, global, share, "share", Clock::now() + std::chrono::minutes(5), nullptr);
      if (!result.ok()) {
        std::cerr << result.status().message() << "\n";
        return 1;
      }
      const double ms = MillisSince(start);
      if (r == 0) {
        first_round = ms;  // starting the interpreter and writing the share
        continue;
      }
      handover.push_back(result->handover_ms);
      trainer.push_back(result->train_ms);
      takeback.push_back(result->takeback_ms);
      total.push_back(ms);
    }
  }
  std::filesystem::remove_all(dir);
  uint64_t bytes = 0;
  for (const auto& t : global) bytes += t.ByteSize();
  std::printf("model=%s parameters=%lld bytes=%llu share_samples=%lld rounds=%lld\n", model_name.c_str(),
              static_cast<long long>(TotalElements(global)), static_cast<unsigned long long>(bytes),
              static_cast<long long>(share.count), static_cast<long long>(rounds));
  std::printf("native: model in and out and the delta, median %.2f ms per round\n", Median(native));
  std::printf("external: median %.2f ms per round (writing the model %.2f ms, the process reading it, replying "
              "and writing it back %.2f ms, reading and checking it %.2f ms); first round %.0f ms (starting the "
              "process, writing the share)\n",
              Median(total), Median(handover), Median(trainer), Median(takeback), first_round);
  std::printf("external overhead per round = %.2f ms more than native (%.1fx)\n", Median(total) - Median(native),
              Median(total) / std::max(Median(native), 1e-3));
  return 0;
}
