#include "cli/job_spec.h"
#include "proto/job_mapping.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include "core/model/model.h"

#include <filesystem>
#include <limits>
#include <string>

#include "tests/cli/job_spec_expectations.h"

namespace tessera {
namespace {

using testing::ExpectError;
using testing::ExpectRefused;
using testing::kMinimal;
using testing::WireSpec;

std::string ExamplePath(const std::string& name) {
  return (std::filesystem::path(TESSERA_SOURCE_DIR) / "examples" / name).string();
}

TEST(JobSpecTest, MinimalSpecGetsDefaults) {
  Result<v1::JobSpec> spec = ParseJobSpecString(kMinimal, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->name(), "t");
  EXPECT_EQ(spec->strategy(), "fedavg");
  EXPECT_EQ(spec->rounds(), 5u);
  EXPECT_EQ(spec->clients_per_round(), 4u);
  EXPECT_EQ(spec->min_clients(), 4u);
  EXPECT_EQ(spec->round_deadline_ms(), 300000u);
  EXPECT_EQ(spec->seed(), 0u);
  EXPECT_EQ(spec->max_round_attempts(), 3u);
  EXPECT_EQ(spec->device(), "cpu");
  EXPECT_EQ(spec->fallback_device(), "cpu");
  EXPECT_EQ(spec->model().name(), "simplecnn");
  EXPECT_EQ(spec->data().dataset(), "fashion-mnist");
  EXPECT_EQ(spec->data().path(), "");
  EXPECT_EQ(spec->data().max_train_samples(), 0u);
  EXPECT_EQ(spec->data().partition().kind(), v1::PARTITION_IID);
  EXPECT_EQ(spec->data().partition().parties(), 4u);
  EXPECT_DOUBLE_EQ(spec->data().partition().beta(), 0.5);
  EXPECT_EQ(spec->data().partition().labels_per_party(), 2u);
  EXPECT_EQ(spec->local_epochs(), 1u);
  EXPECT_EQ(spec->batch_size(), 64u);
  EXPECT_EQ(spec->optimizer().name(), "sgd");
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.01);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 0.0);
}

TEST(JobSpecTest, ReadsEveryKey) {
  Result<v1::JobSpec> spec = ParseJobSpecString(R"(
name = "full"
strategy = "fedavg"
rounds = 7
clients_per_round = 6
min_clients = 5
round_deadline_s = 12.5
seed = 99
max_round_attempts = 2
device = "cuda"
fallback_device = "cpu"

[model]
name = "MLP"
hidden = [128, 64]

[data]
dataset = "fashion-mnist"
path = "/tmp/fm"
max_train_samples = 5000
max_test_samples = 900

[data.partition]
kind = "label-quantity"
parties = 8
labels_per_party = 3
seed = 4

[train]
optimizer = "sgd"
local_epochs = 3
batch_size = 32
learning_rate = 0.1
momentum = 0.5
weight_decay = 1e-4
)",
                                                "full.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->clients_per_round(), 6u);
  EXPECT_EQ(spec->min_clients(), 5u);
  EXPECT_EQ(spec->round_deadline_ms(), 12500u);
  EXPECT_EQ(spec->seed(), 99u);
  EXPECT_EQ(spec->max_round_attempts(), 2u);
  EXPECT_EQ(spec->device(), "cuda");
  EXPECT_EQ(spec->model().name(), "mlp");
  ASSERT_EQ(spec->model().hidden_size(), 2);
  EXPECT_EQ(spec->model().hidden(1), 64u);
  EXPECT_EQ(spec->data().path(), "/tmp/fm");
  EXPECT_EQ(spec->data().max_train_samples(), 5000u);
  EXPECT_EQ(spec->data().max_test_samples(), 900u);
  EXPECT_EQ(spec->data().partition().kind(), v1::PARTITION_LABEL_QUANTITY);
  EXPECT_EQ(spec->data().partition().parties(), 8u);
  EXPECT_DOUBLE_EQ(spec->data().partition().beta(), 0.5);  // the default: beta is not label-quantity's
  EXPECT_EQ(spec->data().partition().labels_per_party(), 3u);
  EXPECT_EQ(spec->data().partition().seed(), 4u);
  EXPECT_EQ(spec->local_epochs(), 3u);
  EXPECT_EQ(spec->batch_size(), 32u);
  EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.1);
  EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.5);
  EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 1e-4);

  // The partition seed defaults to the job's seed.
  Result<v1::JobSpec> seeded = ParseJobSpecString(std::string("seed = 17\n") + kMinimal, "job.toml");
  ASSERT_TRUE(seeded.ok()) << seeded.status().ToString();
  EXPECT_EQ(seeded->data().partition().seed(), 17u);
}

TEST(JobSpecTest, EveryExampleParses) {
  for (const char* name : {"fmnist-fedavg.toml", "fmnist-fedavgm.toml", "fmnist-fedbuff.toml", "fmnist-robust.toml",
                           "niid-bench-iid.toml", "niid-bench-dirichlet.toml", "smoke.toml", "declared-cnn.toml",
                           "resnet8-cifar10.toml"}) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath(name));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->name() + ".toml", name);
  }
  // The NIID-Bench table's #C=2 jobs pin the reference run's label sets, all ten of them.
  for (const char* algorithm : {"fedavg", "fedprox", "scaffold", "fednova"}) {
    SCOPED_TRACE(algorithm);
    Result<v1::JobSpec> spec =
        ParseJobSpecFile(ExamplePath((std::string("niid-bench/label-quantity-") + algorithm + ".toml")));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok()) << wire::ValidateJobSpec(*spec).ToString();
    ASSERT_EQ(spec->data().partition().party_labels_size(), 10);
    EXPECT_EQ(spec->data().partition().party_labels(9).labels(1), 7u);
  }
}

TEST(JobSpecTest, ExamplesSayWhatTheDocumentationSays) {
  Result<v1::JobSpec> demo = ParseJobSpecFile(ExamplePath("fmnist-fedavg.toml"));
  ASSERT_TRUE(demo.ok()) << demo.status().ToString();
  EXPECT_EQ(demo->model().name(), "simplecnn");
  EXPECT_EQ(demo->data().partition().kind(), v1::PARTITION_IID);
  EXPECT_EQ(demo->data().partition().parties(), 10u);
  EXPECT_EQ(demo->clients_per_round(), 10u);
  EXPECT_EQ(demo->min_clients(), 8u);
  EXPECT_EQ(demo->round_deadline_ms(), 120000u);

  Result<v1::JobSpec> iid = ParseJobSpecFile(ExamplePath("niid-bench-iid.toml"));
  Result<v1::JobSpec> dirichlet = ParseJobSpecFile(ExamplePath("niid-bench-dirichlet.toml"));
  ASSERT_TRUE(iid.ok() && dirichlet.ok());
  for (const v1::JobSpec* spec : {&*iid, &*dirichlet}) {
    EXPECT_EQ(spec->rounds(), 50u);
    EXPECT_EQ(spec->clients_per_round(), 10u);
    EXPECT_EQ(spec->min_clients(), 10u);
    EXPECT_EQ(spec->local_epochs(), 10u);
    EXPECT_EQ(spec->batch_size(), 64u);
    EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.01);
    EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
    EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 1e-5);
  }
  EXPECT_EQ(dirichlet->data().partition().kind(), v1::PARTITION_DIRICHLET);
  EXPECT_DOUBLE_EQ(dirichlet->data().partition().beta(), 0.5);

  Result<v1::JobSpec> robust = ParseJobSpecFile(ExamplePath("fmnist-robust.toml"));
  ASSERT_TRUE(robust.ok()) << robust.status().ToString();
  EXPECT_EQ(robust->strategy(), "fedadam");
  EXPECT_EQ(robust->aggregation().rule(), "trimmed-mean");
  EXPECT_DOUBLE_EQ(robust->aggregation().trim_fraction(), 0.2);
  EXPECT_EQ(robust->update_norm_policy(), "clip");

  Result<v1::JobSpec> smoke = ParseJobSpecFile(ExamplePath("smoke.toml"));
  ASSERT_TRUE(smoke.ok());
  EXPECT_EQ(smoke->model().name(), "mlp");
  EXPECT_EQ(smoke->rounds(), 3u);
  EXPECT_EQ(smoke->data().partition().parties(), 3u);
  EXPECT_EQ(smoke->data().max_train_samples(), 2000u);
  EXPECT_EQ(smoke->data().max_test_samples(), 1000u);
}

TEST(JobSpecTest, TomlRoundTrips) {
  for (const char* name : {"fmnist-fedavg.toml", "fmnist-fedavgm.toml", "fmnist-robust.toml",
                           "niid-bench-dirichlet.toml", "smoke.toml", "declared-cnn.toml"}) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath(name));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const std::string text = JobSpecToToml(*spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
}

TEST(JobSpecTest, DeclaredLayersAreReadWithTheirPlaces) {
  Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath("declared-cnn.toml"));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->model().name(), "declared");
  ASSERT_EQ(spec->model().layers_size(), 13);
  const v1::LayerSpec& stem = spec->model().layers(0);
  EXPECT_EQ(stem.type(), "conv2d");
  EXPECT_EQ(stem.name(), "stem");
  EXPECT_EQ(stem.out(), 16u);
  EXPECT_EQ(stem.padding(), 1u);
  ASSERT_TRUE(stem.has_bias());
  EXPECT_FALSE(stem.bias());
  const v1::LayerSpec& block = spec->model().layers(4);
  EXPECT_EQ(block.type(), "residual");
  ASSERT_EQ(block.body_size(), 5);
  EXPECT_EQ(block.body(2).type(), "gelu");
  EXPECT_DOUBLE_EQ(spec->model().layers(8).probability(), 0.25);
  EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok()) << wire::ValidateJobSpec(*spec).ToString();
  auto counted = CountParameters(wire::ToModelConfig(*spec));
  ASSERT_TRUE(counted.ok()) << counted.status().ToString();
  // stem 144, its norm 32 (+32), the block 2 x (2,304 + 32 (+32)), fc1 784 x 128 + 128, ln 256,
  // fc2 1,290.
  EXPECT_EQ(*counted, 144 + 64 + 2 * (2304 + 64) + 784 * 128 + 128 + 256 + 1290);

  const std::string layers = "name = \"t\"\nrounds = 5\n\n[data.partition]\nparties = 4\n\n[[model.layers]]\n";
  ExpectError(std::string(kMinimal) + "[[model.layers]]\ntype = \"relu\"\n",
              {"'model.layers'", "leave model.name out", "\"simplecnn\""});
  ExpectError(layers + "type = \"conv3d\"\n", {"job.toml:", "'model.layers[0].type'", "\"conv2d\""});
  ExpectError(layers + "type = \"conv2d\"\nkernal = 3\n", {"unknown key 'model.layers[0].kernal'", "kernel"});
  ExpectError(layers + "name = \"x\"\n", {"'model.layers[0].type'", "is required"});
  ExpectError(layers + "type = \"relu\"\nbody = [{ type = \"relu\" }]\n",
              {"'model.layers[0].body'", "applies to type \"residual\" only"});
  ExpectError(layers + "type = \"residual\"\nbody = [{ type = \"residual\", body = [{ type = \"relu\" }] }]\n",
              {"'model.layers[0].body[0].body'", "cannot hold another residual block"});
  ExpectError(layers + "type = \"dropout\"\nprobability = 1.5\n", {"'model.layers[0].probability'", "[0, 1)"});
  ExpectError(layers + "type = \"conv2d\"\nout = 0\n", {"'model.layers[0].out'"});
  ExpectError(layers + "type = \"residual\"\n", {"'model.layers[0].body'", "is required"});
  // The model's own checks name the layer: the shapes are known once the data's are.
  ExpectError(layers + "type = \"conv2d\"\nout = 4\nkernel = 40\n", {"model.layers[0] (conv2d): kernel 40"});
}

TEST(JobSpecTest, MissingFileIsNotFound) {
  Result<v1::JobSpec> spec = ParseJobSpecFile("/nonexistent/job.toml");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  EXPECT_NE(spec.status().message().find("/nonexistent/job.toml"), std::string::npos);
}

TEST(JobSpecTest, SyntaxErrorHasLineAndColumn) {
  ExpectError("name = \"t\"\nrounds = = 3\n", {"job.toml:2:"});
  ExpectError("name = \"t\n", {"job.toml:1:"});
}

TEST(JobSpecTest, UnknownKeysAreNamedWithTheAllowedOnes) {
  ExpectError(std::string(kMinimal) + "colour = \"red\"\n",
              {"job.toml:9:", "unknown key 'data.partition.colour'", "kind, parties, beta, labels_per_party, seed"});
  ExpectError(std::string("epochs = 3\n") + kMinimal, {"job.toml:1:1", "unknown key 'epochs'", "the top level", "rounds"});
  ExpectError(std::string(kMinimal) + "[train]\nlr = 0.1\n",
              {"job.toml:10:1", "unknown key 'train.lr'", "learning_rate", "[train]"});
  ExpectError(std::string(kMinimal) + "[optimizer]\nname = \"sgd\"\n", {"job.toml:9:", "unknown key 'optimizer'"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\nwidth = 3\n[data.partition]\nparties = 2\n",
              {"job.toml:5:1", "unknown key 'model.width'", "name, hidden"});
}

TEST(JobSpecTest, WrongTypesNameKeyExpectedAndFound) {
  ExpectError("name = \"t\"\nrounds = \"5\"\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:2:", "'rounds'", "expected an integer, found a string"});
  ExpectError("name = \"t\"\nrounds = 5.0\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:2:", "'rounds'", "expected an integer, found a float"});
  ExpectError(std::string(kMinimal) + "[train]\nlearning_rate = \"fast\"\n",
              {"job.toml:10:", "'train.learning_rate'", "expected a float, found a string"});
  ExpectError(std::string(kMinimal) + "kind = \"dirichlet\"\nbeta = true\n",
              {"job.toml:10:", "'data.partition.beta'", "expected a float, found a boolean"});
  ExpectError("name = 3\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:1:", "'name'", "expected a string, found an integer"});
  ExpectError("name = \"t\"\nrounds = 5\nmodel = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:3:", "'model'", "expected a table, found a string"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\nhidden = [64, \"x\"]\n[data.partition]\nparties = 2\n",
              {"job.toml:5:", "'model.hidden[1]'", "expected an integer, found a string"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\nhidden = 64\n[data.partition]\nparties = 2\n",
              {"job.toml:5:", "'model.hidden'", "expected an array of integers, found an integer"});
}

// The reader refuses what the coordinator's ValidateJobSpec would refuse later.
TEST(JobSpecTest, DevicesMustBeADeviceClass) {
  ExpectError(std::string("device = \"gpu\"\n") + kMinimal,
              {"job.toml:1:", "'device'", "expected a device class", "found \"gpu\""});
  ExpectError(std::string("fallback_device = \"cuda:0\"\n") + kMinimal, {"job.toml:1:", "'fallback_device'", "cuda:0"});
  // A fallback names a profile built into the workers, never a profile file on their disks.
  for (const char* file : {"emu:/etc/passwd", "emu:edge.toml", "emu:"}) {
    ExpectError(std::string("fallback_device = \"") + file + "\"\n" + kMinimal,
                {"job.toml:1:", "fallback_device", "a built-in profile's name"});
  }
  ASSERT_TRUE(ParseJobSpecString(std::string("fallback_device = \"emu:edge-npu\"\n") + kMinimal, "job.toml").ok());
  // A device of "emu:" alone names no profile.
  ExpectError(std::string("device = \"emu:\"\n") + kMinimal,
              {"job.toml:1:", "'device'", "expected emu: and a profile's name (emu:PROFILE", "found \"emu:\""});
  for (const char* device : {"cpu", "cuda", "xrt", "emu:t4"}) {
    Result<v1::JobSpec> spec = ParseJobSpecString(std::string("device = \"") + device + "\"\n" + kMinimal, "job.toml");
    ASSERT_TRUE(spec.ok()) << device << ": " << spec.status().ToString();
    EXPECT_EQ(spec->device(), device);
  }
}

TEST(JobSpecTest, NamesAndPathsAreBoundedPlainText) {
  const std::string rest = "rounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n";
  ExpectError("name = \"" + std::string(129, 'n') + "\"\n" + rest, {"job.toml:1:", "'name'", "at most 128 bytes", "found 129 bytes"});
  ExpectError("name = \"a\\u0007b\"\n" + rest, {"job.toml:1:", "'name'", "a control or hidden character"});
  // C1 controls and the characters that reorder or hide text are refused as well.
  ExpectError("name = \"a\\u0085b\"\n" + rest, {"job.toml:1:", "'name'", "a control or hidden character"});
  ExpectError("name = \"evil\\u202etxt.exe\"\n" + rest, {"job.toml:1:", "'name'", "a control or hidden character"});
  EXPECT_TRUE(ParseJobSpecString("name = \"f\\u00e9d\u00e9r\u00e9\"\n" + rest, "job.toml").ok());  // accents are text
  EXPECT_TRUE(ParseJobSpecString("name = \"" + std::string(128, 'n') + "\"\n" + rest, "job.toml").ok());
  ExpectError(std::string(kMinimal) + "[data]\npath = \"/srv/\\tdata\"\n", {"job.toml:10:", "'data.path'", "control character"});
  ExpectError(std::string(kMinimal) + "[data]\npath = \"" + std::string(4097, 'p') + "\"\n", {"'data.path'", "4097 bytes"});
}

TEST(JobSpecTest, OutOfRangeValuesNameTheKey) {
  auto with_train = [](const std::string& line) { return std::string(kMinimal) + "[train]\n" + line + "\n"; };
  ExpectError("name = \"t\"\nrounds = 0\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:2:", "'rounds'", "at least 1, got 0"});
  ExpectError("name = \"t\"\nrounds = -2\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:2:", "'rounds'", "got -2"});
  ExpectError(with_train("batch_size = 0"), {"job.toml:10:", "'train.batch_size'", "got 0"});
  ExpectError(with_train("learning_rate = 0"), {"job.toml:10:", "'train.learning_rate'", "> 0"});
  ExpectError(with_train("learning_rate = -0.1"), {"job.toml:10:", "'train.learning_rate'"});
  ExpectError(with_train("learning_rate = nan"), {"job.toml:10:", "'train.learning_rate'", "finite"});
  ExpectError(with_train("momentum = 1.0"), {"job.toml:10:", "'train.momentum'", "[0, 1)"});
  ExpectError(with_train("momentum = -0.5"), {"job.toml:10:", "'train.momentum'"});
  ExpectError(with_train("weight_decay = -1e-5"), {"job.toml:10:", "'train.weight_decay'"});
  ExpectError(with_train("local_epochs = 0"), {"job.toml:10:", "'train.local_epochs'"});
  ExpectError(std::string("min_clients = 5\n") + kMinimal,
              {"job.toml:1:", "'min_clients'", "at most clients_per_round (4), got 5"});
  ExpectError(std::string("clients_per_round = 3\nmin_clients = 4\n") + kMinimal,
              {"job.toml:2:", "'min_clients'", "at most clients_per_round (3)"});
  ExpectError(std::string("clients_per_round = 5\n") + kMinimal,
              {"job.toml:1:", "'clients_per_round'", "data.partition.parties (4)"});
  ExpectError(std::string("round_deadline_s = 0\n") + kMinimal, {"job.toml:1:", "'round_deadline_s'"});
  ExpectError(std::string("round_deadline_s = -3.0\n") + kMinimal, {"job.toml:1:", "'round_deadline_s'"});
  ExpectError(std::string("seed = -1\n") + kMinimal, {"job.toml:1:", "'seed'"});
  ExpectError(std::string("max_round_attempts = 0\n") + kMinimal, {"job.toml:1:", "'max_round_attempts'"});
  ExpectError(std::string(kMinimal) + "kind = \"dirichlet\"\nbeta = 0\n",
              {"job.toml:10:", "'data.partition.beta'", "at least 0.001"});
  ExpectError(std::string(kMinimal) + "kind = \"label-quantity\"\nlabels_per_party = 11\n",
              {"job.toml:10:", "'data.partition.labels_per_party'", "at most 10"});
  // A kind's own key on another kind is refused, not ignored.
  ExpectError(std::string(kMinimal) + "beta = 0.3\n",
              {"job.toml:9:", "'data.partition.beta'", "applies to kinds \"dirichlet\" and \"quantity\" only", "\"iid\""});
  ExpectError(std::string(kMinimal) + "kind = \"dirichlet\"\nlabels_per_party = 3\n",
              {"job.toml:10:", "'data.partition.labels_per_party'", "\"label-quantity\" only", "\"dirichlet\""});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 0\n",
              {"job.toml:6:", "'data.partition.parties'"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data]\nmax_train_samples = 3\n"
              "[data.partition]\nparties = 4\n",
              {"job.toml:6:", "'data.max_train_samples'", "among 4 parties"});
}

// 0.99999998 is below 1 as a double but 1 as the float the trainer uses, where FedNova's
// normaliser is 0 / 0: refused in job.toml and over the wire, with every digit shown.
TEST(JobSpecTest, AMomentumThatRoundsToOneAsAFloatIsRefused) {
  ExpectError(std::string(kMinimal) + "[train]\nmomentum = 0.99999998\n",
              {"job.toml:10:", "'train.momentum'", "below 1 as a float", "0.99999998"});
  EXPECT_TRUE(ParseJobSpecString(std::string(kMinimal) + "[train]\nmomentum = 0.99999994\n", "job.toml").ok());
  v1::JobSpec spec = WireSpec();
  spec.mutable_optimizer()->set_momentum(0.99999998);
  ExpectRefused(spec, "optimizer.momentum", "below 1 as a float");
  EXPECT_NE(wire::ValidateJobSpec(spec).message().find("got 0.99999998"), std::string::npos)
      << wire::ValidateJobSpec(spec).message();
  spec.mutable_optimizer()->set_momentum(0.99999994);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
}

// Below 0.001 a Dirichlet draw skews no further, and far below it the draw overflows: refused
// in job.toml and over the wire (where 0 still means the default).
TEST(JobSpecTest, ABetaBelowTheFloorIsRefused) {
  for (const auto& [beta, shown] : {std::pair{"1e-320", "1e-320"}, std::pair{"0.0005", "5e-04"}}) {
    SCOPED_TRACE(beta);
    ExpectError(std::string(kMinimal) + "kind = \"dirichlet\"\nbeta = " + beta + "\n",
                {"job.toml:10:", "'data.partition.beta'", "at least 0.001", std::string("got ") + shown});
  }
  EXPECT_TRUE(ParseJobSpecString(std::string(kMinimal) + "kind = \"dirichlet\"\nbeta = 0.001\n", "job.toml").ok());
  v1::JobSpec spec = WireSpec();
  spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_DIRICHLET);
  spec.mutable_data()->mutable_partition()->set_beta(1e-320);
  ExpectRefused(spec, "data.partition.beta", "from 0.001");
  spec.mutable_data()->mutable_partition()->set_beta(0);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
  spec.mutable_data()->mutable_partition()->set_beta(0.001);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
}

TEST(JobSpecTest, UnknownNamesListTheKnownOnes) {
  ExpectError(std::string("strategy = \"fedsgd\"\n") + kMinimal, {"job.toml:1:", "'strategy'", "\"fedavg\"", "\"scaffold\""});
  ExpectError(std::string(kMinimal) + "kind = \"pathological\"\n",
              {"job.toml:9:", "'data.partition.kind'", "\"dirichlet\"", "\"label-quantity\""});
  ExpectError(std::string(kMinimal) + "[train]\noptimizer = \"adam\"\n", {"job.toml:10:", "'train.optimizer'", "\"sgd\""});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"resnet\"\n[data.partition]\nparties = 2\n",
              {"job.toml:4:", "'model.name'", "\"simplecnn\", \"mlp\""});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"simplecnn\"\nhidden = [3]\n[data.partition]\nparties = 2\n",
              {"job.toml:5:", "'model.hidden'", "\"mlp\" only"});
  // Another dataset is a name the coordinator resolves; it needs its format.
  ExpectError(std::string(kMinimal) + "[data]\ndataset = \"cifar10\"\n", {"'data.format'", "is required", "\"cifar10\""});
}

TEST(JobSpecTest, ServerOptionsBelongToFedAvgM) {
  Result<v1::JobSpec> fedavgm = ParseJobSpecString(std::string("strategy = \"FedAvgM\"\n") + kMinimal, "job.toml");
  ASSERT_TRUE(fedavgm.ok()) << fedavgm.status().ToString();
  EXPECT_EQ(fedavgm->strategy(), "fedavgm");
  EXPECT_DOUBLE_EQ(fedavgm->server().learning_rate(), 1.0);  // the defaults
  EXPECT_DOUBLE_EQ(fedavgm->server().momentum(), 0.9);
  EXPECT_TRUE(wire::ValidateJobSpec(*fedavgm).ok());

  Result<v1::JobSpec> example = ParseJobSpecFile(ExamplePath("fmnist-fedavgm.toml"));
  ASSERT_TRUE(example.ok()) << example.status().ToString();
  EXPECT_DOUBLE_EQ(example->server().momentum(), 0.5);

  ExpectError(std::string(kMinimal) + "[server]\nmomentum = 0.9\n",
              {"'server'", "applies to strategies \"fedavgm\", \"fedadam\"", "strategy is \"fedavg\""});
  ExpectError(std::string("strategy = \"fedavgm\"\n") + kMinimal + "[server]\nmomentum = 1.0\n",
              {"'server.momentum'", "[0, 1)"});
  ExpectError(std::string("strategy = \"fedavgm\"\n") + kMinimal + "[server]\nlearning_rate = 0\n",
              {"'server.learning_rate'"});
  ExpectError(std::string("strategy = \"fedavgm\"\n") + kMinimal + "[server]\nnesterov = true\n",
              {"'server.nesterov'", "learning_rate, momentum"});

  // A spec sent over the wire is checked the same way.
  v1::JobSpec wire_spec = *fedavgm;
  wire_spec.mutable_server()->set_momentum(1.5);
  Status refused = wire::ValidateJobSpec(wire_spec);
  EXPECT_NE(refused.message().find("server.momentum"), std::string::npos) << refused.message();
  wire_spec = *fedavgm;
  wire_spec.set_strategy("fedavg");
  refused = wire::ValidateJobSpec(wire_spec);
  EXPECT_NE(refused.message().find("apply to fedavgm"), std::string::npos) << refused.message();
}

TEST(JobSpecTest, AWorkersModelIsSeededByTheRoundAndTheParty) {
  Result<v1::JobSpec> spec = ParseJobSpecString(kMinimal, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const uint64_t seed = wire::ToTrainingModelConfig(*spec, 3, 1).seed;
  EXPECT_EQ(seed, wire::ToTrainOptions(*spec, 3, 1).seed) << "the model's seed is the round's shuffle seed";
  EXPECT_EQ(wire::ToTrainingModelConfig(*spec, 3, 1).seed, seed) << "a rerun draws the same";
  EXPECT_NE(wire::ToTrainingModelConfig(*spec, 4, 1).seed, seed) << "another round";
  EXPECT_NE(wire::ToTrainingModelConfig(*spec, 3, 2).seed, seed) << "another party";
  // Everything else is the job's model.
  ModelConfig config = wire::ToTrainingModelConfig(*spec, 3, 1);
  config.seed = wire::ToModelConfig(*spec).seed;
  EXPECT_EQ(config.name, wire::ToModelConfig(*spec).name);
  EXPECT_EQ(config.hidden, wire::ToModelConfig(*spec).hidden);
}

TEST(JobSpecTest, ClientAlgorithmsAndTheirKeys) {
  Result<v1::JobSpec> fedprox = ParseJobSpecString(std::string("strategy = \"FedProx\"\n") + kMinimal, "job.toml");
  ASSERT_TRUE(fedprox.ok()) << fedprox.status().ToString();
  EXPECT_EQ(fedprox->strategy(), "fedprox");
  EXPECT_DOUBLE_EQ(fedprox->proximal_mu(), 0.01);  // the default
  Result<v1::JobSpec> tuned =
      ParseJobSpecString(std::string("strategy = \"fedprox\"\nproximal_mu = 0.1\n") + kMinimal, "job.toml");
  ASSERT_TRUE(tuned.ok()) << tuned.status().ToString();
  EXPECT_DOUBLE_EQ(tuned->proximal_mu(), 0.1);
  EXPECT_FLOAT_EQ(wire::ToTrainOptions(*tuned, 1, 0).proximal_mu, 0.1f);
  for (const char* strategy : {"fednova", "scaffold"}) {
    Result<v1::JobSpec> spec =
        ParseJobSpecString("strategy = \"" + std::string(strategy) + "\"\n" + kMinimal, "job.toml");
    ASSERT_TRUE(spec.ok()) << strategy << ": " << spec.status().ToString();
    EXPECT_EQ(spec->proximal_mu(), 0.0);
    EXPECT_EQ(wire::ToTrainOptions(*spec, 1, 0).proximal_mu, 0.0f);
  }

  ExpectError(std::string("strategy = \"fedprox\"\nproximal_mu = 0\n") + kMinimal,
              {"job.toml:2:", "'proximal_mu'", "must be > 0 and at most 1000, got 0"});
  ExpectError(std::string("proximal_mu = 0.01\n") + kMinimal, {"job.toml:1:", "'proximal_mu'", "\"fedprox\" only"});
  ExpectError(std::string("strategy = \"scaffold\"\n") + kMinimal + "kind = \"local-files\"\n",
              {"'data.partition.kind'", "\"scaffold\" needs a shared partition"});
  ExpectError(std::string("strategy = \"fedsgd\"\n") + kMinimal, {"'strategy'", "\"fednova\", \"scaffold\""});

  // Over the wire the coordinator checks the same.
  v1::JobSpec wire_spec = *fedprox;
  wire_spec.set_proximal_mu(0);
  EXPECT_NE(wire::ValidateJobSpec(wire_spec).message().find("spec.proximal_mu: expected a number in (0, 1000] for "
                                                            "strategy \"fedprox\", got 0"),
            std::string::npos)
      << wire::ValidateJobSpec(wire_spec).message();
  wire_spec = *fedprox;
  wire_spec.set_strategy("fednova");
  EXPECT_NE(wire::ValidateJobSpec(wire_spec).message().find("spec.proximal_mu: expected 0 for strategy \"fednova\""),
            std::string::npos)
      << wire::ValidateJobSpec(wire_spec).message();
  wire_spec.set_strategy("scaffold");
  wire_spec.set_proximal_mu(0);
  wire_spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_LOCAL_FILES);
  EXPECT_NE(wire::ValidateJobSpec(wire_spec).message().find("spec.data.partition.kind: expected a shared partition for "
                                                            "strategy \"scaffold\""),
            std::string::npos)
      << wire::ValidateJobSpec(wire_spec).message();

  // SCAFFOLD's variates count against the model's memory: a party's worth each.
  v1::JobSpec big = *fedprox;
  big.set_strategy("scaffold");
  big.set_proximal_mu(0);
  big.mutable_model()->set_name("mlp");
  big.mutable_model()->add_hidden(4096);
  big.mutable_model()->add_hidden(4096);  // 20 million parameters: fits fedavg's 10 copies
  big.mutable_data()->mutable_partition()->set_parties(100);
  big.set_clients_per_round(100);
  big.set_min_clients(100);
  EXPECT_EQ(wire::CoordinatorModelCopies(big), wire::kCoordinatorModelCopies + 3 + 100 * wire::kScaffoldModelCopiesPerParty);
  Status too_big = wire::ValidateJobSpec(big);
  EXPECT_NE(too_big.message().find("spec.model: expected a model the coordinator can hold"), std::string::npos)
      << too_big.message();
  EXPECT_NE(too_big.message().find("(scaffold: 9 per party)"), std::string::npos) << too_big.message();
  big.set_strategy("fedavg");
  EXPECT_TRUE(wire::ValidateJobSpec(big).ok()) << wire::ValidateJobSpec(big).message();
}

TEST(JobSpecTest, NiidBenchExamplesForEveryAlgorithmAndSkew) {
  int seen = 0;
  std::vector<std::pair<std::string, std::string>> runs;  // skew, strategy
  for (const char* skew : {"dirichlet", "label-quantity"}) {
    for (const char* strategy : {"fedavg", "fedprox", "scaffold", "fednova"}) runs.emplace_back(skew, strategy);
  }
  // The server optimisers' curves, on the Dirichlet split only.
  for (const char* strategy : {"fedadam", "fedyogi", "fedavgm"}) runs.emplace_back("dirichlet", strategy);
  for (const auto& [skew, strategy] : runs) {
    {
      const std::string name = skew + "-" + strategy;
      SCOPED_TRACE(name);
      Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath("niid-bench/" + name + ".toml"));
      ASSERT_TRUE(spec.ok()) << spec.status().ToString();
      ++seen;
      EXPECT_EQ(spec->name(), "niid-bench-" + name);
      EXPECT_EQ(spec->strategy(), strategy);
      EXPECT_EQ(spec->model().name(), "simplecnn");
      EXPECT_EQ(spec->rounds(), 50u);
      EXPECT_EQ(spec->data().partition().parties(), 10u);
      EXPECT_EQ(spec->clients_per_round(), 10u);
      EXPECT_EQ(spec->min_clients(), 10u);
      EXPECT_EQ(spec->local_epochs(), 10u);
      EXPECT_EQ(spec->batch_size(), 64u);
      EXPECT_DOUBLE_EQ(spec->optimizer().learning_rate(), 0.01);
      EXPECT_DOUBLE_EQ(spec->optimizer().momentum(), 0.9);
      EXPECT_DOUBLE_EQ(spec->optimizer().weight_decay(), 1e-5);
      EXPECT_DOUBLE_EQ(spec->proximal_mu(), strategy == "fedprox" ? 0.01 : 0.0);
      EXPECT_DOUBLE_EQ(spec->max_update_norm(), 10000.0);
      if (strategy == "fedavgm") {
        EXPECT_DOUBLE_EQ(spec->server().learning_rate(), 0.1);
        EXPECT_DOUBLE_EQ(spec->server().momentum(), 0.9);
      } else if (strategy == "fedadam" || strategy == "fedyogi") {  // their defaults, filled in
        EXPECT_DOUBLE_EQ(spec->server().learning_rate(), 0.03);
        EXPECT_DOUBLE_EQ(spec->server().tau(), 1e-3);
      }
      if (skew == "dirichlet") {
        EXPECT_EQ(spec->data().partition().kind(), v1::PARTITION_DIRICHLET);
        EXPECT_DOUBLE_EQ(spec->data().partition().beta(), 0.5);
      } else {
        EXPECT_EQ(spec->data().partition().kind(), v1::PARTITION_LABEL_QUANTITY);
        EXPECT_EQ(spec->data().partition().labels_per_party(), 2u);
      }
      // And what `tessera job show` writes reads back the same.
      Result<v1::JobSpec> again = ParseJobSpecString(JobSpecToToml(*spec), "shown.toml");
      ASSERT_TRUE(again.ok()) << again.status().ToString();
      EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << JobSpecToToml(*spec);
    }
  }
  size_t files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ExamplePath("niid-bench"))) {
    files += entry.path().extension() == ".toml";
  }
  EXPECT_EQ(files, static_cast<size_t>(seen)) << "a file in examples/niid-bench/ is not checked here";
}

TEST(JobSpecTest, RequiredKeys) {
  ExpectError("rounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n", {"job.toml", "'name'", "required"});
  ExpectError("name = \"t\"\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n", {"'rounds'", "required"});
  ExpectError("name = \"t\"\nrounds = 5\n[data.partition]\nparties = 2\n", {"'model'", "required"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\n[data.partition]\nparties = 2\n", {"'model.name'", "required"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n", {"'data.partition'", "required"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nkind = \"iid\"\n",
              {"'data.partition.parties'", "required"});
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

using testing::ExpectError;
using testing::ExpectRefused;
using testing::kMinimal;
using testing::WireSpec;

TEST(JobSpecLimitsTest, EveryNumberOfAWireSpecHasAnUpperBound) {
  const uint32_t huge = 4000000000u;
  v1::JobSpec s = WireSpec();
  s.set_rounds(huge);
  ExpectRefused(s, "rounds", "[1, 100000]");
  s = WireSpec();
  s.set_clients_per_round(huge);
  s.set_min_clients(1);
  ExpectRefused(s, "clients_per_round", "[1, 10000]");
  s = WireSpec();
  s.mutable_data()->mutable_partition()->set_parties(huge);
  ExpectRefused(s, "data.partition.parties", "[1, 10000]");
  s = WireSpec();
  s.set_round_deadline_ms(huge);
  ExpectRefused(s, "round_deadline_ms", "604800000");
  s = WireSpec();
  s.set_local_epochs(huge);
  ExpectRefused(s, "local_epochs", "[1, 1000]");
  s = WireSpec();
  s.set_batch_size(huge);
  ExpectRefused(s, "batch_size", "[1, 8192]");
  s = WireSpec();
  s.set_max_round_attempts(huge);
  ExpectRefused(s, "max_round_attempts", "[0, 100]");
  s = WireSpec();
  s.mutable_data()->set_max_train_samples(huge);
  ExpectRefused(s, "data.max_train_samples", "100000000");
  s = WireSpec();
  s.mutable_optimizer()->set_learning_rate(1e300);
  ExpectRefused(s, "optimizer.learning_rate", "(0, 100]");
  s = WireSpec();
  s.mutable_optimizer()->set_weight_decay(1e300);
  ExpectRefused(s, "optimizer.weight_decay", "[0, 1]");
  s = WireSpec();
  s.mutable_optimizer()->set_weight_decay(std::numeric_limits<double>::quiet_NaN());
  ExpectRefused(s, "optimizer.weight_decay", "[0, 1]");
  s = WireSpec();
  s.mutable_data()->mutable_partition()->set_beta(1e300);
  ExpectRefused(s, "data.partition.beta", "(0: the default, 0.5)");
  s = WireSpec();
  s.mutable_data()->mutable_partition()->set_beta(-1);
  ExpectRefused(s, "data.partition.beta", "[0, 10000]");
  s = WireSpec();
  s.mutable_data()->mutable_partition()->set_labels_per_party(huge);
  ExpectRefused(s, "data.partition.labels_per_party", "[0, 10]");
  s = WireSpec();
  s.set_max_update_norm(1e38);
  ExpectRefused(s, "max_update_norm", "[0, 1e+09]");
  s = WireSpec();
  s.set_max_update_norm(std::numeric_limits<double>::infinity());
  ExpectRefused(s, "max_update_norm", "(0: the default");
  s = WireSpec();
  s.set_device("emu:" + std::string(100000, 'x'));
  ExpectRefused(s, "device", "at most 64 bytes");
  s = WireSpec();
  s.set_seed(std::numeric_limits<uint64_t>::max());  // the seed is free
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
}

TEST(JobSpecLimitsTest, AModelTooLargeToHoldIsRefusedWithItsEstimateBeforeAnythingIsAllocated) {
  v1::JobSpec s = WireSpec();
  s.mutable_model()->set_name("mlp");
  s.mutable_model()->add_hidden(600000);
  ExpectRefused(s, "model.hidden[0]", "[1, 65536]");
  s.mutable_model()->clear_hidden();
  for (int i = 0; i < 17; ++i) s.mutable_model()->add_hidden(8);
  ExpectRefused(s, "model.hidden", "at most 16 hidden layers");
  // Sixteen layers of 65536 are each within range; together about 64 billion parameters.
  s.mutable_model()->clear_hidden();
  for (int i = 0; i < 16; ++i) s.mutable_model()->add_hidden(65536);
  ExpectRefused(s, "model", "within 2048 MiB");
  Status refused = wire::ValidateJobSpec(s);
  EXPECT_NE(refused.message().find("64477593610 parameters (an estimated 2.45963e+06 MiB)"), std::string::npos)
      << refused.message();
  // [4096, 4096]: 20 million parameters, about 764 MiB: accepted.
  s.mutable_model()->clear_hidden();
  s.mutable_model()->add_hidden(4096);
  s.mutable_model()->add_hidden(4096);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  auto bytes = wire::EstimateModelMemoryBytes(s);
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(*bytes, (784 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10) * 4 * wire::kCoordinatorModelCopies);
}

TEST(JobSpecLimitsTest, TheReaderAppliesTheSameLimitsWithTheLine) {
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\nhidden = [600000]\n[data.partition]\nparties = 2\n",
              {"job.toml:5:", "'model.hidden[0]'", "at most 65536, got 600000"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\nhidden = [65536, 65536, 65536]\n"
              "[data.partition]\nparties = 2\n",
              {"job.toml:3:1: spec.model: expected a model the coordinator can hold", "MiB"});
  ExpectError("name = \"t\"\nrounds = 1000000\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n",
              {"job.toml:2:", "'rounds'", "at most 100000"});
  ExpectError(std::string("max_update_norm = 0\n") + kMinimal, {"job.toml:1:", "'max_update_norm'", "> 0"});
  ExpectError(std::string("max_update_norm = 1e12\n") + kMinimal, {"job.toml:1:", "'max_update_norm'", "at most"});
  ExpectError(std::string(kMinimal) + "[train]\nbatch_size = 100000\n", {"job.toml:10:", "'train.batch_size'"});
  Result<v1::JobSpec> spec = ParseJobSpecString(std::string("max_update_norm = 50\n") + kMinimal, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_DOUBLE_EQ(spec->max_update_norm(), 50);
}

}  // namespace
}  // namespace tessera
