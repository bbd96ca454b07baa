// bench_device [--quick]: prints
//  1. GEMM GFLOP/s of the CPU backend vs raw cblas_sgemm (same sizes, same thread count);
//  2. SimpleCNN training-step time (batch 64, real Fashion-MNIST) on "cpu" vs unpaced
//     emulated devices, and their ratio (target: emulated <= 1.3x CPU);
//  3. the `tessera devices --model simplecnn` report.
#include <cblas.h>

#include <chrono>
#include <cstring>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <vector>

#include "base/flags.h"
#include "cli/devices_command.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/registry.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <typename Fn>
double Rate(Fn&& fn, double min_seconds) {
  fn();
  int repeats = 0;
  auto start = Clock::now();
  do {
    fn();
    ++repeats;
  } while (Seconds(start) < min_seconds);
  return repeats / Seconds(start);
}

void GemmComparison() {
  auto device = CreateDevice("cpu");
  std::cout << "GEMM (square, float32), GFLOP/s: backend cpu vs raw cblas_sgemm\n";
  for (int n : {256, 512, 1024}) {
    const size_t count = size_t(n) * n;
    auto a = (*device)->Allocate(count * 4), c = (*device)->Allocate(count * 4);
    (*device)->Fill(int64_t(count), 0.25f, a->f32());
    std::vector<float> ha(count, 0.25f), hc(count);
    const double flop = 2.0 * n * n * n;
    const double ours = flop * Rate([&] { (*device)->Gemm(false, false, n, n, n, 1, a->f32(), a->f32(), 0, c->f32()); }, 0.5) / 1e9;
    const double raw = flop * Rate([&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, ha.data(), n, ha.data(), n, 0, hc.data(), n);
    }, 0.5) / 1e9;
    std::cout << std::fixed << std::setprecision(1) << "  n=" << n << ": " << ours << " vs " << raw << " ("
              << std::setprecision(3) << ours / raw << "x)\n";
  }
}

void StepComparison() {
  auto data = LoadFashionMnist("", true);
  if (!data.ok()) {
    std::cout << "step comparison skipped: " << data.status().ToString() << "\n";
    return;
  }
  std::vector<int64_t> indices(64 * 50);
  std::iota(indices.begin(), indices.end(), 0);
  TrainOptions options;
  options.batch_size = 64;
  options.learning_rate = 0.01f;
  options.weight_decay = 1e-5f;
  std::cout << "SimpleCNN training step, batch 64, 50 steps after 1 warm-up epoch, ms/step:\n";
  double cpu_ms = 0;
  for (const char* name : {"cpu", "emu:generic", "emu:a100", "emu:alveo-u55c", "emu:ascend-910b", "emu:edge-npu"}) {
    auto device = CreateDevice(name);
    auto model = CreateModel(ModelConfig{}, device->get());
    std::vector<int64_t> warm(indices.begin(), indices.begin() + 64 * 5);
    (void)TrainLocal(**model, *data, warm, options);
    double best = 1e30;
    for (int trial = 0; trial < 3; ++trial) {
      auto report = TrainLocal(**model, *data, indices, options);
      best = std::min(best, report->compute_ms / report->steps);
    }
    if (std::string(name) == "cpu") cpu_ms = best;
    std::cout << std::fixed << std::setprecision(3) << "  " << std::left << std::setw(18) << name << std::right
              << best << " ms (" << std::setprecision(2) << best / cpu_ms << "x cpu)\n";
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  bool quick = false, help = false;
  tessera::FlagSet flags;
  flags.Bool("quick", &quick, "the GEMM and the training step only, not every device's layer placement");
  flags.Bool("help", &help, "show this help");
  if (tessera::Status parsed = flags.Parse(argc, argv); !parsed.ok() || !flags.positional().empty()) {
    std::cerr << "bench_device: " << (parsed.ok() ? "unexpected argument '" + flags.positional().front() + "'"
                                                  : parsed.message()) << "\n";
    return 2;
  }
  if (help) {
    std::cout << "bench_device: the CPU backend against raw OpenBLAS, and the emulated devices' steps\n" << flags.Usage();
    return 0;
  }
  tessera::GemmComparison();
  tessera::StepComparison();
  if (!quick) {
    tessera::DevicesOptions options;
    options.model = "simplecnn";
    tessera::Status status = tessera::DevicesCommand(options, std::cout);
    if (!status.ok()) std::cerr << status.ToString() << "\n";
  }
  return 0;
}
