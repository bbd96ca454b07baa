// The fixture of the Device op suite (device_ops_test.cc, layer_ops_test.cc): one instance per
// registered backend that is viable here and computes in float32, with helpers to move
// buffers and to check a gradient against central differences. The suite is instantiated
// once, in device_ops_test.cc.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "device/device.h"
#include "device/registry.h"

namespace tessera::device_test {

inline std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  for (const auto& backend : RegisteredDeviceBackends()) names.push_back(backend.name);
  return names;
}

inline std::vector<float> RandomVector(size_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<float> uniform(low, high);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(engine);
  return values;
}

class DeviceOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    for (const auto& backend : RegisteredDeviceBackends()) {
      if (backend.name != GetParam()) continue;
      Viability viability = backend.viability();
      if (!viability.viable) GTEST_SKIP() << GetParam() << " is not viable here: " << viability.reason;
    }
    auto created = CreateDevice(GetParam());
    ASSERT_TRUE(created.ok()) << created.status().ToString();
    device_ = std::move(created).value();
    // These tolerances are float32's; a device that rounds to a narrower precision is checked
    // against the CPU with tolerances that fit it in generic_device_test.cc.
    if (device_->capabilities().compute_precision != DType::kFloat32) {
      GTEST_SKIP() << GetParam() << " computes in " << DTypeName(device_->capabilities().compute_precision)
                   << "; covered by GenericDeviceTest";
    }
  }

  DeviceBuffer Upload(const std::vector<float>& host) {
    auto buffer = device_->Allocate(std::max<size_t>(1, host.size()) * sizeof(float));
    EXPECT_TRUE(buffer.ok());
    EXPECT_TRUE(device_->CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(float)).ok());
    return std::move(buffer).value();
  }
  DeviceBuffer UploadInts(const std::vector<int32_t>& host) {
    auto buffer = device_->Allocate(host.size() * sizeof(int32_t));
    EXPECT_TRUE(device_->CopyHostToDevice(host.data(), *buffer, 0, host.size() * sizeof(int32_t)).ok());
    return std::move(buffer).value();
  }
  DeviceBuffer Zeros(size_t count) { return Upload(std::vector<float>(count, 0.0f)); }
  std::vector<float> Download(const DeviceBuffer& buffer, size_t count) {
    std::vector<float> host(count);
    EXPECT_TRUE(device_->CopyDeviceToHost(buffer, 0, host.data(), count * sizeof(float)).ok());
    return host;
  }

  // Checks `analytic` (dL/dinput) against central differences of `loss(input)`, for up to
  // `samples` coordinates spread over the input.
  void ExpectGradientMatches(std::vector<float> input, const std::function<double(const std::vector<float>&)>& loss,
                             const std::vector<float>& analytic, float epsilon, double tolerance, int samples = 40) {
    ASSERT_EQ(input.size(), analytic.size());
    const size_t step = std::max<size_t>(1, input.size() / samples);
    for (size_t i = 0; i < input.size(); i += step) {
      const float saved = input[i];
      input[i] = saved + epsilon;
      const double plus = loss(input);
      input[i] = saved - epsilon;
      const double minus = loss(input);
      input[i] = saved;
      const double numeric = (plus - minus) / (2.0 * epsilon);
      EXPECT_NEAR(analytic[i], numeric, tolerance * std::max(1.0, std::fabs(numeric))) << "coordinate " << i;
    }
  }

  static double Dot(const std::vector<float>& a, const std::vector<float>& b) {
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += static_cast<double>(a[i]) * b[i];
    return sum;
  }

  std::unique_ptr<Device> device_;
};

}  // namespace tessera::device_test
