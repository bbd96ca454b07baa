// Local-training throughput of a model (SimpleCNN by default, the McMahan CNN, or resnet8 on random
// 3x32x32 data) on one CPU core (OpenBLAS with one thread): batch 64,
// SGD lr 0.01 momentum 0.9 weight decay 1e-5, on real Fashion-MNIST batches when the dataset
// is installed (random data of the same shape otherwise; the output says which).
//
//   bench_train_throughput [--model simplecnn|mcmahan-cnn|resnet8] [--steps N] [--warmup N] [--threads N] [--data DIR]
//
// Prints: "tessera_<model> samples_per_s=<float> steps=<n> data=<fashion-mnist|random>".
// bench/train_throughput.sh runs this and the PyTorch reference and prints the ratio.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>

#include "base/flags.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"

namespace {

tessera::Dataset RandomDataset(int64_t count, int channels = 1, int size = 28) {
  tessera::Dataset data;
  data.source = "random";
  data.count = count;
  data.channels = channels;
  data.rows = data.cols = size;
  std::mt19937 engine(7);
  std::normal_distribution<float> pixel;
  data.images.resize(count * channels * size * size);
  for (float& value : data.images) value = pixel(engine);
  data.labels.resize(count);
  for (auto& label : data.labels) label = static_cast<uint8_t>(engine() % 10);
  return data;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t steps = 300, warmup = 30, threads = 1;
  std::string directory = tessera::kDefaultFashionMnistDir;
  std::string model_name = "simplecnn";
  bool help = false;
  tessera::FlagSet flags;
  flags.Choice("model", &model_name, {"simplecnn", "mcmahan-cnn", "resnet8"}, "the model trained");
  flags.Int("steps", &steps, "timed training steps (batch 64)", tessera::IntRange{1, 1000000});
  flags.Int("warmup", &warmup, "untimed steps first", tessera::IntRange{0, 1000000});
  flags.Int("threads", &threads, "OpenBLAS threads", tessera::IntRange{1, 256});
  flags.String("data", &directory, "the Fashion-MNIST directory (random data when it is not there)");
  flags.Bool("help", &help, "show this help");
  if (tessera::Status parsed = flags.ParseFlagsOnly(argc, argv); !parsed.ok()) {
    std::fprintf(stderr, "bench_train_throughput: %s\n", parsed.message().c_str());
    return 2;
  }
  if (help) {
    std::printf("bench_train_throughput: Tessera's local training throughput on this machine\n%s", flags.Usage().c_str());
    return 0;
  }
  const uint32_t batch = 64;
  tessera::Dataset data;
  std::string source = "fashion-mnist";
  const bool resnet = model_name == "resnet8";  // CIFAR-10's shape: random data, as the PyTorch peer
  auto loaded = resnet ? tessera::Result<tessera::Dataset>(tessera::NotFoundError("resnet8 trains on random 3x32x32 data"))
                       : tessera::LoadFashionMnist(directory, /*train=*/true);
  if (resnet) {
    data = RandomDataset(static_cast<int64_t>(batch) * (steps + warmup), 3, 32);
    source = "random";
  } else if (loaded.ok()) {
    data = std::move(loaded).value();
  } else {
    std::fprintf(stderr, "Fashion-MNIST not loaded (%s); using random data\n", loaded.status().ToString().c_str());
    data = RandomDataset(static_cast<int64_t>(batch) * (steps + warmup));
    source = "random";
  }

  auto device = tessera::CreateCpuDevice({.num_threads = static_cast<int>(threads)});
  tessera::ModelConfig config;
  config.name = model_name;
  if (resnet) {
    config.channels = 3;
    config.rows = config.cols = 32;
  }
  auto model = tessera::CreateModel(config, device.get());
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  tessera::TrainOptions options;
  options.batch_size = batch;
  options.learning_rate = 0.01f;
  options.momentum = 0.9f;
  options.weight_decay = 1e-5f;
  auto indices = [&](int count) {
    std::vector<int64_t> chosen(static_cast<size_t>(count) * batch);
    std::iota(chosen.begin(), chosen.end(), 0);
    for (auto& index : chosen) index %= data.count;
    return chosen;
  };
  auto warm = tessera::TrainLocal(**model, data, indices(warmup), options);
  auto timed = tessera::TrainLocal(**model, data, indices(steps), options);
  if (!warm.ok() || !timed.ok()) {
    std::fprintf(stderr, "training failed: %s\n", (warm.ok() ? timed.status() : warm.status()).ToString().c_str());
    return 1;
  }
  const double samples_per_second = timed->samples / (timed->compute_ms / 1000.0);
  std::printf("tessera_%s samples_per_s=%.1f steps=%llu data=%s device=\"%s\"\n", model_name.c_str(), samples_per_second,
              static_cast<unsigned long long>(timed->steps), source.c_str(),
              (*device).capabilities().name.c_str());
  return 0;
}
