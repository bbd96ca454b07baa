// The Device op suite, run for every registered backend that is viable here. Linear ops are
// checked against naive references; every op with a backward is checked against central
// finite differences of a scalar loss L = sum(output * probe). The ops of declared layer
// graphs are in layer_ops_test.cc, on the same fixture (device_ops_fixture.h).
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
#include "tests/device/device_ops_fixture.h"

namespace tessera {
namespace {

using device_test::BackendNames;
using device_test::DeviceOpsTest;
using device_test::RandomVector;

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

INSTANTIATE_TEST_SUITE_P(Backends, DeviceOpsTest, ::testing::ValuesIn(BackendNames()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;  // "emu:a100" -> "emu_a100"
                           for (char& c : name) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return name;
                         });

}  // namespace
}  // namespace tessera
