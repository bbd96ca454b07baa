// bench_gpu [--quick]: the CUDA backend on the GPU it finds, in one run:
//  1. square GEMM TFLOP/s, n = 1024 .. 8192: the Device interface (float32, and TF32 when
//     allowed) against raw cublasSgemm on the same GPU, and cublasGemmEx with float16 inputs;
//  2. every op against the CPU backend on the same random inputs: max abs error per op;
//  3. SimpleCNN training samples/s at batch 64 and 512 on the GPU and on the CPU device.
// Without a usable GPU it prints why and exits 0.
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
#include <string>
#include <vector>

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

void GemmThroughput(Device& gpu, Device& tf32, bool quick) {
  std::cout << "1. GEMM (square), TFLOP/s: Device fp32 | raw cublasSgemm fp32 | Device TF32 | cublasGemmEx fp16->fp32\n";
  cublasHandle_t blas = nullptr;
  cublasCreate(&blas);
  for (int n : quick ? std::vector<int>{1024, 2048} : std::vector<int>{1024, 2048, 4096, 8192}) {
    const size_t count = size_t(n) * n;
    auto a = gpu.Allocate(count * 4), c = gpu.Allocate(count * 4);
    auto a_tf32 = tf32.Allocate(count * 4), c_tf32 = tf32.Allocate(count * 4);
    auto a_half = gpu.Allocate(count * 2);
    if (!a.ok() || !c.ok() || !a_tf32.ok() || !c_tf32.ok() || !a_half.ok()) {
      std::cout << "  n=" << n << ": out of device memory\n";
      continue;
    }
    gpu.Fill(int64_t(count), 0.25f, a->f32());
    tf32.Fill(int64_t(count), 0.25f, a_tf32->f32());
    gpu.Cast(int64_t(count), DType::kFloat32, a->f32(), DType::kFloat16, a_half->data());
    (void)gpu.Synchronize();
    const double flop = 2.0 * n * n * n;
    const double seconds = n >= 4096 ? 1.0 : 0.4;
    auto wait_gpu = [&] { (void)gpu.Synchronize(); };
    const double ours = flop * Rate([&] { gpu.Gemm(false, false, n, n, n, 1, a->f32(), a->f32(), 0, c->f32()); },
                                    wait_gpu, seconds) / 1e12;
    const float one = 1, zero = 0;
    const double raw = flop * Rate([&] {
      cublasSgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a->f32(), n, a->f32(), n, &zero, c->f32(), n);
    }, [] { cudaDeviceSynchronize(); }, seconds) / 1e12;
    const double with_tf32 = flop * Rate([&] {
      tf32.Gemm(false, false, n, n, n, 1, a_tf32->f32(), a_tf32->f32(), 0, c_tf32->f32());
    }, [&] { (void)tf32.Synchronize(); }, seconds) / 1e12;
    const double half = flop * Rate([&] {
      cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a_half->data(), CUDA_R_16F, n, a_half->data(),
                   CUDA_R_16F, n, &zero, c->f32(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    }, [] { cudaDeviceSynchronize(); }, seconds) / 1e12;
    std::cout << std::fixed << std::setprecision(2) << "  n=" << std::setw(4) << n << ": " << std::setw(7) << ours
              << " | " << std::setw(7) << raw << " (" << std::setprecision(3) << ours / raw << "x) | "
              << std::setprecision(2) << std::setw(7) << with_tf32 << " | " << std::setw(7) << half << "\n";
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

// Runs one op on a device from host inputs and returns its outputs concatenated.
class OpCase {
 public:
  explicit OpCase(Device& device) : device_(device) {}
  float* In(const std::vector<float>& host) {
    buffers_.push_back(std::move(device_.Allocate(std::max<size_t>(1, host.size()) * 4)).value());
    (void)device_.CopyHostToDevice(host.data(), buffers_.back(), 0, host.size() * 4);
    return buffers_.back().f32();
  }
  int32_t* Ints(const std::vector<int32_t>& host) {
    buffers_.push_back(std::move(device_.Allocate(host.size() * 4)).value());
    (void)device_.CopyHostToDevice(host.data(), buffers_.back(), 0, host.size() * 4);
    return buffers_.back().i32();
  }
  float* Out(size_t count, const std::vector<float>& initial = {}) {
    outputs_.push_back({buffers_.size(), count});
    return In(initial.empty() ? std::vector<float>(count, 0.0f) : initial);
  }
  std::vector<float> Results() {
    (void)device_.Synchronize();
    std::vector<float> all;
    for (const auto& [index, count] : outputs_) {
      std::vector<float> host(count);
      (void)device_.CopyDeviceToHost(buffers_[index], 0, host.data(), count * 4);
      all.insert(all.end(), host.begin(), host.end());
    }
    return all;
  }
  Device& device() { return device_; }

 private:
  Device& device_;
  std::vector<DeviceBuffer> buffers_;
  std::vector<std::pair<size_t, size_t>> outputs_;
};

void OpCorrectness(Device& gpu, Device& cpu) {
  std::cout << "2. ops against the CPU backend (same inputs), max abs error:\n";
  const Conv2dShape conv{4, 3, 17, 17, 8, 5, 5, 2, 1};
  const MaxPoolShape pool{4, 6, 12, 12, 3, 2};
  const int m = 129, n = 65, k = 77, batch = 37, classes = 10;
  const auto x = Random(ConvInputCount(conv), 1), w = Random(ConvWeightCount(conv), 2),
             bias = Random(conv.out_channels, 3), dy = Random(ConvOutputCount(conv), 4);
  const auto px = Random(PoolInputCount(pool), 5), pdy = Random(PoolOutputCount(pool), 6);
  const auto ga = Random(size_t(m) * k, 7), gb = Random(size_t(k) * n, 8), gc = Random(size_t(m) * n, 9);
  const auto logits = Random(size_t(batch) * classes, 10, -4, 4);
  std::vector<int32_t> labels(batch);
  for (int i = 0; i < batch; ++i) labels[i] = (i * 7) % classes;
  const auto big = Random(1 << 20, 11, -300, 300);
  using Body = std::function<void(OpCase&)>;
  const std::vector<std::pair<std::string, Body>> cases = {
      {"gemm", [&](OpCase& r) { r.device().Gemm(false, false, m, n, k, 0.5f, r.In(ga), r.In(gb), 0.25f, r.Out(gc.size(), gc)); }},
      {"gemm (a^T, b^T)", [&](OpCase& r) { r.device().Gemm(true, true, m, n, k, 1.0f, r.In(ga), r.In(gb), 0.0f, r.Out(gc.size())); }},
      {"conv2d_forward", [&](OpCase& r) { r.device().Conv2dForward(conv, r.In(x), r.In(w), r.In(bias), r.Out(dy.size())); }},
      {"conv2d_backward_data", [&](OpCase& r) { r.device().Conv2dBackwardData(conv, r.In(dy), r.In(w), r.Out(x.size())); }},
      {"conv2d_backward_filter", [&](OpCase& r) {
         r.device().Conv2dBackwardFilter(conv, r.In(x), r.In(dy), r.Out(w.size()), r.Out(bias.size()));
       }},
      {"bias_add", [&](OpCase& r) { r.device().BiasAdd(4, 8, 81, r.In(bias), r.Out(dy.size(), dy)); }},
      {"bias_grad", [&](OpCase& r) { r.device().BiasGrad(4, 8, 81, r.In(dy), r.Out(8)); }},
      {"relu", [&](OpCase& r) { r.device().Relu(int64_t(x.size()), r.In(x), r.Out(x.size())); }},
      {"relu_backward", [&](OpCase& r) { r.device().ReluBackward(int64_t(x.size()), r.In(x), r.In(x), r.Out(x.size())); }},
      {"max_pool (+argmax)", [&](OpCase& r) {
         auto argmax = std::move(r.device().Allocate(PoolOutputCount(pool) * 4)).value();
         float* y = r.Out(PoolOutputCount(pool));
         r.device().MaxPool(pool, r.In(px), y, argmax.i32());
         float* back = r.Out(PoolInputCount(pool));
         r.device().MaxPoolBackward(pool, r.In(pdy), argmax.i32(), back);
         (void)r.device().Synchronize();
       }},
      {"softmax_cross_entropy", [&](OpCase& r) {
         r.device().SoftmaxCrossEntropy(batch, classes, r.In(logits), r.Ints(labels), r.Out(1), r.Out(logits.size()));
       }},
      {"sgd_momentum_update", [&](OpCase& r) {
         r.device().SgdMomentumUpdate(int64_t(x.size()), 0.1f, 0.9f, 1e-4f, r.In(x), r.Out(x.size(), Random(x.size(), 12)),
                                      r.Out(x.size(), Random(x.size(), 13)));
       }},
      {"reduce_sum (2^20)", [&](OpCase& r) { r.device().ReduceSum(int64_t(big.size()), r.In(big), r.Out(1)); }},
      {"cast f32->f16->f32", [&](OpCase& r) {
         auto half = std::move(r.device().Allocate(big.size() * 2)).value();
         r.device().Cast(int64_t(big.size()), DType::kFloat32, r.In(big), DType::kFloat16, half.data());
         r.device().Cast(int64_t(big.size()), DType::kFloat16, half.data(), DType::kFloat32, r.Out(big.size()));
         (void)r.device().Synchronize();
       }},
      {"cast f32->bf16->f32", [&](OpCase& r) {
         auto half = std::move(r.device().Allocate(big.size() * 2)).value();
         r.device().Cast(int64_t(big.size()), DType::kFloat32, r.In(big), DType::kBFloat16, half.data());
         r.device().Cast(int64_t(big.size()), DType::kBFloat16, half.data(), DType::kFloat32, r.Out(big.size()));
         (void)r.device().Synchronize();
       }},
      {"cast f32->int8->f32", [&](OpCase& r) {
         auto bytes = std::move(r.device().Allocate(big.size())).value();
         r.device().Cast(int64_t(big.size()), DType::kFloat32, r.In(big), DType::kInt8, bytes.data());
         r.device().Cast(int64_t(big.size()), DType::kInt8, bytes.data(), DType::kFloat32, r.Out(big.size()));
         (void)r.device().Synchronize();
       }},
      {"fill", [&](OpCase& r) { r.device().Fill(1000, 3.5f, r.Out(1000)); }},
  };
  for (const auto& [name, body] : cases) {
    OpCase on_gpu(gpu), on_cpu(cpu);
    body(on_gpu);
    body(on_cpu);
    const std::vector<float> a = on_gpu.Results(), b = on_cpu.Results();
    double worst = 0, scale = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
      scale = std::max(scale, std::fabs(double(b[i])));
    }
    std::cout << "  " << std::left << std::setw(26) << name << std::right << std::scientific << std::setprecision(2)
              << worst << "  (max |cpu| " << scale << ")\n";
  }
  const Status status = gpu.Synchronize();
  std::cout << "  device status after the ops: " << status.ToString() << "\n";
}

void TrainingThroughput(Device& gpu, Device& cpu, bool quick) {
  std::cout << "3. SimpleCNN training, samples/s (SGD lr 0.01 momentum 0.9, one epoch over the samples):\n";
  auto loaded = LoadFashionMnist("", true);
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
  const bool quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
  const tessera::Viability viability = tessera::CudaViability();
  if (!viability.viable) {
    std::cout << "bench_gpu: no GPU to measure: " << viability.reason << "\n";
    return 0;
  }
  auto gpu = tessera::CreateCudaDevice();
  tessera::CudaDeviceOptions tf32_options;
  tf32_options.allow_tf32 = true;
  auto tf32 = tessera::CreateCudaDevice(tf32_options);
  auto cpu = tessera::CreateDevice("cpu");
  if (!gpu.ok() || !tf32.ok() || !cpu.ok()) {
    std::cout << "bench_gpu: cannot create the devices: " << (gpu.ok() ? "" : gpu.status().ToString()) << " "
              << (tf32.ok() ? "" : tf32.status().ToString()) << "\n";
    return 1;
  }
  std::cout << "bench_gpu on " << (*gpu)->capabilities().name << " ("
            << (*gpu)->capabilities().memory_bytes / (1ull << 30) << " GiB), beside " << (*cpu)->capabilities().name
            << "\n";
  tessera::GemmThroughput(**gpu, **tf32, quick);
  tessera::OpCorrectness(**gpu, **cpu);
  tessera::TrainingThroughput(**gpu, **cpu, quick);
  return 0;
}
