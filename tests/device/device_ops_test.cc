// The Device op suite, run for every registered backend that is viable here. Linear ops are
// checked against naive references; every op with a backward is checked against central
// finite differences of a scalar loss L = sum(output * probe).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "device/device.h"
#include "device/registry.h"

namespace tessera {
namespace {

std::vector<std::string> BackendNames() {
  std::vector<std::string> names;
  for (const auto& backend : RegisteredDeviceBackends()) names.push_back(backend.name);
  return names;
}

std::vector<float> RandomVector(size_t count, uint32_t seed, float low = -1.0f, float high = 1.0f) {
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

TEST_P(DeviceOpsTest, CapabilitiesListTheOpsAndDtypes) {
  const DeviceCapabilities& capabilities = device_->capabilities();
  EXPECT_EQ(capabilities.kind, GetParam());
  EXPECT_FALSE(capabilities.name.empty());
  EXPECT_TRUE(capabilities.dtypes.count(DType::kFloat32));
  if (GetParam() == "cpu") {
    EXPECT_EQ(capabilities.native_ops, AllOps());
  }
}

TEST_P(DeviceOpsTest, CopiesRoundTripAndRefuseRangesOutsideTheBuffer) {
  std::vector<float> values = RandomVector(100, 1);
  DeviceBuffer a = Upload(values);
  auto b = device_->Allocate(100 * sizeof(float));
  ASSERT_TRUE(b.ok());
  ASSERT_TRUE(device_->CopyDeviceToDevice(a, 0, *b, 0, 100 * sizeof(float)).ok());
  EXPECT_EQ(Download(*b, 100), values);
  float host[4];
  Status status = device_->CopyDeviceToHost(a, 99 * sizeof(float), host, sizeof(host));
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange) << status.ToString();
  status = device_->CopyHostToDevice(host, a, 400, 4);
  EXPECT_EQ(status.code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(device_->Synchronize().ok());
}

TEST_P(DeviceOpsTest, GemmMatchesNaiveReferenceForEveryTransposeCombination) {
  const int m = 7, n = 5, k = 9;
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      std::vector<float> a = RandomVector(m * k, 2), b = RandomVector(k * n, 3), c = RandomVector(m * n, 4);
      std::vector<float> expected(m * n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double sum = 0;
          for (int p = 0; p < k; ++p) {
            const float av = transpose_a ? a[p * m + i] : a[i * k + p];
            const float bv = transpose_b ? b[j * k + p] : b[p * n + j];
            sum += static_cast<double>(av) * bv;
          }
          expected[i * n + j] = static_cast<float>(1.5 * sum + 0.5 * c[i * n + j]);
        }
      }
      DeviceBuffer da = Upload(a), db = Upload(b), dc = Upload(c);
      device_->Gemm(transpose_a, transpose_b, m, n, k, 1.5f, da.f32(), db.f32(), 0.5f, dc.f32());
      std::vector<float> got = Download(dc, m * n);
      for (int i = 0; i < m * n; ++i) EXPECT_NEAR(got[i], expected[i], 1e-4) << transpose_a << transpose_b << i;
    }
  }
}

// k = 0 has no product to add: c = beta * c, where beta 0 overwrites c without reading it
// (BLAS's rule: NaN in c must not survive). m or n = 0 leaves everything alone. BLAS libraries
// refuse the leading dimension 0 of the empty operands, so the backends must not pass it on.
TEST_P(DeviceOpsTest, GemmWithAnEmptyDimensionFollowsBlasRules) {
  const int m = 3, n = 4;
  for (bool transpose_a : {false, true}) {
    for (bool transpose_b : {false, true}) {
      const std::vector<float> c = RandomVector(m * n, 5);
      DeviceBuffer a = Zeros(1), b = Zeros(1), scaled = Upload(c);
      device_->Gemm(transpose_a, transpose_b, m, n, 0, 1.0f, a.f32(), b.f32(), 0.5f, scaled.f32());
      const std::vector<float> got = Download(scaled, m * n);
      for (int i = 0; i < m * n; ++i) EXPECT_FLOAT_EQ(got[i], 0.5f * c[i]) << transpose_a << transpose_b << i;

      DeviceBuffer cleared = Upload(std::vector<float>(m * n, std::nanf("")));
      device_->Gemm(transpose_a, transpose_b, m, n, 0, 1.0f, a.f32(), b.f32(), 0.0f, cleared.f32());
      for (float value : Download(cleared, m * n)) EXPECT_EQ(value, 0.0f) << transpose_a << transpose_b;

      DeviceBuffer untouched = Upload(c);
      device_->Gemm(transpose_a, transpose_b, 0, n, 2, 1.0f, a.f32(), b.f32(), 0.5f, untouched.f32());
      device_->Gemm(transpose_a, transpose_b, m, 0, 2, 1.0f, a.f32(), b.f32(), 0.5f, untouched.f32());
      EXPECT_EQ(Download(untouched, m * n), c) << transpose_a << transpose_b;
    }
  }
  EXPECT_TRUE(device_->Synchronize().ok());
}

struct ConvCase {
  Conv2dShape shape;
};

Conv2dShape MakeConv(int batch, int in_channels, int size, int out_channels, int kernel, int stride, int padding) {
  Conv2dShape shape;
  shape.batch = batch;
  shape.in_channels = in_channels;
  shape.in_height = size;
  shape.in_width = size + 1;
  shape.out_channels = out_channels;
  shape.kernel_height = kernel;
  shape.kernel_width = kernel;
  shape.stride = stride;
  shape.padding = padding;
  return shape;
}

TEST_P(DeviceOpsTest, Conv2dForwardMatchesDirectConvolution) {
  for (const Conv2dShape& s : {MakeConv(2, 3, 7, 4, 3, 1, 0), MakeConv(2, 2, 8, 3, 3, 2, 1)}) {
    const int oh = s.out_height(), ow = s.out_width();
    std::vector<float> x = RandomVector(s.batch * s.in_channels * s.in_height * s.in_width, 5);
    std::vector<float> w = RandomVector(s.out_channels * s.in_channels * 9, 6);
    std::vector<float> bias = RandomVector(s.out_channels, 7);
    DeviceBuffer dx = Upload(x), dw = Upload(w), db = Upload(bias), dy = Zeros(s.batch * s.out_channels * oh * ow);
    device_->Conv2dForward(s, dx.f32(), dw.f32(), db.f32(), dy.f32());
    std::vector<float> y = Download(dy, s.batch * s.out_channels * oh * ow);
    for (int n = 0; n < s.batch; ++n)
      for (int o = 0; o < s.out_channels; ++o)
        for (int i = 0; i < oh; ++i)
          for (int j = 0; j < ow; ++j) {
            double sum = bias[o];
            for (int c = 0; c < s.in_channels; ++c)
              for (int u = 0; u < 3; ++u)
                for (int v = 0; v < 3; ++v) {
                  const int r = i * s.stride - s.padding + u, q = j * s.stride - s.padding + v;
                  if (r < 0 || r >= s.in_height || q < 0 || q >= s.in_width) continue;
                  sum += static_cast<double>(x[((n * s.in_channels + c) * s.in_height + r) * s.in_width + q]) *
                         w[((o * s.in_channels + c) * 3 + u) * 3 + v];
                }
            EXPECT_NEAR(y[((n * s.out_channels + o) * oh + i) * ow + j], sum, 1e-4);
          }
  }
}

TEST_P(DeviceOpsTest, Conv2dBackwardMatchesFiniteDifferences) {
  for (const Conv2dShape& s : {MakeConv(3, 2, 7, 4, 3, 1, 0), MakeConv(2, 2, 8, 3, 3, 2, 1)}) {
    const size_t x_count = s.batch * s.in_channels * s.in_height * s.in_width;
    const size_t w_count = s.out_channels * s.in_channels * 9;
    const size_t y_count = s.batch * s.out_channels * s.out_height() * s.out_width();
    std::vector<float> x = RandomVector(x_count, 8), w = RandomVector(w_count, 9), bias = RandomVector(s.out_channels, 10);
    std::vector<float> probe = RandomVector(y_count, 11);
    auto loss = [&](const std::vector<float>& xv, const std::vector<float>& wv, const std::vector<float>& bv) {
      DeviceBuffer dx = Upload(xv), dw = Upload(wv), db = Upload(bv), dy = Zeros(y_count);
      device_->Conv2dForward(s, dx.f32(), dw.f32(), db.f32(), dy.f32());
      return Dot(Download(dy, y_count), probe);
    };
    DeviceBuffer dx = Upload(x), dw = Upload(w), dprobe = Upload(probe);
    DeviceBuffer grad_x = Zeros(x_count), grad_w = Zeros(w_count), grad_b = Zeros(s.out_channels);
    device_->Conv2dBackwardData(s, dprobe.f32(), dw.f32(), grad_x.f32());
    device_->Conv2dBackwardFilter(s, dx.f32(), dprobe.f32(), grad_w.f32(), grad_b.f32());
    ExpectGradientMatches(x, [&](const std::vector<float>& v) { return loss(v, w, bias); }, Download(grad_x, x_count),
                          1e-2f, 1e-3);
    ExpectGradientMatches(w, [&](const std::vector<float>& v) { return loss(x, v, bias); }, Download(grad_w, w_count),
                          1e-2f, 1e-3);
    ExpectGradientMatches(bias, [&](const std::vector<float>& v) { return loss(x, w, v); },
                          Download(grad_b, s.out_channels), 1e-2f, 1e-3);
  }
}

TEST_P(DeviceOpsTest, BiasAddAndBiasGradAreAdjoint) {
  const int outer = 3, channels = 4, inner = 5;
  const size_t count = outer * channels * inner;
  std::vector<float> x = RandomVector(count, 12), bias = RandomVector(channels, 13), probe = RandomVector(count, 14);
  auto loss = [&](const std::vector<float>& b) {
    DeviceBuffer dx = Upload(x), db = Upload(b);
    device_->BiasAdd(outer, channels, inner, db.f32(), dx.f32());
    return Dot(Download(dx, count), probe);
  };
  DeviceBuffer dprobe = Upload(probe), grad = Zeros(channels);
  device_->BiasGrad(outer, channels, inner, dprobe.f32(), grad.f32());
  ExpectGradientMatches(bias, loss, Download(grad, channels), 1e-2f, 1e-3);
}

TEST_P(DeviceOpsTest, ReluBackwardMatchesFiniteDifferences) {
  const size_t count = 64;
  std::vector<float> x = RandomVector(count, 15), probe = RandomVector(count, 16);
  for (float& v : x) if (std::fabs(v) < 0.05f) v = 0.3f;  // keep away from the kink
  auto loss = [&](const std::vector<float>& xv) {
    DeviceBuffer dx = Upload(xv), dy = Zeros(count);
    device_->Relu(count, dx.f32(), dy.f32());
    return Dot(Download(dy, count), probe);
  };
  DeviceBuffer dx = Upload(x), dy = Zeros(count), dprobe = Upload(probe), grad = Zeros(count);
  device_->Relu(count, dx.f32(), dy.f32());
  device_->ReluBackward(count, dy.f32(), dprobe.f32(), grad.f32());
  ExpectGradientMatches(x, loss, Download(grad, count), 1e-2f, 1e-3, 64);
}

TEST_P(DeviceOpsTest, MaxPoolBackwardMatchesFiniteDifferences) {
  MaxPoolShape s;
  s.batch = 2;
  s.channels = 3;
  s.in_height = 6;
  s.in_width = 8;
  const size_t x_count = 2 * 3 * 6 * 8, y_count = 2 * 3 * 3 * 4;
  std::vector<float> x(x_count);
  std::iota(x.begin(), x.end(), 0.0f);  // distinct values, then shuffled: no ties
  std::shuffle(x.begin(), x.end(), std::mt19937(17));
  for (float& v : x) v *= 0.1f;
  std::vector<float> probe = RandomVector(y_count, 18);
  DeviceBuffer indices_a = Zeros(y_count);  // int32, same size as float
  auto loss = [&](const std::vector<float>& xv) {
    DeviceBuffer dx = Upload(xv), dy = Zeros(y_count);
    device_->MaxPool(s, dx.f32(), dy.f32(), indices_a.i32());
    return Dot(Download(dy, y_count), probe);
  };
  DeviceBuffer dx = Upload(x), dy = Zeros(y_count), argmax = Zeros(y_count), dprobe = Upload(probe), grad = Zeros(x_count);
  device_->MaxPool(s, dx.f32(), dy.f32(), argmax.i32());
  std::vector<float> y = Download(dy, y_count);
  EXPECT_FLOAT_EQ(y[0], std::max({x[0], x[1], x[8], x[9]}));
  device_->MaxPoolBackward(s, dprobe.f32(), argmax.i32(), grad.f32());
  ExpectGradientMatches(x, loss, Download(grad, x_count), 1e-2f, 1e-3, 96);
}

// Overlapping windows (3, stride 2): a spike at every (4a + 2, 4b + 2) is the maximum of the
// four windows around it, so it gets the sum of their gradients, added in output order (the
// device.h contract); the zeros elsewhere are ties, where the first element wins.
TEST_P(DeviceOpsTest, MaxPoolBackwardSumsOverlappingWindowsInOutputOrder) {
  MaxPoolShape s;
  s.batch = 2, s.channels = 2, s.in_height = 11, s.in_width = 13, s.window = 3, s.stride = 2;
  const int out_h = s.out_height(), out_w = s.out_width();
  const size_t plane = size_t(s.in_height) * s.in_width, out_plane = size_t(out_h) * out_w;
  const size_t planes = size_t(s.batch) * s.channels, x_count = planes * plane, y_count = planes * out_plane;
  std::vector<float> x(x_count, 0.0f);
  for (size_t p = 0; p < planes; ++p) {
    for (int h = 2; h < s.in_height; h += 4) {
      for (int w = 2; w < s.in_width; w += 4) x[p * plane + size_t(h) * s.in_width + w] = 1.0f + float(p);
    }
  }
  const std::vector<float> dy = RandomVector(y_count, 19);
  std::vector<float> expected(x_count, 0.0f);
  for (size_t p = 0; p < planes; ++p) {
    for (int oh = 0; oh < out_h; ++oh) {
      for (int ow = 0; ow < out_w; ++ow) {
        size_t best = size_t(oh * s.stride) * s.in_width + ow * s.stride;
        for (int kh = 0; kh < s.window; ++kh) {
          for (int kw = 0; kw < s.window; ++kw) {
            const size_t at = size_t(oh * s.stride + kh) * s.in_width + ow * s.stride + kw;
            if (x[p * plane + at] > x[p * plane + best]) best = at;
          }
        }
        expected[p * plane + best] += dy[p * out_plane + size_t(oh) * out_w + ow];
      }
    }
  }
  DeviceBuffer dx = Upload(x), y = Zeros(y_count), argmax = Zeros(y_count), gradient = Upload(dy),
               result = Zeros(x_count);
  device_->MaxPool(s, dx.f32(), y.f32(), argmax.i32());
  device_->MaxPoolBackward(s, gradient.f32(), argmax.i32(), result.f32());
  const std::vector<float> got = Download(result, x_count);
  for (size_t i = 0; i < x_count; ++i) ASSERT_EQ(got[i], expected[i]) << "input " << i;
}

TEST_P(DeviceOpsTest, SoftmaxCrossEntropyMatchesFiniteDifferences) {
  const int batch = 4, classes = 5;
  std::vector<float> logits = RandomVector(batch * classes, 19, -2.0f, 2.0f);
  std::vector<int32_t> labels = {0, 3, 4, 1};
  DeviceBuffer dlabels = UploadInts(labels), dloss = Zeros(1);
  auto loss = [&](const std::vector<float>& l) {
    DeviceBuffer dl = Upload(l);
    device_->SoftmaxCrossEntropy(batch, classes, dl.f32(), dlabels.i32(), dloss.f32(), nullptr);
    return static_cast<double>(Download(dloss, 1)[0]);
  };
  DeviceBuffer dl = Upload(logits), grad = Zeros(batch * classes);
  device_->SoftmaxCrossEntropy(batch, classes, dl.f32(), dlabels.i32(), dloss.f32(), grad.f32());
  double expected = 0;
  for (int n = 0; n < batch; ++n) {
    double sum = 0;
    for (int c = 0; c < classes; ++c) sum += std::exp(logits[n * classes + c]);
    expected += std::log(sum) - logits[n * classes + labels[n]];
  }
  EXPECT_NEAR(Download(dloss, 1)[0], expected / batch, 1e-5);
  ExpectGradientMatches(logits, loss, Download(grad, batch * classes), 1e-3f, 2e-3, 20);
}

TEST_P(DeviceOpsTest, SgdMomentumUpdateFollowsPyTorchSemantics) {
  std::vector<float> w = {1.0f, -2.0f}, g = {0.5f, 0.25f};
  DeviceBuffer dw = Upload(w), dg = Upload(g), dv = Zeros(2);
  const float lr = 0.1f, mu = 0.9f, wd = 0.01f;
  std::vector<double> v(2, 0.0), expected(w.begin(), w.end());
  for (int step = 0; step < 2; ++step) {
    device_->SgdMomentumUpdate(2, lr, mu, wd, dg.f32(), dv.f32(), dw.f32());
    for (int i = 0; i < 2; ++i) {
      const double d = g[i] + wd * expected[i];
      v[i] = mu * v[i] + d;
      expected[i] -= lr * v[i];
    }
  }
  std::vector<float> got = Download(dw, 2);
  EXPECT_NEAR(got[0], expected[0], 1e-6);
  EXPECT_NEAR(got[1], expected[1], 1e-6);
}

TEST_P(DeviceOpsTest, AddScaledDifferenceAddsAlphaTimesTheDifference) {
  // FedProx's term on a gradient: g += mu (w - w0) with mu = 0.5:
  // 1 + 0.5 (3 - 1) = 2; -1 + 0.5 (0.5 - 2.5) = -2; 0.25 + 0.5 (-4 - -4) = 0.25.
  DeviceBuffer g = Upload({1.0f, -1.0f, 0.25f}), w = Upload({3.0f, 0.5f, -4.0f}), w0 = Upload({1.0f, 2.5f, -4.0f});
  device_->AddScaledDifference(3, 0.5f, w.f32(), w0.f32(), g.f32());
  EXPECT_EQ(Download(g, 3), (std::vector<float>{2.0f, -2.0f, 0.25f}));
  // y may be one of the operands: y += 2 (y - b) = 3y - 2b.
  DeviceBuffer y = Upload({1.0f, 2.0f}), b = Upload({0.5f, -1.0f});
  device_->AddScaledDifference(2, 2.0f, y.f32(), b.f32(), y.f32());
  EXPECT_EQ(Download(y, 2), (std::vector<float>{2.0f, 8.0f}));
  // Nothing to do for zero elements.
  device_->AddScaledDifference(0, 1.0f, w.f32(), w0.f32(), g.f32());
  EXPECT_EQ(Download(g, 3), (std::vector<float>{2.0f, -2.0f, 0.25f}));
}

TEST_P(DeviceOpsTest, ReduceSumFillAndCast) {
  DeviceBuffer x = Zeros(1000), sum = Zeros(1);
  device_->Fill(1000, 0.25f, x.f32());
  device_->ReduceSum(1000, x.f32(), sum.f32());
  EXPECT_FLOAT_EQ(Download(sum, 1)[0], 250.0f);

  std::vector<float> values = {1.0f, -2.5f, 3.140625f, 65504.0f, 1e-3f};
  DeviceBuffer source = Upload(values), back = Zeros(values.size());
  for (DType narrow : {DType::kFloat16, DType::kBFloat16}) {
    auto half = device_->Allocate(values.size() * DTypeSize(narrow));
    ASSERT_TRUE(half.ok());
    device_->Cast(values.size(), DType::kFloat32, source.data(), narrow, half->data());
    device_->Cast(values.size(), narrow, half->data(), DType::kFloat32, back.data());
    std::vector<float> got = Download(back, values.size());
    for (size_t i = 0; i < values.size(); ++i) EXPECT_NEAR(got[i], values[i], std::fabs(values[i]) * 1e-2) << DTypeName(narrow);
  }
  auto ints = device_->Allocate(values.size());
  device_->Cast(values.size(), DType::kFloat32, source.data(), DType::kInt8, ints->data());
  device_->Cast(values.size(), DType::kInt8, ints->data(), DType::kFloat32, back.data());
  EXPECT_EQ(Download(back, values.size()), (std::vector<float>{1.0f, -2.0f, 3.0f, 127.0f, 0.0f}));
}

// ---- The ops of declared layer graphs ----

TEST_P(DeviceOpsTest, ActivationsMatchHandComputedValues) {
  const std::vector<float> x = {1.0f, -1.0f, 0.0f, 2.0f, 0.5f, -3.0f};
  DeviceBuffer dx = Upload(x), y = Zeros(x.size());
  device_->Activation(ActivationFunction::kGelu, x.size(), dx.f32(), y.f32());
  std::vector<float> got = Download(y, x.size());
  // x Phi(x): Phi(1) = 0.8413447, Phi(-1) = 0.1586553, Phi(2) = 0.9772499, Phi(0.5) = 0.6914625,
  // Phi(-3) = 0.0013499.
  const std::vector<double> gelu = {0.8413447460685429, -0.15865525393145707, 0.0, 1.9544997361036416,
                                    0.34573123063700656, -0.00404969409489031};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], gelu[i], 1e-6) << "gelu(" << x[i] << ")";
  device_->Activation(ActivationFunction::kTanh, x.size(), dx.f32(), y.f32());
  got = Download(y, x.size());
  const std::vector<double> tanh = {0.7615941559557649, -0.7615941559557649, 0.0, 0.9640275800758169,
                                    0.46211715726000974, -0.9950547536867305};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], tanh[i], 1e-6) << "tanh(" << x[i] << ")";
  device_->Activation(ActivationFunction::kSigmoid, x.size(), dx.f32(), y.f32());
  got = Download(y, x.size());
  const std::vector<double> sigmoid = {0.7310585786300049, 0.2689414213699951, 0.5, 0.8807970779778823,
                                       0.6224593312018546, 0.04742587317756678};
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(got[i], sigmoid[i], 1e-6) << "sigmoid(" << x[i] << ")";

  // Far into saturation: no NaN from an overflowing exp, and the limits exactly.
  DeviceBuffer extreme = Upload({-100.0f, 100.0f}), out = Zeros(2);
  device_->Activation(ActivationFunction::kSigmoid, 2, extreme.f32(), out.f32());
  std::vector<float> limits = Download(out, 2);
  EXPECT_GE(limits[0], 0.0f);
  EXPECT_LT(limits[0], 1e-40f);
  EXPECT_EQ(limits[1], 1.0f);
  device_->Activation(ActivationFunction::kTanh, 2, extreme.f32(), out.f32());
  EXPECT_EQ(Download(out, 2), (std::vector<float>{-1.0f, 1.0f}));
  device_->Activation(ActivationFunction::kGelu, 2, extreme.f32(), out.f32());
  limits = Download(out, 2);
  EXPECT_EQ(limits[0], 0.0f);  // -100 Phi(-100) is far below float's smallest
  EXPECT_EQ(limits[1], 100.0f);

  // In place (y = x).
  DeviceBuffer in_place = Upload({0.0f, 2.0f});
  device_->Activation(ActivationFunction::kSigmoid, 2, in_place.f32(), in_place.f32());
  got = Download(in_place, 2);
  EXPECT_FLOAT_EQ(got[0], 0.5f);
  EXPECT_NEAR(got[1], 0.8807970779778823, 1e-6);
}

// f'(x) at hand-computed points: GELU from x (Phi(x) + x phi(x)), tanh and sigmoid from y.
TEST_P(DeviceOpsTest, ActivationBackwardMatchesHandComputedDerivatives) {
  const std::vector<float> x = {1.0f, 0.0f, -2.0f};
  const std::vector<float> dy = {2.0f, -1.0f, 0.5f};
  DeviceBuffer dx_in = Upload(x), ddy = Upload(dy), y = Zeros(3), grad = Zeros(3);
  device_->Activation(ActivationFunction::kGelu, 3, dx_in.f32(), y.f32());
  device_->ActivationBackward(ActivationFunction::kGelu, 3, dx_in.f32(), y.f32(), ddy.f32(), grad.f32());
  std::vector<float> got = Download(grad, 3);
  // Phi(1) + phi(1) = 0.8413447 + 0.2419707; 0.5 at 0; Phi(-2) - 2 phi(-2) = 0.0227501 - 0.1079819.
  EXPECT_NEAR(got[0], 2.0 * 1.0833154705876864, 1e-6);
  EXPECT_NEAR(got[1], -0.5, 1e-6);
  EXPECT_NEAR(got[2], 0.5 * -0.08523180107819692, 1e-6);

  // From y directly: tanh' = 1 - y^2, sigmoid' = y (1 - y); x is not what they read.
  DeviceBuffer outputs = Upload({0.5f, 0.0f, -0.25f});
  device_->ActivationBackward(ActivationFunction::kTanh, 3, dx_in.f32(), outputs.f32(), ddy.f32(), grad.f32());
  EXPECT_EQ(Download(grad, 3), (std::vector<float>{2.0f * 0.75f, -1.0f, 0.5f * 0.9375f}));
  DeviceBuffer probabilities = Upload({0.5f, 0.25f, 1.0f});
  device_->ActivationBackward(ActivationFunction::kSigmoid, 3, dx_in.f32(), probabilities.f32(), ddy.f32(),
                              grad.f32());
  EXPECT_EQ(Download(grad, 3), (std::vector<float>{2.0f * 0.25f, -0.1875f, 0.0f}));

  // dx may be dy.
  device_->ActivationBackward(ActivationFunction::kTanh, 3, dx_in.f32(), outputs.f32(), ddy.f32(), ddy.f32());
  EXPECT_EQ(Download(ddy, 3), (std::vector<float>{1.5f, -1.0f, 0.46875f}));
}

TEST_P(DeviceOpsTest, ActivationBackwardMatchesFiniteDifferencesForEveryFunction) {
  const size_t count = 64;
  const std::vector<float> x = RandomVector(count, 30, -3.0f, 3.0f), probe = RandomVector(count, 31);
  for (ActivationFunction function :
       {ActivationFunction::kGelu, ActivationFunction::kTanh, ActivationFunction::kSigmoid}) {
    SCOPED_TRACE(std::string(ActivationName(function)));
    auto loss = [&](const std::vector<float>& xv) {
      DeviceBuffer dx = Upload(xv), dy = Zeros(count);
      device_->Activation(function, count, dx.f32(), dy.f32());
      return Dot(Download(dy, count), probe);
    };
    DeviceBuffer dx = Upload(x), y = Zeros(count), dprobe = Upload(probe), grad = Zeros(count);
    device_->Activation(function, count, dx.f32(), y.f32());
    device_->ActivationBackward(function, count, dx.f32(), y.f32(), dprobe.f32(), grad.f32());
    ExpectGradientMatches(x, loss, Download(grad, count), 1e-2f, 1e-3, 64);
  }
}

TEST_P(DeviceOpsTest, AvgPoolAveragesEachWindowAndSpreadsTheGradientBack) {
  MaxPoolShape s;
  s.batch = 1, s.channels = 1, s.in_height = 4, s.in_width = 4;  // window 2, stride 2: 2x2 out
  std::vector<float> x(16);
  std::iota(x.begin(), x.end(), 0.0f);
  DeviceBuffer dx = Upload(x), y = Zeros(4);
  device_->AvgPool(s, dx.f32(), y.f32());
  // (0 + 1 + 4 + 5) / 4, (2 + 3 + 6 + 7) / 4, (8 + 9 + 12 + 13) / 4, (10 + 11 + 14 + 15) / 4.
  EXPECT_EQ(Download(y, 4), (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}));

  DeviceBuffer dy = Upload({4.0f, 8.0f, -4.0f, 1.0f}), grad = Upload(std::vector<float>(16, std::nanf("")));
  device_->AvgPoolBackward(s, dy.f32(), grad.f32());
  EXPECT_EQ(Download(grad, 16), (std::vector<float>{1, 1, 2, 2,  //
                                                    1, 1, 2, 2,  //
                                                    -1, -1, 0.25f, 0.25f,  //
                                                    -1, -1, 0.25f, 0.25f}));

  // Overlapping windows (3, stride 2) over 6x6: the middle row and column are shared; the last
  // row and column lie in no window and get 0 (dx starts as NaN: it is overwritten).
  MaxPoolShape overlap;
  overlap.batch = 1, overlap.channels = 1, overlap.in_height = 6, overlap.in_width = 6, overlap.window = 3,
  overlap.stride = 2;
  ASSERT_EQ(overlap.out_height(), 2);
  DeviceBuffer shares = Upload({9.0f, 18.0f, 27.0f, 36.0f}), spread = Upload(std::vector<float>(36, std::nanf("")));
  device_->AvgPoolBackward(overlap, shares.f32(), spread.f32());
  EXPECT_EQ(Download(spread, 36), (std::vector<float>{1, 1, 3, 2, 2, 0,     //
                                                      1, 1, 3, 2, 2, 0,     //
                                                      4, 4, 10, 6, 6, 0,    //
                                                      3, 3, 7, 4, 4, 0,     //
                                                      3, 3, 7, 4, 4, 0,     //
                                                      0, 0, 0, 0, 0, 0}));
}

TEST_P(DeviceOpsTest, AvgPoolBackwardMatchesFiniteDifferences) {
  MaxPoolShape s;
  s.batch = 2, s.channels = 3, s.in_height = 7, s.in_width = 10, s.window = 3, s.stride = 2;  // overlaps, a column left
  const size_t x_count = 2 * 3 * 7 * 10, y_count = 2 * 3 * size_t(s.out_height()) * s.out_width();
  const std::vector<float> x = RandomVector(x_count, 32), probe = RandomVector(y_count, 33);
  auto loss = [&](const std::vector<float>& xv) {
    DeviceBuffer dx = Upload(xv), dy = Zeros(y_count);
    device_->AvgPool(s, dx.f32(), dy.f32());
    return Dot(Download(dy, y_count), probe);
  };
  DeviceBuffer dprobe = Upload(probe), grad = Zeros(x_count);
  device_->AvgPoolBackward(s, dprobe.f32(), grad.f32());
  ExpectGradientMatches(x, loss, Download(grad, x_count), 1e-2f, 1e-3, 140);
}

// Two channels of four values each, laid out [outer 2][channels 2][inner 2]: channel 0 holds
// 1, 2, 3, 4 (mean 2.5, biased variance 1.25, unbiased 5/3), channel 1 holds -1, 1, -1, 1
// (mean 0, variance 1, unbiased 4/3).
TEST_P(DeviceOpsTest, BatchNormForwardMatchesHandComputedStatistics) {
  const BatchNormShape shape{2, 2, 2};
  const std::vector<float> x = {1, 2, -1, 1, 3, 4, -1, 1};
  const float epsilon = 1e-5f, momentum = 0.1f;
  DeviceBuffer dx = Upload(x), gamma = Upload({2.0f, 0.5f}), beta = Upload({0.1f, -1.0f});
  DeviceBuffer running_mean = Upload({0.0f, 1.0f}), running_var = Upload({1.0f, 2.0f});
  DeviceBuffer saved_mean = Zeros(2), saved_invstd = Zeros(2), y = Zeros(8);
  device_->BatchNormForward(shape, true, momentum, epsilon, dx.f32(), gamma.f32(), beta.f32(), running_mean.f32(),
                            running_var.f32(), saved_mean.f32(), saved_invstd.f32(), y.f32());
  const double invstd0 = 1.0 / std::sqrt(1.25 + 1e-5), invstd1 = 1.0 / std::sqrt(1.0 + 1e-5);
  std::vector<float> mean = Download(saved_mean, 2), invstd = Download(saved_invstd, 2);
  EXPECT_NEAR(mean[0], 2.5, 1e-6);
  EXPECT_NEAR(mean[1], 0.0, 1e-6);
  EXPECT_NEAR(invstd[0], invstd0, 1e-6);
  EXPECT_NEAR(invstd[1], invstd1, 1e-6);
  // running = 0.9 running + 0.1 batch, the variance unbiased.
  std::vector<float> running = Download(running_mean, 2);
  EXPECT_NEAR(running[0], 0.25, 1e-6);
  EXPECT_NEAR(running[1], 0.9, 1e-6);
  running = Download(running_var, 2);
  EXPECT_NEAR(running[0], 0.9 + 0.1 * 5.0 / 3.0, 1e-6);
  EXPECT_NEAR(running[1], 1.8 + 0.1 * 4.0 / 3.0, 1e-6);
  const std::vector<double> expected = {2 * -1.5 * invstd0 + 0.1, 2 * -0.5 * invstd0 + 0.1, 0.5 * -1 * invstd1 - 1,
                                        0.5 * 1 * invstd1 - 1,    2 * 0.5 * invstd0 + 0.1,  2 * 1.5 * invstd0 + 0.1,
                                        0.5 * -1 * invstd1 - 1,   0.5 * 1 * invstd1 - 1};
  std::vector<float> got = Download(y, 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], expected[i], 1e-5) << "training y " << i;

  // Not training: the running statistics normalise, and nothing but y is written (the saved
  // buffers keep their sentinels; the saved pointers may also be null).
  DeviceBuffer fixed_mean = Upload({1.0f, -1.0f}), fixed_var = Upload({4.0f, 0.25f});
  DeviceBuffer sentinel_mean = Upload({7.0f, 7.0f}), sentinel_invstd = Upload({7.0f, 7.0f});
  device_->BatchNormForward(shape, false, momentum, epsilon, dx.f32(), gamma.f32(), beta.f32(), fixed_mean.f32(),
                            fixed_var.f32(), sentinel_mean.f32(), sentinel_invstd.f32(), y.f32());
  const double a0 = 1.0 / std::sqrt(4.0 + 1e-5), a1 = 1.0 / std::sqrt(0.25 + 1e-5);
  const std::vector<double> inference = {2 * 0 * a0 + 0.1, 2 * 1 * a0 + 0.1, 0.5 * 0 * a1 - 1, 0.5 * 2 * a1 - 1,
                                         2 * 2 * a0 + 0.1, 2 * 3 * a0 + 0.1, 0.5 * 0 * a1 - 1, 0.5 * 2 * a1 - 1};
  got = Download(y, 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], inference[i], 1e-5) << "inference y " << i;
  EXPECT_EQ(Download(fixed_mean, 2), (std::vector<float>{1.0f, -1.0f}));
  EXPECT_EQ(Download(fixed_var, 2), (std::vector<float>{4.0f, 0.25f}));
  EXPECT_EQ(Download(sentinel_mean, 2), (std::vector<float>{7.0f, 7.0f}));
  EXPECT_EQ(Download(sentinel_invstd, 2), (std::vector<float>{7.0f, 7.0f}));
  DeviceBuffer y_again = Zeros(8);
  device_->BatchNormForward(shape, false, momentum, epsilon, dx.f32(), gamma.f32(), beta.f32(), fixed_mean.f32(),
                            fixed_var.f32(), nullptr, nullptr, y_again.f32());
  EXPECT_EQ(Download(y_again, 8), got);

  // One position per channel: the variance is 0, y = beta, and the running variance takes the
  // biased (zero) one rather than dividing by n - 1 = 0.
  const BatchNormShape single{1, 2, 1};
  DeviceBuffer one = Upload({3.0f, -5.0f}), one_y = Zeros(2), one_mean = Upload({0.0f, 0.0f});
  DeviceBuffer one_var = Upload({1.0f, 2.0f});
  device_->BatchNormForward(single, true, momentum, epsilon, one.f32(), gamma.f32(), beta.f32(), one_mean.f32(),
                            one_var.f32(), saved_mean.f32(), saved_invstd.f32(), one_y.f32());
  got = Download(one_y, 2);
  EXPECT_NEAR(got[0], 0.1, 1e-6);
  EXPECT_NEAR(got[1], -1.0, 1e-6);
  running = Download(one_var, 2);
  EXPECT_NEAR(running[0], 0.9, 1e-6);
  EXPECT_NEAR(running[1], 1.8, 1e-6);
  running = Download(one_mean, 2);
  EXPECT_NEAR(running[0], 0.3, 1e-6);
  EXPECT_NEAR(running[1], -0.5, 1e-6);
  EXPECT_NEAR(Download(saved_invstd, 2)[0], 1.0 / std::sqrt(1e-5), 1e-2);
}

TEST_P(DeviceOpsTest, BatchNormBackwardMatchesFiniteDifferences) {
  const BatchNormShape shape{3, 2, 4};  // n = 12 positions per channel
  const size_t count = 24;
  const std::vector<float> x = RandomVector(count, 34), gamma = RandomVector(2, 35, 0.5f, 1.5f),
                           beta = RandomVector(2, 36), probe = RandomVector(count, 37);
  auto loss = [&](const std::vector<float>& xv, const std::vector<float>& gv, const std::vector<float>& bv) {
    DeviceBuffer dx = Upload(xv), dg = Upload(gv), db = Upload(bv), mean = Zeros(2), var = Upload({1.0f, 1.0f});
    DeviceBuffer saved_mean = Zeros(2), saved_invstd = Zeros(2), y = Zeros(count);
    device_->BatchNormForward(shape, true, 0.1f, 1e-5f, dx.f32(), dg.f32(), db.f32(), mean.f32(), var.f32(),
                              saved_mean.f32(), saved_invstd.f32(), y.f32());
    return Dot(Download(y, count), probe);
  };
  DeviceBuffer dx = Upload(x), dg = Upload(gamma), db = Upload(beta), mean = Zeros(2), var = Upload({1.0f, 1.0f});
  DeviceBuffer saved_mean = Zeros(2), saved_invstd = Zeros(2), y = Zeros(count), dprobe = Upload(probe);
  device_->BatchNormForward(shape, true, 0.1f, 1e-5f, dx.f32(), dg.f32(), db.f32(), mean.f32(), var.f32(),
                            saved_mean.f32(), saved_invstd.f32(), y.f32());
  DeviceBuffer grad_x = Zeros(count), grad_gamma = Zeros(2), grad_beta = Zeros(2);
  device_->BatchNormBackward(shape, dx.f32(), dprobe.f32(), dg.f32(), saved_mean.f32(), saved_invstd.f32(),
                             grad_x.f32(), grad_gamma.f32(), grad_beta.f32());
  ExpectGradientMatches(x, [&](const std::vector<float>& v) { return loss(v, gamma, beta); },
                        Download(grad_x, count), 1e-2f, 1e-3, 24);
  ExpectGradientMatches(gamma, [&](const std::vector<float>& v) { return loss(x, v, beta); },
                        Download(grad_gamma, 2), 1e-2f, 1e-3);
  ExpectGradientMatches(beta, [&](const std::vector<float>& v) { return loss(x, gamma, v); },
                        Download(grad_beta, 2), 1e-2f, 1e-3);
  // The sum of dx over a channel is 0 (shifting a channel's inputs changes nothing).
  const std::vector<float> gx = Download(grad_x, count);
  for (int c = 0; c < 2; ++c) {
    double sum = 0;
    for (int o = 0; o < 3; ++o) {
      for (int i = 0; i < 4; ++i) sum += gx[(o * 2 + c) * 4 + i];
    }
    EXPECT_NEAR(sum, 0.0, 1e-5) << "channel " << c;
  }
  // Without dx: the same dgamma and dbeta, overwritten (not accumulated).
  DeviceBuffer only_gamma = Upload({5.0f, 5.0f}), only_beta = Upload({5.0f, 5.0f});
  device_->BatchNormBackward(shape, dx.f32(), dprobe.f32(), dg.f32(), saved_mean.f32(), saved_invstd.f32(), nullptr,
                             only_gamma.f32(), only_beta.f32());
  EXPECT_EQ(Download(only_gamma, 2), Download(grad_gamma, 2));
  EXPECT_EQ(Download(only_beta, 2), Download(grad_beta, 2));
}

TEST_P(DeviceOpsTest, LayerNormForwardMatchesHandComputedRows) {
  // Row 0: 1, 2, 3, 4 (mean 2.5, biased variance 1.25); row 1: constant (variance 0: y = beta).
  const std::vector<float> x = {1, 2, 3, 4, 10, 10, 10, 10};
  DeviceBuffer dx = Upload(x), gamma = Upload({1.0f, 2.0f, 0.5f, -1.0f}), beta = Upload({0.0f, 0.5f, 0.0f, 1.0f});
  DeviceBuffer saved_mean = Zeros(2), saved_invstd = Zeros(2), y = Zeros(8);
  device_->LayerNormForward(2, 4, 1e-5f, dx.f32(), gamma.f32(), beta.f32(), saved_mean.f32(), saved_invstd.f32(),
                            y.f32());
  const double invstd = 1.0 / std::sqrt(1.25 + 1e-5);
  const std::vector<double> expected = {-1.5 * invstd, 2 * -0.5 * invstd + 0.5, 0.5 * 0.5 * invstd, -1.5 * invstd + 1,
                                        0.0, 0.5, 0.0, 1.0};
  const std::vector<float> got = Download(y, 8);
  for (size_t i = 0; i < 8; ++i) EXPECT_NEAR(got[i], expected[i], 1e-5) << "y " << i;
  const std::vector<float> mean = Download(saved_mean, 2), inverse = Download(saved_invstd, 2);
  EXPECT_NEAR(mean[0], 2.5, 1e-6);
  EXPECT_NEAR(mean[1], 10.0, 1e-5);
  EXPECT_NEAR(inverse[0], invstd, 1e-6);
  EXPECT_NEAR(inverse[1], 1.0 / std::sqrt(1e-5), 1e-2);
}

TEST_P(DeviceOpsTest, LayerNormBackwardMatchesFiniteDifferences) {
  const int64_t rows = 3;
  const int columns = 5;
  const size_t count = rows * columns;
  const std::vector<float> x = RandomVector(count, 38), gamma = RandomVector(columns, 39, 0.5f, 1.5f),
                           beta = RandomVector(columns, 40), probe = RandomVector(count, 41);
  auto loss = [&](const std::vector<float>& xv, const std::vector<float>& gv, const std::vector<float>& bv) {
    DeviceBuffer dx = Upload(xv), dg = Upload(gv), db = Upload(bv), mean = Zeros(rows), invstd = Zeros(rows);
    DeviceBuffer y = Zeros(count);
    device_->LayerNormForward(rows, columns, 1e-5f, dx.f32(), dg.f32(), db.f32(), mean.f32(), invstd.f32(), y.f32());
    return Dot(Download(y, count), probe);
  };
  DeviceBuffer dx = Upload(x), dg = Upload(gamma), db = Upload(beta), mean = Zeros(rows), invstd = Zeros(rows);
  DeviceBuffer y = Zeros(count), dprobe = Upload(probe);
  device_->LayerNormForward(rows, columns, 1e-5f, dx.f32(), dg.f32(), db.f32(), mean.f32(), invstd.f32(), y.f32());
  DeviceBuffer grad_x = Zeros(count), grad_gamma = Zeros(columns), grad_beta = Zeros(columns);
  device_->LayerNormBackward(rows, columns, dx.f32(), dprobe.f32(), dg.f32(), mean.f32(), invstd.f32(), grad_x.f32(),
                             grad_gamma.f32(), grad_beta.f32());
  ExpectGradientMatches(x, [&](const std::vector<float>& v) { return loss(v, gamma, beta); },
                        Download(grad_x, count), 1e-2f, 1e-3, int(count));
  ExpectGradientMatches(gamma, [&](const std::vector<float>& v) { return loss(x, v, beta); },
                        Download(grad_gamma, columns), 1e-2f, 1e-3, columns);
  ExpectGradientMatches(beta, [&](const std::vector<float>& v) { return loss(x, gamma, v); },
                        Download(grad_beta, columns), 1e-2f, 1e-3, columns);
  // Without dx: the same dgamma and dbeta, overwritten.
  DeviceBuffer only_gamma = Upload(std::vector<float>(columns, 5.0f));
  DeviceBuffer only_beta = Upload(std::vector<float>(columns, 5.0f));
  device_->LayerNormBackward(rows, columns, dx.f32(), dprobe.f32(), dg.f32(), mean.f32(), invstd.f32(), nullptr,
                             only_gamma.f32(), only_beta.f32());
  EXPECT_EQ(Download(only_gamma, columns), Download(grad_gamma, columns));
  EXPECT_EQ(Download(only_beta, columns), Download(grad_beta, columns));
}

// SplitMix64's first output from state 0 is 0xE220A8397B1DCDAF (the published sequence), so
// DropoutUniform(0, 0) is its top 24 bits, 0xE220A8, times 2^-24.
TEST(DropoutUniformTest, IsSplitMix64sTopTwentyFourBits) {
  EXPECT_EQ(DropoutUniform(0, 0), 14819496.0f / 16777216.0f);
  EXPECT_EQ(DropoutUniform(0, 1), 7239838.0f / 16777216.0f);   // 0x6E789E6AA1B965F4
  EXPECT_EQ(DropoutUniform(42, 7), 13432373.0f / 16777216.0f);  // from state 42 + 7 * 0x9E3779B97F4A7C15
  double sum = 0;
  for (uint64_t i = 0; i < 100000; ++i) {
    const float u = DropoutUniform(12345, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / 100000, 0.5, 0.005);
}

TEST_P(DeviceOpsTest, DropoutKeepsAboutOneMinusPScaledAndIsAFunctionOfTheSeed) {
  const size_t count = 100000;
  const float p = 0.3f;
  const std::vector<float> x = RandomVector(count, 42);
  DeviceBuffer dx = Upload(x), y = Zeros(count), mask = Zeros(count);
  device_->Dropout(count, p, 2024, dx.f32(), y.f32(), mask.f32());
  const std::vector<float> got_y = Download(y, count), got_mask = Download(mask, count);
  const float scale = 1.0f / (1.0f - p);
  size_t kept = 0;
  for (size_t i = 0; i < count; ++i) {
    // The draw is device.h's: the same elements on every backend.
    const bool keep = DropoutUniform(2024, i) >= p;
    ASSERT_EQ(got_mask[i], keep ? scale : 0.0f) << "element " << i;
    ASSERT_EQ(got_y[i], x[i] * got_mask[i]) << "element " << i;
    kept += keep;
  }
  // 0.7 +- 0.01 is seven standard deviations of a binomial fraction over 100000 draws.
  EXPECT_NEAR(double(kept) / count, 1.0 - p, 0.01);

  DeviceBuffer mask_again = Zeros(count), y_again = Zeros(count);
  device_->Dropout(count, p, 2024, dx.f32(), y_again.f32(), mask_again.f32());
  EXPECT_EQ(Download(mask_again, count), got_mask);
  device_->Dropout(count, p, 2025, dx.f32(), y_again.f32(), mask_again.f32());
  const std::vector<float> other = Download(mask_again, count);
  size_t differ = 0;
  for (size_t i = 0; i < count; ++i) differ += other[i] != got_mask[i];
  EXPECT_GT(differ, count / 4) << "another seed must draw other elements";  // 2 p (1 - p) = 42% expected

  // p = 0 keeps everything with mask 1: y = x bit for bit.
  device_->Dropout(count, 0.0f, 7, dx.f32(), y_again.f32(), mask_again.f32());
  EXPECT_EQ(Download(y_again, count), x);
  EXPECT_EQ(Download(mask_again, count), std::vector<float>(count, 1.0f));
}

TEST_P(DeviceOpsTest, DropoutBackwardMultipliesByTheMask) {
  DeviceBuffer mask = Upload({0.0f, 2.0f, 1.25f, 0.0f}), dy = Upload({3.0f, -1.5f, 4.0f, std::nanf("")});
  DeviceBuffer dx = Zeros(4);
  device_->DropoutBackward(3, mask.f32(), dy.f32(), dx.f32());
  EXPECT_EQ(Download(dx, 4), (std::vector<float>{0.0f, -3.0f, 5.0f, 0.0f}));  // the fourth is not touched
  device_->DropoutBackward(3, mask.f32(), dy.f32(), dy.f32());  // dx may be dy
  EXPECT_EQ(Download(dy, 3), (std::vector<float>{0.0f, -3.0f, 5.0f}));
}

TEST_P(DeviceOpsTest, AxpbyScalesAndAddsWithoutReadingYWhenBetaIsZero) {
  DeviceBuffer x = Upload({1.0f, -2.0f, 0.5f}), y = Upload({4.0f, 1.0f, -8.0f});
  device_->Axpby(3, 2.0f, x.f32(), 0.5f, y.f32());  // 2 x + 0.5 y
  EXPECT_EQ(Download(y, 3), (std::vector<float>{4.0f, -3.5f, -3.0f}));
  device_->Axpby(3, 1.0f, x.f32(), 1.0f, y.f32());  // a residual sum
  EXPECT_EQ(Download(y, 3), (std::vector<float>{5.0f, -5.5f, -2.5f}));
  // beta 0: y = alpha x, and the NaNs (and infinities) in y do not survive.
  DeviceBuffer poisoned = Upload({std::nanf(""), std::numeric_limits<float>::infinity(), std::nanf("")});
  device_->Axpby(3, -3.0f, x.f32(), 0.0f, poisoned.f32());
  EXPECT_EQ(Download(poisoned, 3), (std::vector<float>{-3.0f, 6.0f, -1.5f}));
  // y may be x: y = (alpha + beta) y.
  device_->Axpby(3, 2.0f, x.f32(), 1.0f, x.f32());
  EXPECT_EQ(Download(x, 3), (std::vector<float>{3.0f, -6.0f, 1.5f}));
  // Nothing for zero elements.
  device_->Axpby(0, 2.0f, y.f32(), 0.0f, poisoned.f32());
  EXPECT_EQ(Download(poisoned, 3), (std::vector<float>{-3.0f, 6.0f, -1.5f}));
}

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOpsTest, ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;  // "emu:a100" -> "emu_a100"
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace tessera
