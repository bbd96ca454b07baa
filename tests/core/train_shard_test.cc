// Sharded training (a site cohort's members each computing a slice of every batch, with the
// gradients averaged by the hook) follows the same trajectory as one trainer on whole batches.
#include <gtest/gtest.h>

#include <barrier>
#include <cmath>
#include <limits>
#include <random>
#include <thread>

#include "core/data/idx.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"

namespace tessera {
namespace {

// Averages the gradients of `shards` trainers running on threads (an in-memory allreduce).
class ThreadAverage {
 public:
  explicit ThreadAverage(int shards) : shards_(shards), sum_barrier_(shards), read_barrier_(shards) {}

  class Hook : public GradientHook {
   public:
    explicit Hook(ThreadAverage* owner) : owner_(owner) {}
    Status OnGradients(Device& device, DeviceBuffer& gradients, int64_t count, int64_t) override {
      std::vector<float> local(static_cast<size_t>(count));
      RETURN_IF_ERROR(device.CopyDeviceToHost(gradients, 0, local.data(), local.size() * sizeof(float)));
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        if (owner_->sum_.size() != local.size()) owner_->sum_.assign(local.size(), 0.0);
        for (size_t i = 0; i < local.size(); ++i) owner_->sum_[i] += local[i];
      }
      owner_->sum_barrier_.arrive_and_wait();
      for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<float>(owner_->sum_[i] / owner_->shards_);
      owner_->read_barrier_.arrive_and_wait();
      {
        std::lock_guard<std::mutex> lock(owner_->mu_);
        if (++owner_->readers_ == owner_->shards_) {
          owner_->readers_ = 0;
          std::fill(owner_->sum_.begin(), owner_->sum_.end(), 0.0);
        }
      }
      owner_->sum_barrier_.arrive_and_wait();  // the sum is cleared before anyone adds again
      return device.CopyHostToDevice(local.data(), gradients, 0, local.size() * sizeof(float));
    }

   private:
    ThreadAverage* owner_;
  };

 private:
  int shards_;
  std::mutex mu_;
  std::vector<double> sum_;
  int readers_ = 0;
  std::barrier<> sum_barrier_;
  std::barrier<> read_barrier_;
};

// Trains `config` on `indices` of `data` once on whole batches and once as two shards on
// threads with their gradients averaged; `worst[r]` is the largest difference of any parameter
// between the whole-batch model and shard r's (infinite when a training failed).
void TrainWholeAndSharded(const ModelConfig& config, const Dataset& data, const std::vector<int64_t>& indices,
                          const TrainOptions& options, double worst[2]) {
  worst[0] = worst[1] = std::numeric_limits<double>::infinity();
  auto device = CreateCpuDevice();
  auto whole = std::move(CreateModel(config, device.get())).value();
  ASSERT_TRUE(TrainLocal(*whole, data, indices, options).ok());
  ThreadAverage average(2);
  std::vector<std::unique_ptr<Device>> devices;
  std::vector<std::unique_ptr<Model>> models;
  std::vector<ThreadAverage::Hook> hooks(2, ThreadAverage::Hook(&average));
  for (int r = 0; r < 2; ++r) {
    devices.push_back(CreateCpuDevice());
    models.push_back(std::move(CreateModel(config, devices.back().get())).value());
  }
  std::vector<Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      TrainOptions shard = options;
      shard.shard_index = static_cast<uint32_t>(r);
      shard.shard_count = 2;
      shard.gradient_hook = &hooks[static_cast<size_t>(r)];
      results[static_cast<size_t>(r)] = TrainLocal(*models[static_cast<size_t>(r)], data, indices, shard).status();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(results[0].ok()) << results[0].ToString();
  ASSERT_TRUE(results[1].ok()) << results[1].ToString();
  const TensorSet expected = whole->GetState().value();
  for (int r = 0; r < 2; ++r) {
    const TensorSet got = models[static_cast<size_t>(r)]->GetState().value();
    worst[r] = 0;
    for (size_t t = 0; t < expected.size(); ++t) {
      for (size_t j = 0; j < expected[t].values.size(); ++j) {
        worst[r] = std::max(worst[r], static_cast<double>(std::fabs(expected[t].values[j] - got[t].values[j])));
      }
    }
  }
}

TEST(ShardedTrainingTest, TwoShardsFollowTheWholeBatchTrajectory) {
  auto data = LoadFashionMnist("", true);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  // 1000 samples in batches of 64: the last batch (40) splits evenly, and an odd batch size
  // below exercises the uneven split.
  for (uint32_t batch : {64u, 37u}) {
    std::vector<int64_t> indices(1000);
    for (int64_t i = 0; i < 1000; ++i) indices[static_cast<size_t>(i)] = i;
    TrainOptions options;
    options.epochs = 2;
    options.batch_size = batch;
    options.learning_rate = 0.02f;
    options.weight_decay = 1e-5f;
    options.seed = 9;
    ModelConfig config;
    config.seed = 4;

    double worst[2];
    TrainWholeAndSharded(config, *data, indices, options, worst);
    for (int r = 0; r < 2; ++r) {
      // Float sums in a different order drift apart a little over 30 steps; an uneven split
      // (batch 37) adds a rescaling rounding.
      EXPECT_LT(worst[r], batch == 64 ? 1e-3 : 5e-3) << "batch " << batch << ", shard " << r;
    }
  }
}

// With dropout each member drew its slice's masks from the start of the step's draws: every
// member dropped the units the batch's first samples lose, for other samples, and a member
// with an empty slice fell a step behind. Each sample now loses what it loses in the whole
// batch, so the cohort follows the whole-batch trajectory with dropout too.
TEST(ShardedTrainingTest, DropoutDropsWhatTheWholeBatchDrops) {
  Dataset data;
  data.source = "synthetic";
  data.count = 49;  // in batches of 16, the last batch has one sample: one member's slice is empty
  data.rows = data.cols = 4;
  data.num_classes = 3;
  std::mt19937 engine(3);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < data.count * 16; ++i) data.images.push_back(normal(engine));
  for (int64_t i = 0; i < data.count; ++i) data.labels.push_back(static_cast<uint8_t>(i % 3));
  ModelConfig config;
  config.name = "declared";
  config.rows = config.cols = 4;
  config.classes = 3;
  config.seed = 8;
  LayerConfig flatten, hidden, relu, dropout, out;
  flatten.type = "flatten";
  hidden.type = "linear";
  hidden.out = 32;
  hidden.name = "hidden";
  relu.type = "relu";
  dropout.type = "dropout";
  dropout.probability = 0.5f;
  out.type = "linear";
  out.name = "out";
  LayerConfig block;  // dropout inside a residual block, too
  block.type = "residual";
  block.name = "block";
  block.body = {dropout};
  config.layers = {flatten, hidden, relu, dropout, block, out};
  std::vector<int64_t> indices(static_cast<size_t>(data.count));
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<int64_t>(i);
  TrainOptions options;
  options.epochs = 3;
  options.batch_size = 16;
  options.learning_rate = 0.1f;
  options.seed = 2;

  double worst[2];
  TrainWholeAndSharded(config, data, indices, options, worst);
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(worst[r], 1e-4) << "shard " << r;
  }
}

TEST(ShardedTrainingTest, RefusesShardsWithoutAHookOrOutOfRange) {
  auto device = CreateCpuDevice();
  ModelConfig config;
  auto model = std::move(CreateModel(config, device.get())).value();
  Dataset empty;
  empty.rows = empty.cols = 28;
  TrainOptions options;
  options.shard_count = 2;
  EXPECT_EQ(TrainLocal(*model, empty, {}, options).status().code(), StatusCode::kInvalidArgument);
  options.shard_index = 2;
  EXPECT_EQ(TrainLocal(*model, empty, {}, options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
