// Batch norms at the edges of their statistics: a state whose running variance is negative,
// refused where a model's state is set, and a training batch of one sample, which gives a
// batch norm on a [C, 1, 1] input one value per channel and is skipped (core/train/trainer.h).
#include <gtest/gtest.h>

#include <numeric>

#include "core/model/model.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"

namespace tessera {
namespace {

LayerConfig L(std::string type, std::string name = "", int out = 0) {
  LayerConfig layer;
  layer.type = std::move(type);
  layer.name = std::move(name);
  layer.out = out;
  return layer;
}

// On 1x4x4 samples of two classes.
ModelConfig Declared(std::vector<LayerConfig> layers) {
  ModelConfig config;
  config.name = "declared";
  config.layers = std::move(layers);
  config.channels = 1;
  config.rows = config.cols = 4;
  config.classes = 2;
  config.seed = 3;
  return config;
}

// A batch norm after a linear layer: its input is [8, 1, 1].
ModelConfig NormAfterLinear() {
  return Declared({L("flatten"), L("linear", "fc", 8), L("batch_norm", "bn"), L("relu"), L("linear", "out")});
}

// `count` samples of 1x4x4, labels alternating.
Dataset Samples(int64_t count) {
  Dataset data;
  data.source = "synthetic";
  data.count = count;
  data.rows = data.cols = 4;
  data.num_classes = 2;
  for (int64_t i = 0; i < count * 16; ++i) data.images.push_back(static_cast<float>((i * 7) % 11) * 0.1f - 0.4f);
  for (int64_t i = 0; i < count; ++i) data.labels.push_back(static_cast<uint8_t>(i % 2));
  return data;
}

class BatchNormTest : public ::testing::Test {
 protected:
  std::unique_ptr<Model> Build(const ModelConfig& config) {
    auto model = CreateModel(config, device_.get());
    EXPECT_TRUE(model.ok()) << model.status().ToString();
    return model.ok() ? std::move(model).value() : nullptr;
  }
  // Alone, or as member `shard` of a cohort of `shards` with a hook that passes the slice's
  // gradient on.
  Result<TrainReport> Train(Model& model, int64_t count, uint32_t batch_size, uint32_t epochs, uint32_t shard = 0,
                            uint32_t shards = 1) {
    struct PassOn : GradientHook {
      Status OnGradients(Device&, DeviceBuffer&, int64_t, int64_t) override { return Status::Ok(); }
    } hook;
    data_ = Samples(count);
    std::vector<int64_t> indices(static_cast<size_t>(count));
    std::iota(indices.begin(), indices.end(), 0);
    TrainOptions options;
    options.batch_size = batch_size;
    options.epochs = epochs;
    options.learning_rate = 0.1f;
    options.shard_index = shard;
    options.shard_count = shards;
    if (shards > 1) options.gradient_hook = &hook;
    return TrainLocal(model, data_, indices, options);
  }
  std::unique_ptr<Device> device_ = CreateCpuDevice();
  Dataset data_;
};

// A negative running variance was taken (from a checkpoint, a model file, a download), and
// every evaluation then gave NaN: the square root of variance plus epsilon. Refused, naming
// the tensor and the element; nothing of the state is set.
TEST_F(BatchNormTest, ANegativeRunningVarianceIsRefused) {
  auto model = Build(NormAfterLinear());
  ASSERT_NE(model, nullptr);
  const TensorSet before = model->GetState().value();
  TensorSet state = before;
  for (NamedTensor& tensor : state) {
    if (tensor.name == "bn.running_var") tensor.values[5] = -0.25f;
    if (tensor.name == "fc.bias") tensor.values[0] = 7.0f;
  }
  const Status set = model->SetState(state);
  ASSERT_FALSE(set.ok());
  EXPECT_EQ(set.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(set.message().find("tensor 'bn.running_var' element 5 is -0.25; expected a value of 0 or more"),
            std::string::npos)
      << set.ToString();
  const TensorSet after = model->GetState().value();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].values, before[i].values) << after[i].name;
  // A model built from such a state (a worker's round) is refused alike.
  auto created = CreateModelWithState(NormAfterLinear(), device_.get(), state);
  ASSERT_FALSE(created.ok());
  EXPECT_NE(created.status().message().find("'bn.running_var' element 5"), std::string::npos)
      << created.status().ToString();
  // Zero is a variance (a channel that never varied); a negative mean or weight is no matter.
  for (NamedTensor& tensor : state) {
    if (tensor.name == "bn.running_var") tensor.values[5] = 0.0f;
    if (tensor.name == "bn.running_mean" || tensor.name == "bn.weight") tensor.values[1] = -3.0f;
  }
  EXPECT_TRUE(model->SetState(state).ok());
}

// A batch of one sample (a share of one, or the last batch of an epoch) gave the batch norm one
// value per channel: variance 0, an output of the bias alone, no gradient back, and running
// variances pulled toward 0. Such a batch is skipped and counted; the model is as it was.
TEST_F(BatchNormTest, ABatchOfOneSampleIsSkippedWhenANormSeesOneValuePerChannel) {
  auto model = Build(NormAfterLinear());
  ASSERT_NE(model, nullptr);
  const TensorSet before = model->GetState().value();
  auto report = Train(*model, 1, 4, 3);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->steps, 0u);
  EXPECT_EQ(report->samples, 0u);
  EXPECT_EQ(report->skipped_batches, 3u);
  EXPECT_EQ(report->skipped_for, "bn");
  const TensorSet after = model->GetState().value();
  for (size_t i = 0; i < after.size(); ++i) EXPECT_EQ(after[i].values, before[i].values) << after[i].name;
}

// Five samples in batches of two: the last batch of each epoch holds one and is skipped; the
// others train as before.
TEST_F(BatchNormTest, OnlyTheBatchesOfOneSampleAreSkipped) {
  auto model = Build(NormAfterLinear());
  ASSERT_NE(model, nullptr);
  auto report = Train(*model, 5, 2, 2);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->steps, 4u);
  EXPECT_EQ(report->samples, 8u);
  EXPECT_EQ(report->skipped_batches, 2u);
  EXPECT_EQ(report->skipped_for, "bn");
}

// In a site cohort each member's batch norm sees its own slice of the batch. Seven samples in
// batches of four between two members: the last batch of each epoch (three samples) gives the
// first member one, so both members skip it; the full batches give each two and train.
TEST_F(BatchNormTest, ACohortSkipsABatchThatGivesSomeMemberOneSample) {
  for (uint32_t shard : {0u, 1u}) {
    auto model = Build(NormAfterLinear());
    ASSERT_NE(model, nullptr);
    auto report = Train(*model, 7, 4, 2, shard, 2);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->steps, 2u) << "member " << shard;
    EXPECT_EQ(report->samples, 4u) << "member " << shard;
    EXPECT_EQ(report->skipped_batches, 2u) << "member " << shard;
    EXPECT_EQ(report->skipped_for, "bn");
  }
}

// A batch size that gives some member one sample of every full batch would train nothing:
// refused, naming the batch, the members and the norm. Four members of eight-sample batches
// (two each) train.
TEST_F(BatchNormTest, ACohortBatchSizeThatGivesAMemberOneSampleIsRefused) {
  for (auto [batch, shards] : {std::pair{3u, 2u}, {2u, 2u}, {4u, 4u}, {5u, 4u}}) {
    auto model = Build(NormAfterLinear());
    ASSERT_NE(model, nullptr);
    auto report = Train(*model, 16, batch, 1, 0, shards);
    ASSERT_FALSE(report.ok()) << batch << " among " << shards;
    EXPECT_EQ(report.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(report.status().message().find("a batch of " + std::to_string(batch) + " samples cut among " +
                                             std::to_string(shards) + " cohort members"),
              std::string::npos)
        << report.status().ToString();
    EXPECT_NE(report.status().message().find("batch norm 'bn'"), std::string::npos);
  }
  auto model = Build(NormAfterLinear());
  ASSERT_NE(model, nullptr);
  auto report = Train(*model, 16, 8, 1, 3, 4);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->steps, 2u);
  EXPECT_EQ(report->skipped_batches, 0u);
}

// A batch norm after a convolution holds a sample's positions per channel: a batch of one
// trains. So does any batch of a model without a batch norm.
TEST_F(BatchNormTest, ABatchOfOneTrainsWhereEachChannelHoldsMoreThanOneValue) {
  LayerConfig conv = L("conv2d", "conv", 2);
  conv.kernel = 3;
  for (const ModelConfig& config :
       {Declared({conv, L("batch_norm", "bn"), L("relu"), L("flatten"), L("linear", "out")}),
        Declared({L("flatten"), L("linear", "fc", 8), L("relu"), L("linear", "out")})}) {
    auto model = Build(config);
    ASSERT_NE(model, nullptr);
    const TensorSet before = model->GetState().value();
    auto report = Train(*model, 1, 4, 2);
    ASSERT_TRUE(report.ok()) << report.status().ToString();
    EXPECT_EQ(report->steps, 2u);
    EXPECT_EQ(report->skipped_batches, 0u);
    EXPECT_TRUE(report->skipped_for.empty());
    EXPECT_NE(model->GetState().value()[0].values, before[0].values);
  }
}

}  // namespace
}  // namespace tessera
