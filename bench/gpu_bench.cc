// bench_gpu [--quick] [--data-dir DIR]: the CUDA backend on the GPU it finds, in one run:
//  1. square GEMM TFLOP/s, n = 1024 .. 8192 (1024 and 2048 with --quick): the Device
//     interface (float32, and TF32 when allowed) against raw cublasSgemm on the same GPU, and
//     cublasGemmEx with float16 inputs. Fails when the Device's float32 GEMM runs below
//     0.9x raw cuBLAS (the interface's overhead must stay small), or when cuBLAS fails;
//  2. every op against the CPU backend on the same inputs (bench/op_check.h, with guard zones
//     around every buffer): max abs error per op; fails past each op's tolerance;
//  3. SimpleCNN training samples/s at batch 64 and 512 on the GPU and on the CPU device
//     (Fashion-MNIST from DIR, Debian's by default; random data when missing).
// Its last line is "bench_gpu: PASS" or "bench_gpu: FAIL (...)". Exit status: 0 passed, 1
// failed, 2 no usable GPU (nothing measured: not a pass).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/op_check.h"
#include "core/data/idx.h"
#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cuda/factory.h"
#include "device/op_cost.h"
#include "device/registry.h"

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// Calls per second of `issue` (which queues work) measured over at least `min_seconds`,
// waiting with `wait` after a warm-up and at the end.
double Rate(const std::function<void()>& issue, const std::function<void()>& wait, double min_seconds) {
  issue();
  wait();
  int calls = 0;
  const auto start = Clock::now();
  do {
    for (int i = 0; i < 4; ++i, ++calls) issue();
    wait();
  } while (Seconds(start) < min_seconds);
  return calls / Seconds(start);
}

// Problems found, each one line for the verdict.
using Problems = std::vector<std::string>;

constexpr double kMinimumGemmRatio = 0.9;  // the Device's float32 GEMM against raw cuBLAS

void GemmThroughput(Device& gpu, Device& tf32, bool quick, Problems& problems) {
  std::cout << "1. GEMM (square), TFLOP/s: Device fp32 | raw cublasSgemm fp32 | Device TF32 | cublasGemmEx fp16->fp32\n";
  cublasHandle_t blas = nullptr;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    problems.push_back("cublasCreate failed: no raw cuBLAS to compare with");
    return;
  }
  cublasStatus_t raw_status = CUBLAS_STATUS_SUCCESS;
  auto keep = [&](cublasStatus_t status) {
    if (status != CUBLAS_STATUS_SUCCESS && raw_status == CUBLAS_STATUS_SUCCESS) raw_status = status;
  };
  for (int n : quick ? std::vector<int>{1024, 2048} : std::vector<int>{1024, 2048, 4096, 8192}) {
    const size_t count = size_t(n) * n;
    auto a = gpu.Allocate(count * 4), c = gpu.Allocate(count * 4);
    auto a_tf32 = tf32.Allocate(count * 4), c_tf32 = tf32.Allocate(count * 4);
    auto a_half = gpu.Allocate(count * 2);
    if (!a.ok() || !c.ok() || !a_tf32.ok() || !c_tf32.ok() || !a_half.ok()) {
      problems.push_back("GEMM n=" + std::to_string(n) + ": out of device memory");
      continue;
    }
    gpu.Fill(int64_t(count), 0.25f, a->f32());
    tf32.Fill(int64_t(count), 0.25f, a_tf32->f32());
    gpu.Cast(int64_t(count), DType::kFloat32, a->f32(), DType::kFloat16, a_half->data());
    (void)gpu.Synchronize();
    (void)tf32.Synchronize();
    const double flop = 2.0 * n * n * n;
    const double seconds = n >= 4096 ? 1.0 : 0.4;
    auto wait_gpu = [&] { (void)gpu.Synchronize(); };
    const float one = 1, zero = 0;
    auto ours = [&] {
      return flop * Rate([&] { gpu.Gemm(false, false, n, n, n, 1, a->f32(), a->f32(), 0, c->f32()); }, wait_gpu,
                         seconds) / 1e12;
    };
    auto raw = [&] {
      return flop * Rate([&] {
        keep(cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a->f32(), n, a->f32(), n, &zero, c->f32(), n));
      }, [] { cudaDeviceSynchronize(); }, seconds) / 1e12;
    };
    // Interleaved, best of two each: a clock ramp or a neighbour's burst must not decide the ratio.
    double ours_best = ours(), raw_best = raw();
    ours_best = std::max(ours_best, ours());
    raw_best = std::max(raw_best, raw());
    const double with_tf32 = flop * Rate([&] {
      tf32.Gemm(false, false, n, n, n, 1, a_tf32->f32(), a_tf32->f32(), 0, c_tf32->f32());
    }, [&] { (void)tf32.Synchronize(); }, seconds) / 1e12;
    const double half = flop * Rate([&] {
      keep(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a_half->data(), CUDA_R_16F, n, a_half->data(),
                        CUDA_R_16F, n, &zero, c->f32(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }, [] { cudaDeviceSynchronize(); }, seconds) / 1e12;
    const double ratio = ours_best / raw_best;
    std::cout << std::fixed << std::setprecision(2) << "  n=" << std::setw(4) << n << ": " << std::setw(7)
              << ours_best << " | " << std::setw(7) << raw_best << " (" << std::setprecision(3) << ratio << "x) | "
              << std::setprecision(2) << std::setw(7) << with_tf32 << " | " << std::setw(7) << half
              << (ratio < kMinimumGemmRatio ? "   FAIL: below 0.9x raw cuBLAS" : "") << "\n";
    if (ratio < kMinimumGemmRatio) {
      std::ostringstream line;
      line << std::setprecision(3) << "GEMM n=" << n << ": the Device ran at " << ratio << "x raw cuBLAS (at least "
           << kMinimumGemmRatio << "x expected)";
      problems.push_back(line.str());
    }
    const Status device_status = gpu.Synchronize();
    if (!device_status.ok()) problems.push_back("GEMM n=" + std::to_string(n) + ": " + device_status.ToString());
  }
  if (raw_status != CUBLAS_STATUS_SUCCESS) {
    problems.push_back(std::string("raw cuBLAS failed: ") + cublasGetStatusString(raw_status));
  }
  cublasDestroy(blas);
}

std::vector<float> Random(size_t count, uint32_t seed, float low = -1, float high = 1) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(engine);
  return values;
}

void OpCorrectness(Device& gpu, Device& cpu, Problems& problems) {
  std::cout << "2. ops against the CPU backend (same inputs, guarded buffers), max abs error:\n";
  for (const op_check::OpCheck& check : op_check::BenchChecks()) {
    const op_check::OpComparison result = op_check::Compare(check, gpu, cpu);
    std::cout << "  " << std::left << std::setw(70) << check.name << std::right << std::scientific
              << std::setprecision(2) << result.max_error << "  (max |cpu| " << result.scale << ", allowed "
              << result.allowed << ")" << (result.passed() ? "" : "  FAIL") << "\n";
    if (!result.passed()) problems.push_back(check.name + ": " + result.failure);
  }
  std::cout << std::defaultfloat;
  const Status status = gpu.Synchronize();
  std::cout << "  device status after the ops: " << status.ToString() << "\n";
  if (!status.ok()) problems.push_back("device status after the ops: " + status.ToString());
}

void TrainingThroughput(Device& gpu, Device& cpu, bool quick, const std::string& data_dir, Problems& problems) {
  std::cout << "3. SimpleCNN training, samples/s (SGD lr 0.01 momentum 0.9, one epoch over the samples):\n";
  auto loaded = LoadFashionMnist(data_dir, true);
  Dataset data;
  if (loaded.ok()) {
    data = std::move(loaded).value();
  } else {
    std::cout << "  (Fashion-MNIST not found: " << loaded.status().ToString() << "; random data)\n";
    data.count = 8192;
    data.channels = 1;
    data.rows = data.cols = 28;
    data.num_classes = 10;
    data.images = Random(size_t(data.count) * 784, 14);
    for (int i = 0; i < data.count; ++i) data.labels.push_back(uint8_t(i % 10));
  }
  for (int batch : {64, 512}) {
    for (Device* device : {&gpu, &cpu}) {
      const int samples = device == &cpu ? (quick ? 2048 : 8192) : (quick ? 8192 : 32768);
      std::vector<int64_t> indices(std::min<int64_t>(samples, data.count));
      std::iota(indices.begin(), indices.end(), 0);
      auto model = CreateModel(ModelConfig{}, device);
      if (!model.ok()) {
        std::cout << "  " << model.status().ToString() << "\n";
        problems.push_back("SimpleCNN on " + device->capabilities().name + ": " + model.status().ToString());
        continue;
      }
      TrainOptions options;
      options.batch_size = batch;
      std::vector<int64_t> warm(indices.begin(), indices.begin() + std::min<size_t>(indices.size(), batch * 4));
      (void)TrainLocal(**model, data, warm, options);
      const auto start = Clock::now();
      auto report = TrainLocal(**model, data, indices, options);
      const double seconds = Seconds(start);
      if (!report.ok()) {
        std::cout << "  " << report.status().ToString() << "\n";
        problems.push_back("SimpleCNN training on " + device->capabilities().name + ": " + report.status().ToString());
        continue;
      }
      std::cout << "  batch " << std::setw(3) << batch << " on " << std::left << std::setw(40)
                << device->capabilities().name << std::right << std::fixed << std::setprecision(0) << std::setw(10)
                << report->samples / seconds << " samples/s (loss " << std::setprecision(3) << report->mean_loss
                << ")\n";
    }
  }
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  bool quick = false;
  std::string data_dir;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--data-dir") == 0 && i + 1 < argc) {
      data_dir = argv[++i];
    } else {
      std::cerr << "usage: bench_gpu [--quick] [--data-dir DIR]\n";
      return 1;
    }
  }
  const tessera::Viability viability = tessera::CudaViability();
  if (!viability.viable) {
    std::cout << "bench_gpu: no GPU to measure: " << viability.reason << "\n";
    std::cout << "bench_gpu: NOT RUN (no GPU)\n";
    return 2;
  }
  auto gpu = tessera::CreateCudaDevice();
  tessera::CudaDeviceOptions tf32_options;
  tf32_options.allow_tf32 = true;
  auto tf32 = tessera::CreateCudaDevice(tf32_options);
  auto cpu = tessera::CreateDevice("cpu");
  if (!gpu.ok() || !tf32.ok() || !cpu.ok()) {
    std::cout << "bench_gpu: cannot create the devices: " << (gpu.ok() ? "" : gpu.status().ToString()) << " "
              << (tf32.ok() ? "" : tf32.status().ToString()) << " " << (cpu.ok() ? "" : cpu.status().ToString())
              << "\n";
    std::cout << "bench_gpu: FAIL (the devices could not be created)\n";
    return 1;
  }
  std::cout << "bench_gpu on " << (*gpu)->capabilities().name << " ("
            << (*gpu)->capabilities().memory_bytes / (1ull << 30) << " GiB), beside " << (*cpu)->capabilities().name
            << "\n";
  tessera::Problems problems;
  tessera::GemmThroughput(**gpu, **tf32, quick, problems);
  tessera::OpCorrectness(**gpu, **cpu, problems);
  tessera::TrainingThroughput(**gpu, **cpu, quick, data_dir, problems);
  if (problems.empty()) {
    std::cout << "bench_gpu: PASS\n";
    return 0;
  }
  std::cout << "problems:\n";
  for (const std::string& problem : problems) std::cout << "  - " << problem << "\n";
  std::cout << "bench_gpu: FAIL (" << problems.size() << " problem" << (problems.size() == 1 ? "" : "s") << ")\n";
  return 1;
}
