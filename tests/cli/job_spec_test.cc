#include "cli/job_spec.h"
#include "proto/job_mapping.h"

#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <string>

namespace tessera {
namespace {

// The smallest spec the reader accepts; tests append or replace lines.
constexpr char kMinimal[] = R"(name = "t"
rounds = 5

[model]
name = "simplecnn"

[data.partition]
parties = 4
)";

std::string ExamplePath(const std::string& name) {
  return (std::filesystem::path(TESSERA_SOURCE_DIR) / "examples" / name).string();
}

// Parses `text` and expects an InvalidArgument whose message contains each of `parts`.
void ExpectError(const std::string& text, std::initializer_list<std::string> parts) {
  Result<v1::JobSpec> spec = ParseJobSpecString(text, "job.toml");
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << text;
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  for (const std::string& part : parts) {
    EXPECT_NE(spec.status().message().find(part), std::string::npos)
        << "message lacks '" << part << "': " << spec.status().message();
  }
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
beta = 0.3
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
  EXPECT_DOUBLE_EQ(spec->data().partition().beta(), 0.3);
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
  for (const char* name : {"fmnist-fedavg.toml", "fmnist-fedavgm.toml", "fmnist-robust.toml", "niid-bench-iid.toml",
                           "niid-bench-dirichlet.toml", "smoke.toml"}) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath(name));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    EXPECT_EQ(spec->name() + ".toml", name);
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
                           "niid-bench-dirichlet.toml", "smoke.toml"}) {
    SCOPED_TRACE(name);
    Result<v1::JobSpec> spec = ParseJobSpecFile(ExamplePath(name));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const std::string text = JobSpecToToml(*spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
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
  ExpectError(std::string(kMinimal) + "beta = true\n",
              {"job.toml:9:", "'data.partition.beta'", "expected a float, found a boolean"});
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
  for (const char* device : {"cpu", "cuda", "xrt", "emu:t4"}) {
    Result<v1::JobSpec> spec = ParseJobSpecString(std::string("device = \"") + device + "\"\n" + kMinimal, "job.toml");
    ASSERT_TRUE(spec.ok()) << device << ": " << spec.status().ToString();
    EXPECT_EQ(spec->device(), device);
  }
}

TEST(JobSpecTest, NamesAndPathsAreBoundedPlainText) {
  const std::string rest = "rounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 2\n";
  ExpectError("name = \"" + std::string(129, 'n') + "\"\n" + rest, {"job.toml:1:", "'name'", "at most 128 bytes", "found 129 bytes"});
  ExpectError("name = \"a\\u0007b\"\n" + rest, {"job.toml:1:", "'name'", "a control character"});
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
  ExpectError(std::string(kMinimal) + "beta = 0\n", {"job.toml:9:", "'data.partition.beta'", "> 0"});
  ExpectError(std::string(kMinimal) + "labels_per_party = 11\n",
              {"job.toml:9:", "'data.partition.labels_per_party'", "at most 10"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 0\n",
              {"job.toml:6:", "'data.partition.parties'"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data]\nmax_train_samples = 3\n"
              "[data.partition]\nparties = 4\n",
              {"job.toml:6:", "'data.max_train_samples'", "among 4 parties"});
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
  ExpectError(std::string(kMinimal) + "[data]\ndataset = \"cifar10\"\n", {"'data.dataset'", "\"fashion-mnist\""});
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
  EXPECT_EQ(wire::CoordinatorModelCopies(big), wire::kCoordinatorModelCopies + 2 + 100 * wire::kScaffoldModelCopiesPerParty);
  Status too_big = wire::ValidateJobSpec(big);
  EXPECT_NE(too_big.message().find("spec.model: expected a model the coordinator can hold"), std::string::npos)
      << too_big.message();
  EXPECT_NE(too_big.message().find("(scaffold: 9 per party)"), std::string::npos) << too_big.message();
  big.set_strategy("fedavg");
  EXPECT_TRUE(wire::ValidateJobSpec(big).ok()) << wire::ValidateJobSpec(big).message();
}

TEST(JobSpecTest, NiidBenchExamplesForEveryAlgorithmAndSkew) {
  int seen = 0;
  for (const char* skew : {"dirichlet", "label-quantity"}) {
    for (const char* strategy : {"fedavg", "fedprox", "scaffold", "fednova"}) {
      const std::string name = std::string(skew) + "-" + strategy;
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
      EXPECT_DOUBLE_EQ(spec->proximal_mu(), std::string(strategy) == "fedprox" ? 0.01 : 0.0);
      if (std::string(skew) == "dirichlet") {
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

// A spec as it arrives over the wire, valid; tests change one field.
v1::JobSpec WireSpec() {
  Result<v1::JobSpec> spec = ParseJobSpecString(kMinimal, "job.toml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

// Expects ValidateJobSpec to refuse `spec` with a message naming `field` and saying what was
// expected, without echoing more than `max_length` bytes.
void ExpectRefused(const v1::JobSpec& spec, const std::string& field, const std::string& expected,
                   size_t max_length = 400) {
  Status s = wire::ValidateJobSpec(spec);
  ASSERT_FALSE(s.ok()) << "accepted a spec with a bad " << field;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec." + field + ": expected"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
  EXPECT_LE(s.message().size(), max_length) << s.message();
}

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

namespace tessera {
namespace {

// kMinimal with ten parties and `lines` added at the top level (before any table).
std::string TenParties(const std::string& lines, const std::string& tables = "") {
  return lines + "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 10\n" + tables;
}

Result<v1::JobSpec> Parse(const std::string& text) { return ParseJobSpecString(text, "job.toml"); }

TEST(ServerOptimizerSpecTest, TheAdaptiveStrategiesGetTheirDefaults) {
  for (const char* strategy : {"fedadam", "FedYogi", "fedadagrad"}) {
    SCOPED_TRACE(strategy);
    Result<v1::JobSpec> spec = Parse(TenParties(std::string("strategy = \"") + strategy + "\"\n"));
    ASSERT_TRUE(spec.ok()) << spec.status().ToString();
    const auto& server = spec->server();
    EXPECT_DOUBLE_EQ(server.learning_rate(), spec->strategy() == "fedadagrad" ? 0.3 : 0.03);
    EXPECT_TRUE(server.has_beta1());
    EXPECT_DOUBLE_EQ(server.beta1(), 0.9);
    EXPECT_EQ(server.has_beta2(), spec->strategy() != "fedadagrad");  // Adagrad has no beta2
    if (server.has_beta2()) {
      EXPECT_DOUBLE_EQ(server.beta2(), 0.99);
    }
    EXPECT_DOUBLE_EQ(server.tau(), 1e-3);
    EXPECT_DOUBLE_EQ(server.momentum(), 0);
    EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok());
  }
  Result<v1::JobSpec> set = Parse(TenParties("strategy = \"fedyogi\"\n",
                                             "[server]\nlearning_rate = 0.05\nbeta1 = 0\nbeta2 = 0.999\ntau = 1e-9\n"));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_DOUBLE_EQ(set->server().learning_rate(), 0.05);
  EXPECT_TRUE(set->server().has_beta1());
  EXPECT_DOUBLE_EQ(set->server().beta1(), 0);
  EXPECT_DOUBLE_EQ(set->server().beta2(), 0.999);
  EXPECT_DOUBLE_EQ(set->server().tau(), 1e-9);
}

TEST(ServerOptimizerSpecTest, AnOptionOfAnotherStrategyOrOutOfRangeIsRefusedWithItsLine) {
  const std::string adam = "strategy = \"fedadam\"\n";
  ExpectError(TenParties(adam, "[server]\nmomentum = 0.9\n"),
              {"job.toml:9:", "'server.momentum'", "applies to strategies \"fedavgm\" only; strategy is \"fedadam\""});
  ExpectError(TenParties("strategy = \"fedavgm\"\n", "[server]\ntau = 0.01\n"),
              {"job.toml:9:", "'server.tau'", "\"fedadam\", \"fedyogi\" and \"fedadagrad\" only"});
  ExpectError(TenParties("strategy = \"fedadagrad\"\n", "[server]\nbeta2 = 0.9\n"),
              {"job.toml:9:", "'server.beta2'", "\"fedadam\" and \"fedyogi\" only; strategy is \"fedadagrad\""});
  ExpectError(TenParties(adam, "[server]\nbeta1 = 1\n"), {"job.toml:9:", "'server.beta1'", "[0, 1)"});
  ExpectError(TenParties(adam, "[server]\nbeta2 = -0.1\n"), {"job.toml:9:", "'server.beta2'", "[0, 1)"});
  ExpectError(TenParties(adam, "[server]\ntau = 0\n"), {"job.toml:9:", "'server.tau'", "> 0 and at most 1"});
  ExpectError(TenParties(adam, "[server]\nlearning_rate = 5000\n"), {"job.toml:9:", "'server.learning_rate'", "(0, 1000]"});
  ExpectError(TenParties(adam, "[server]\nepsilon = 1e-8\n"), {"'server.epsilon'", "beta1, beta2, tau"});
  ExpectError(TenParties("strategy = \"fedsgd\"\n"), {"job.toml:1:", "'strategy'", "\"fedadagrad\""});
}

TEST(ServerOptimizerSpecTest, StrategiesThatAggregateInTheirOwnWayTakeNoRuleNorServerOptions) {
  v1::JobSpec s = WireSpec();
  s.set_strategy("fednova");
  s.mutable_aggregation()->set_rule("median");
  ExpectRefused(s, "aggregation.rule", "\"mean\" for strategy \"fednova\"");
  s = WireSpec();
  s.set_strategy("scaffold");
  s.mutable_server()->set_learning_rate(0.5);
  ExpectRefused(s, "server", "no server options for strategy \"scaffold\"");
  // FedProx's server side is FedAvg's, so a robust rule applies to it.
  s = WireSpec();
  s.set_strategy("fedprox");
  s.set_proximal_mu(0.01);
  s.mutable_aggregation()->set_rule("median");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
  // The client side of these algorithms runs in native training: no external trainer takes it.
  s.mutable_model()->set_trainer("pytorch");
  ExpectRefused(s, "model.trainer", "no external trainer with strategy \"fedprox\"");
  s = WireSpec();
  s.mutable_model()->set_trainer("Py Torch");
  ExpectRefused(s, "model.trainer", "[a-z0-9._-]");
}

TEST(ServerOptimizerSpecTest, AWireSpecIsCheckedAlike) {
  Result<v1::JobSpec> adam = Parse(TenParties("strategy = \"fedadam\"\n"));
  ASSERT_TRUE(adam.ok());
  v1::JobSpec s = *adam;
  s.mutable_server()->set_tau(-1);
  ExpectRefused(s, "server.tau", "[0, 1] (0: the default, 0.001)");
  s = *adam;
  s.mutable_server()->set_beta2(1);
  ExpectRefused(s, "server.beta2", "[0, 1)");
  s = *adam;
  s.mutable_server()->set_momentum(0.5);
  ExpectRefused(s, "server.momentum", "no value for strategy \"fedadam\" (it applies to fedavgm)");
  s = *adam;
  s.set_strategy("fedadagrad");
  ExpectRefused(s, "server.beta2", "(it applies to fedadam and fedyogi)");
  s = *adam;
  s.set_strategy("fedavgm");
  ExpectRefused(s, "server.beta1", "no value for strategy \"fedavgm\"");
  s = *adam;
  s.set_strategy("fedavg");
  ExpectRefused(s, "server", "no server options for strategy \"fedavg\"");
  s = *adam;
  s.set_strategy("fedsgd");
  ExpectRefused(s, "strategy", "one of fedavg, fedavgm, fedadam, fedyogi, fedadagrad, fedprox, fednova, scaffold");
  s = *adam;
  s.set_strategy("fedprox");
  s.set_proximal_mu(0.01);
  ExpectRefused(s, "server", "no server options for strategy \"fedprox\"");
  // Unset options are the defaults: a bare adaptive strategy over the wire is valid.
  s = WireSpec();
  s.set_strategy("fedyogi");
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
}

TEST(AggregationSpecTest, ARuleAsANameOrAsATableWithItsOptions) {
  Result<v1::JobSpec> plain = Parse(TenParties(""));
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->aggregation().rule(), "mean");
  EXPECT_EQ(plain->update_norm_policy(), "refuse");

  Result<v1::JobSpec> median = Parse(TenParties("aggregation = \"Median\"\n"));
  ASSERT_TRUE(median.ok()) << median.status().ToString();
  EXPECT_EQ(median->aggregation().rule(), "median");

  Result<v1::JobSpec> trimmed = Parse(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\n"));
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().ToString();
  EXPECT_DOUBLE_EQ(trimmed->aggregation().trim_fraction(), 0.2);  // the default
  trimmed = Parse(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.3\n"));
  ASSERT_TRUE(trimmed.ok()) << trimmed.status().ToString();
  EXPECT_DOUBLE_EQ(trimmed->aggregation().trim_fraction(), 0.3);

  Result<v1::JobSpec> krum =
      Parse(TenParties("strategy = \"fedadam\"\nupdate_norm_policy = \"clip\"\n",
                       "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\nselected = 4\n"));
  ASSERT_TRUE(krum.ok()) << krum.status().ToString();
  EXPECT_EQ(krum->aggregation().byzantine_clients(), 2u);
  EXPECT_EQ(krum->aggregation().selected(), 4u);
  EXPECT_EQ(krum->update_norm_policy(), "clip");
  EXPECT_TRUE(wire::ValidateJobSpec(*krum).ok());

  // Shown and read back, each is the same spec.
  for (const v1::JobSpec* spec : {&*plain, &*median, &*trimmed, &*krum}) {
    const std::string text = JobSpecToToml(*spec);
    Result<v1::JobSpec> again = ParseJobSpecString(text, "shown.toml");
    ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << text;
    EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << text;
  }
}

TEST(AggregationSpecTest, WhatCannotApplyIsRefusedNamingTheKey) {
  ExpectError(TenParties("aggregation = \"mode\"\n"),
              {"job.toml:1:", "'aggregation'", "\"mean\", \"median\", \"trimmed-mean\", \"krum\""});
  ExpectError(TenParties("aggregation = 3\n"), {"job.toml:1:", "'aggregation'", "a string) or an [aggregation] table"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"median\"\ntrim_fraction = 0.2\n"),
              {"job.toml:9:", "'aggregation.trim_fraction'", "\"trimmed-mean\" only; rule is \"median\""});
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\nselected = 2\n"),
              {"job.toml:9:", "'aggregation.selected'", "\"krum\" only"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.5\n"),
              {"job.toml:9:", "'aggregation.trim_fraction'", "below 0.5"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\n"),
              {"'aggregation.byzantine_clients'", "is required for rule \"krum\""});
  ExpectError(TenParties("aggregation = \"krum\"\n"), {"'aggregation.byzantine_clients'", "is required"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\nbyzantine = 1\n"),
              {"'aggregation.byzantine'", "rule, trim_fraction, byzantine_clients, selected"});
  // Krum's condition n > 2f + 2 for the fewest updates a round may close with: with
  // min_clients 10, f may be at most 3.
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 4\n"),
              {"job.toml:9:", "spec.aggregation.byzantine_clients: expected f with min_clients (10) > 2f + 2",
               "at most 3, got 4"});
  EXPECT_TRUE(Parse(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 3\n")).ok());
  ExpectError(TenParties("min_clients = 6\n", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 2\n"),
              {"job.toml:10:", "spec.aggregation.byzantine_clients", "min_clients (6)", "at most 1, got 2"});
  ExpectError(TenParties("", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 3\nselected = 8\n"),
              {"job.toml:10:", "spec.aggregation.selected: expected at most min_clients - byzantine_clients (7), got 8"});
  ExpectError(TenParties("min_clients = 2\n", "[aggregation]\nrule = \"krum\"\nbyzantine_clients = 0\n"),
              {"spec.min_clients: expected at least 3 for rule \"krum\"", "got 2"});
  // A trim that cuts nothing from a full round: 0.05 of 10 clients.
  ExpectError(TenParties("", "[aggregation]\nrule = \"trimmed-mean\"\ntrim_fraction = 0.05\n"),
              {"job.toml:9:", "spec.aggregation.trim_fraction: expected a fraction that cuts at least one update",
               "at least 1/10, got 0.05"});
  ExpectError(TenParties("update_norm_policy = \"ignore\"\n"),
              {"job.toml:1:", "'update_norm_policy'", "\"refuse\", \"clip\""});
}

TEST(AggregationSpecTest, ARobustRuleMustBeAbleToHoldEveryUpdateOfARound) {
  // An MLP of [4096, 4096] (20.0 million parameters, 80 MB) fits the coordinator, but 20
  // clients' copies of it (1.5 GiB) exceed the 1 GiB a robust rule may hold.
  v1::JobSpec s = WireSpec();
  s.mutable_model()->set_name("mlp");
  s.mutable_model()->add_hidden(4096);
  s.mutable_model()->add_hidden(4096);
  s.mutable_data()->mutable_partition()->set_parties(20);
  s.set_clients_per_round(20);
  s.set_min_clients(20);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s.mutable_aggregation()->set_rule("median");
  ExpectRefused(s, "aggregation.rule", "keeps every update until the round closes");
  Status refused = wire::ValidateJobSpec(s);
  EXPECT_NE(refused.message().find("within 1024 MiB, got 20 clients x 20037642 parameters (1528.75 MiB)"),
            std::string::npos)
      << refused.message();
  s.set_clients_per_round(13);  // 994 MiB
  s.set_min_clients(13);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok()) << wire::ValidateJobSpec(s).ToString();
}

TEST(AggregationSpecTest, AWireSpecIsCheckedAlike) {
  v1::JobSpec s = WireSpec();  // four clients
  s.mutable_aggregation()->set_rule("Median");
  ExpectRefused(s, "aggregation.rule", "\"mean\", \"median\", \"trimmed-mean\" or \"krum\"");
  s = WireSpec();
  s.mutable_aggregation()->set_rule("mean");
  s.mutable_aggregation()->set_byzantine_clients(1);
  ExpectRefused(s, "aggregation.byzantine_clients", "no value for rule \"mean\" (it applies to krum)");
  s = WireSpec();
  s.mutable_aggregation()->set_rule("trimmed-mean");
  s.mutable_aggregation()->set_trim_fraction(std::numeric_limits<double>::quiet_NaN());
  ExpectRefused(s, "aggregation.trim_fraction", "[0, 0.5)");
  s.mutable_aggregation()->set_trim_fraction(0);  // the default 0.2 of 4 clients cuts nothing
  ExpectRefused(s, "aggregation.trim_fraction", "at least 1/4, got 0.2");
  s.mutable_aggregation()->set_trim_fraction(0.25);
  EXPECT_TRUE(wire::ValidateJobSpec(s).ok());
  s = WireSpec();
  s.mutable_aggregation()->set_rule("krum");
  s.mutable_aggregation()->set_byzantine_clients(4000000000u);
  ExpectRefused(s, "aggregation.byzantine_clients", "min_clients (4) > 2f + 2");
  s.mutable_aggregation()->set_byzantine_clients(0);
  s.mutable_aggregation()->set_selected(4000000000u);
  ExpectRefused(s, "aggregation.selected", "at most min_clients - byzantine_clients (4)");
  s = WireSpec();
  s.set_update_norm_policy("CLIP");
  ExpectRefused(s, "update_norm_policy", "\"refuse\" or \"clip\"");
}

}  // namespace
}  // namespace tessera
