// The Device ops of declared layer graphs (activations, average pooling, batch and layer norm,
// dropout, axpby) on every viable float32 backend: hand-computed values, and central
// finite differences of L = sum(output * probe) for every backward. The fixture and the
// instantiation are device_ops_test.cc's.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "device/device.h"
#include "tests/device/device_ops_fixture.h"

namespace tessera {
namespace {

using device_test::DeviceOpsTest;
using device_test::RandomVector;

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

}  // namespace
}  // namespace tessera
