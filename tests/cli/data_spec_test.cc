// The [data] table's dataset keys: other datasets by name and format, the csv label column,
// normalisation, classes and augmentation, in job.toml and over the wire.
#include <google/protobuf/util/message_differencer.h>
#include <gtest/gtest.h>

#include <string>

#include "cli/job_spec.h"
#include "core/data/idx.h"
#include "proto/job_mapping.h"
#include "tests/cli/job_spec_expectations.h"

namespace tessera {
namespace {

using testing::ExpectError;
using testing::ExpectRefused;
using testing::WireSpec;

// A job on dataset `data_lines` (the [data] table's keys) with `tables` after it.
std::string WithData(const std::string& data_lines, const std::string& tables = "") {
  return "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data]\n" + data_lines +
         "[data.partition]\nparties = 4\n" + tables;
}

TEST(DataSpecTest, AnotherDatasetByNameWithItsFormatNormalisationAndAugmentation) {
  Result<v1::JobSpec> spec = ParseJobSpecString(
      WithData("dataset = \"CIFAR10-local\"\nformat = \"CIFAR10\"\npath = \"/srv/cifar\"\n"
               "mean = [0.4914, 0.4822, 0.4465]\nstd = [0.247, 0.243, 0.261]\nclasses = 10\n",
               "[data.augment]\nhorizontal_flip = true\ncrop_padding = 4\n"),
      "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const v1::DataSpec& d = spec->data();
  EXPECT_EQ(d.dataset(), "cifar10-local");
  EXPECT_EQ(d.format(), "cifar10");
  EXPECT_EQ(d.path(), "/srv/cifar");
  ASSERT_EQ(d.mean_size(), 3);
  EXPECT_FLOAT_EQ(d.mean(1), 0.4822f);
  EXPECT_FLOAT_EQ(d.std(2), 0.261f);
  EXPECT_EQ(d.classes(), 10u);
  EXPECT_TRUE(d.augment().horizontal_flip());
  EXPECT_EQ(d.augment().crop_padding(), 4u);
  EXPECT_FALSE(d.has_input_shape()) << "the coordinator fills the shape";
  EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok()) << wire::ValidateJobSpec(*spec).ToString();
  // What `tessera check` writes reads back the same.
  Result<v1::JobSpec> again = ParseJobSpecString(JobSpecToToml(*spec), "shown.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << JobSpecToToml(*spec);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << JobSpecToToml(*spec);
}

TEST(DataSpecTest, CsvTakesALabelColumn) {
  Result<v1::JobSpec> spec =
      ParseJobSpecString(WithData("dataset = \"tabular\"\nformat = \"csv\"\npath = \"/d\"\nlabel_column = \"y\"\n"),
                         "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data().label_column(), "y");
  ExpectError(WithData("dataset = \"tabular\"\nformat = \"npz\"\nlabel_column = \"y\"\n"),
              {"job.toml:", "'data.label_column'", "\"csv\" only"});
}

// Fashion-MNIST takes one mean and one std in place of its own statistics: {0, 1} keeps x / 255,
// as NIID-Bench's code reads the images.
TEST(DataSpecTest, FashionMnistMayReplaceItsOwnStatistics) {
  Result<v1::JobSpec> spec = ParseJobSpecString(WithData("mean = [0.0]\nstd = [1.0]\n"), "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const PixelNormalisation normalisation = wire::FashionNormalisation(*spec);
  EXPECT_EQ(normalisation.mean, 0.0f);
  EXPECT_EQ(normalisation.std, 1.0f);
  Result<v1::JobSpec> plain = ParseJobSpecString(WithData(""), "job.toml");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(wire::FashionNormalisation(*plain).mean, kFashionMnistMean);
  EXPECT_EQ(wire::FashionNormalisation(*plain).std, kFashionMnistStd);
  v1::JobSpec two = *spec;
  two.mutable_data()->add_mean(0.5f);
  two.mutable_data()->add_std(0.5f);
  ExpectRefused(two, "data.mean", "at most one value for fashion-mnist");
  // The loader applies it: a pixel byte x becomes x / 255 exactly.
  auto raw = LoadFashionMnist(kDefaultFashionMnistDir, /*train=*/false, normalisation);
  if (!raw.ok()) GTEST_SKIP() << "Fashion-MNIST is not installed here: " << raw.status().ToString();
  auto bytes = ReadIdxImages(FindFashionMnist(kDefaultFashionMnistDir, false)->images);
  ASSERT_TRUE(bytes.ok());
  const std::vector<float> values = raw->Values();
  for (size_t i = 0; i < 5000; ++i) EXPECT_EQ(values[i], static_cast<float>(bytes->pixels[i]) / 255.0f) << i;
}

TEST(DataSpecTest, RefusesWhatCannotBeRead) {
  ExpectError(WithData("dataset = \"cifar\"\n"), {"'data.format'", "is required", "\"cifar10\""});
  ExpectError(WithData("dataset = \"cifar\"\nformat = \"cifar-10\"\n"), {"'data.format'", "\"cifar-10\""});
  ExpectError(WithData("format = \"csv\"\n"), {"'data.format'", "fashion-mnist is \"idx\""});
  ExpectError(WithData("dataset = \"../etc\"\nformat = \"idx\"\n"), {"'data.dataset'", "[a-z0-9._-]"});
  ExpectError(WithData("dataset = \"x\"\nformat = \"idx\"\nmean = [0.5]\n"), {"'data.mean'", "1 means, 0 deviations"});
  ExpectError(WithData("dataset = \"x\"\nformat = \"idx\"\nmean = [0.5]\nstd = [0]\n"), {"'data.std[0]'", "positive"});
  ExpectError(WithData("dataset = \"x\"\nformat = \"idx\"\nmean = [\"a\"]\nstd = [1]\n"),
              {"'data.mean[0]'", "expected a number"});
  ExpectError(WithData("mean = [0.5, 0.5]\nstd = [1, 1]\n"), {"'data.mean'", "one channel", "got 2"});
  ExpectError(WithData("classes = 3\n"), {"'data.classes'", "10 classes"});
  ExpectError(WithData("dataset = \"x\"\nformat = \"idx\"\nclasses = 1\n"), {"'data.classes'", "at least 2"});
  ExpectError(WithData("dataset = \"x\"\nformat = \"idx\"\nclasses = 300\n"), {"'data.classes'", "at most 256"});
  ExpectError(WithData("", "[data.augment]\nflip = true\n"), {"unknown key 'data.augment.flip'", "horizontal_flip"});
  ExpectError(WithData("", "[data.augment]\nhorizontal_flip = 1\n"), {"'data.augment.horizontal_flip'", "true or false"});
  ExpectError(WithData("", "[data.augment]\ncrop_padding = 17\n"), {"'data.augment.crop_padding'", "at most 16"});
  ExpectError(WithData("colour = true\n"), {"unknown key 'data.colour'"});
}

TEST(DataSpecTest, LabelsPerPartyAreBoundedByTheClasses) {
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 4\nkind = "
              "\"label-quantity\"\nlabels_per_party = 11\n",
              {"'data.partition.labels_per_party'", "at most 10"});
  ExpectError("name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data]\ndataset = \"x\"\nformat = \"csv\"\nclasses = "
              "3\n[data.partition]\nparties = 4\nkind = \"label-quantity\"\nlabels_per_party = 4\n",
              {"'data.partition.labels_per_party'", "at most 3"});
}

TEST(DataSpecTest, PartyLabelsPinEachPartysLabels) {
  const std::string head = "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data.partition]\nparties = 3\n";
  Result<v1::JobSpec> spec =
      ParseJobSpecString(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], [1, 6], [2, 4]]\n", "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const v1::PartitionSpec& p = spec->data().partition();
  EXPECT_EQ(p.labels_per_party(), 2u) << "taken from the sets";
  ASSERT_EQ(p.party_labels_size(), 3);
  EXPECT_EQ(p.party_labels(0).labels(1), 7u);
  EXPECT_EQ(p.party_labels(2).labels(0), 2u);
  EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok()) << wire::ValidateJobSpec(*spec).ToString();
  PartitionConfig config = wire::ToPartitionConfig(*spec).value();
  ASSERT_EQ(config.party_labels.size(), 3u);
  EXPECT_EQ(config.party_labels[1], (std::vector<uint32_t>{1, 6}));
  Result<v1::JobSpec> again = ParseJobSpecString(JobSpecToToml(*spec), "shown.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << JobSpecToToml(*spec);
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*spec, *again)) << JobSpecToToml(*spec);

  ExpectError(head + "party_labels = [[0, 7], [1, 6], [2, 4]]\n", {"'data.partition.party_labels'", "\"label-quantity\" only"});
  ExpectError(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], [1, 6]]\n",
              {"'data.partition.party_labels'", "one array of labels per party (3), got 2"});
  ExpectError(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], [1, 6], [2]]\n",
              {"'data.partition.party_labels[2]'", "expected 2 labels"});
  ExpectError(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], [1, 1], [2, 4]]\n",
              {"'data.partition.party_labels[1]'", "label 1 appears twice"});
  ExpectError(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], [1, 10], [2, 4]]\n",
              {"'data.partition.party_labels[1][1]'", "10"});
  ExpectError(head + "kind = \"label-quantity\"\nparty_labels = [[0, 7], \"x\", [2, 4]]\n",
              {"'data.partition.party_labels[1]'", "expected an array of integers"});

  // The wire holds the same rules.
  v1::JobSpec wire_spec = *spec;
  wire_spec.mutable_data()->mutable_partition()->mutable_party_labels(1)->set_labels(1, 1);
  ExpectRefused(wire_spec, "data.partition.party_labels[1]", "distinct labels");
  wire_spec.mutable_data()->mutable_partition()->mutable_party_labels(1)->add_labels(3);
  ExpectRefused(wire_spec, "data.partition.party_labels[1]", "2 labels");
  wire_spec = *spec;
  wire_spec.mutable_data()->mutable_partition()->add_party_labels()->add_labels(3);
  ExpectRefused(wire_spec, "data.partition.party_labels", "one set per party (3)");
  wire_spec = *spec;
  wire_spec.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  ExpectRefused(wire_spec, "data.partition.party_labels", "\"label-quantity\"");
}

// 1e-45 is positive as a double but subnormal as the float data.std is stored as, and 1e-50
// becomes 0: neither has a finite reciprocal, so every normalised value would be infinite.
TEST(DataSpecTest, AStdTooSmallForItsReciprocalToBeFiniteIsRefused) {
  for (const char* tiny : {"1e-45", "1e-50"}) {
    SCOPED_TRACE(tiny);
    ExpectError(WithData(std::string("dataset = \"x\"\nformat = \"idx\"\nmean = [0.5]\nstd = [") + tiny + "]\n"),
                {"'data.std[0]'", "1/std is finite", tiny});
  }
  v1::JobSpec spec = WireSpec();
  spec.mutable_data()->add_mean(0.5f);
  spec.mutable_data()->add_std(1e-45f);
  ExpectRefused(spec, "data.std[0]", "1/std is finite");
  spec.mutable_data()->set_std(0, 1.2e-38f);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
}

TEST(DataSpecTest, TheWireChecksTheSameAndTheShapeTheCoordinatorFills) {
  v1::JobSpec spec = WireSpec();
  spec.mutable_data()->set_dataset("cifar");
  spec.mutable_data()->set_path("/srv/cifar");  // the workers' copy, for a shared partition
  ExpectRefused(spec, "data.format", "the format of dataset");
  spec.mutable_data()->set_format("tar");
  ExpectRefused(spec, "data.format", "\"cifar10\"");
  spec.mutable_data()->set_format("cifar10");
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
  spec.mutable_data()->set_dataset(std::string(100, 'a'));
  ExpectRefused(spec, "data.dataset", "1 to 64");
  spec.mutable_data()->set_dataset("cifar");
  spec.mutable_data()->add_mean(0.5f);
  ExpectRefused(spec, "data.std", "as many values as data.mean");
  spec.mutable_data()->add_std(-1.0f);
  ExpectRefused(spec, "data.std[0]", "a positive number");
  spec.mutable_data()->set_std(0, 0.25f);
  spec.mutable_data()->mutable_augment()->set_crop_padding(100);
  ExpectRefused(spec, "data.augment.crop_padding", "at most 16");
  spec.mutable_data()->mutable_augment()->set_crop_padding(4);
  v1::InputShape* shape = spec.mutable_data()->mutable_input_shape();
  shape->set_channels(3);
  shape->set_rows(32);
  shape->set_cols(32);
  shape->set_classes(0);
  ExpectRefused(spec, "data.input_shape.classes", "1 to 256");
  shape->set_classes(10);
  EXPECT_TRUE(wire::ValidateJobSpec(spec).ok()) << wire::ValidateJobSpec(spec).ToString();
  // The model is built for the shape: an MLP over 3x32x32 inputs.
  ModelConfig config = wire::ToModelConfig(spec);
  EXPECT_EQ(config.channels, 3);
  EXPECT_EQ(config.rows, 32);
  EXPECT_EQ(config.classes, 10);
  shape->set_rows(1);  // tabular: no crop
  ExpectRefused(spec, "data.augment.crop_padding", "not images");
  shape->set_rows(65536);
  shape->set_cols(65536);
  ExpectRefused(spec, "data.input_shape", "values a sample");
}

TEST(DataSpecTest, FederatedEvaluationIsAKeyOfItsOwnTable) {
  Result<v1::JobSpec> spec = ParseJobSpecString(WithData("", "[evaluation]\nfederated = true\n"), "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(spec->evaluation().federated());
  Result<v1::JobSpec> again = ParseJobSpecString(JobSpecToToml(*spec), "shown.toml");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->evaluation().federated());
  ExpectError(WithData("", "[evaluation]\nfederate = true\n"), {"unknown key 'evaluation.federate'", "federated"});
  ExpectError(WithData("", "[evaluation]\nfederated = \"yes\"\n"), {"'evaluation.federated'", "true or false"});
  v1::JobSpec external = WireSpec();
  external.mutable_model()->set_trainer("pytorch");
  external.mutable_evaluation()->set_federated(true);
  ExpectRefused(external, "evaluation.federated", "false with an external trainer");
}

// A shared partition of a dataset other than Fashion-MNIST is read by each worker from
// data.path: a spec without it is refused, not left for every worker to fail its rounds on.
TEST(DataSpecTest, ASharedPartitionOfAnotherDatasetNeedsItsPath) {
  ExpectError(WithData("dataset = \"cifar\"\nformat = \"cifar10\"\n"),
              {"job.toml: key 'data.path': is required for dataset \"cifar\" with partition kind \"iid\"",
               "\"local-files\""});
  ExpectError(WithData("dataset = \"cifar\"\nformat = \"cifar10\"\npath = \"\"\n"), {"job.toml:8:8: key 'data.path'"});
  // The workers' own files need none, and Fashion-MNIST has its default directory.
  Result<v1::JobSpec> local =
      ParseJobSpecString(WithData("dataset = \"cifar\"\nformat = \"cifar10\"\n", "kind = \"local-files\"\n"), "job.toml");
  EXPECT_TRUE(local.ok()) << local.status().ToString();
  Result<v1::JobSpec> fashion = ParseJobSpecString(WithData(""), "job.toml");
  EXPECT_TRUE(fashion.ok()) << fashion.status().ToString();
}

// max_train_samples cuts the training split a shared partition is cut from, so it must hold a
// sample per party; with "local-files" it cuts each worker's own files, whatever their number.
TEST(DataSpecTest, ACutOfTheTrainingSamplesMustFeedEveryPartyOfASharedPartition) {
  ExpectError(WithData("max_train_samples = 3\n"),
              {"job.toml:6:21: key 'data.max_train_samples': 3 samples cannot be split among 4 parties"});
  Result<v1::JobSpec> local = ParseJobSpecString(WithData("max_train_samples = 3\n", "kind = \"local-files\"\n"), "job.toml");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->data().max_train_samples(), 3u);
}

// A dataset other than Fashion-MNIST has its shape once the coordinator has read it: the model
// is built for that shape at submit, not for Fashion-MNIST's 1x28x28 before.
TEST(DataSpecTest, AModelForAnotherDatasetIsBuiltForItsShapeOnceKnown) {
  const std::string depthwise = "name = \"t\"\nrounds = 5\n[model]\nlayers = [{ type = \"conv2d\", out = 6, kernel = 30, "
                                "groups = 3 }, { type = \"flatten\" }, { type = \"linear\" }]\n[data]\ndataset = "
                                "\"cifar\"\nformat = \"cifar10\"\npath = \"/d\"\n[data.partition]\nparties = 4\n";
  Result<v1::JobSpec> spec = ParseJobSpecString(depthwise, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  v1::JobSpec shaped = *spec;
  v1::InputShape* shape = shaped.mutable_data()->mutable_input_shape();
  shape->set_channels(3);
  shape->set_rows(32);
  shape->set_cols(32);
  shape->set_classes(10);
  EXPECT_TRUE(wire::ValidateJobSpec(shaped).ok()) << wire::ValidateJobSpec(shaped).ToString();
  shape->set_channels(1);
  ExpectRefused(shaped, "model", "groups 3 must divide its 1 input channels");
}

// What tessera check refuses of a shared partition, the coordinator refuses of a spec sent
// another way: too few samples for its parties, and no directory for a dataset that has no
// default one.
TEST(DataSpecTest, TheCoordinatorRefusesASharedPartitionItsWorkersCouldNotRead) {
  const std::string local = "name = \"t\"\nrounds = 5\n[model]\nname = \"mlp\"\n[data]\ndataset = \"cifar\"\n"
                            "format = \"cifar10\"\n[data.partition]\nkind = \"local-files\"\nparties = 4\n";
  Result<v1::JobSpec> spec = ParseJobSpecString(local, "job.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  v1::JobSpec shared = *spec;
  shared.mutable_data()->mutable_partition()->set_kind(v1::PARTITION_IID);
  ExpectRefused(shared, "data.path", "the workers' directory of dataset \"cifar\" for a shared partition");
  shared.mutable_data()->set_path("/srv/cifar");
  EXPECT_TRUE(wire::ValidateJobSpec(shared).ok()) << wire::ValidateJobSpec(shared).ToString();
  shared.mutable_data()->set_max_train_samples(3);
  ExpectRefused(shared, "data.max_train_samples", "0 (all) or at least data.partition.parties (4)");
  // Each worker's own files are cut to that many: any count fits.
  v1::JobSpec own = *spec;
  own.mutable_data()->set_max_train_samples(3);
  EXPECT_TRUE(wire::ValidateJobSpec(own).ok()) << wire::ValidateJobSpec(own).ToString();
}

// A layer's double from the wire past float's range is refused as out of range (it becomes an
// infinity, never an undefined cast).
TEST(DataSpecTest, ALayersNumberPastFloatsRangeIsRefused) {
  v1::JobSpec spec = WireSpec();
  spec.mutable_model()->set_name("declared");
  spec.mutable_model()->clear_hidden();
  v1::LayerSpec* dropout = spec.mutable_model()->add_layers();
  dropout->set_type("dropout");
  dropout->set_probability(1e300);
  spec.mutable_model()->add_layers()->set_type("flatten");
  spec.mutable_model()->add_layers()->set_type("linear");
  ExpectRefused(spec, "model", "probability must be in [0, 1), got inf");
  dropout->set_probability(-1e300);
  ExpectRefused(spec, "model", "probability must be in [0, 1), got -inf");
}

TEST(DataSpecTest, TheCsvExampleReads) {
  Result<v1::JobSpec> spec = ParseJobSpecFile(std::string(TESSERA_SOURCE_DIR) + "/examples/breast-cancer-csv.toml");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->data().dataset(), "breast-cancer");
  EXPECT_EQ(spec->data().format(), "csv");
  EXPECT_EQ(spec->data().label_column(), "diagnosis");
  EXPECT_EQ(spec->data().classes(), 2u);
  EXPECT_EQ(spec->data().mean_size(), 30);
  EXPECT_EQ(spec->data().std_size(), 30);
  EXPECT_TRUE(wire::ValidateJobSpec(*spec).ok()) << wire::ValidateJobSpec(*spec).ToString();
}

}  // namespace
}  // namespace tessera
