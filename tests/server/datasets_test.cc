// The coordinator's dataset catalogue (server/jobs/datasets.h): the --dataset flag's form, and the
// shape inferred at submit from the operator's copy.
#include "server/jobs/datasets.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/data/dataset_source.h"

namespace tessera::server {
namespace {

TEST(DatasetCatalogTest, TheFlagIsNameEqualsDirOnceEach) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "tessera_server_dataset_flag";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir / "cifar");
  const std::string cifar = (dir / "cifar").string();
  DatasetDirs dirs;
  EXPECT_TRUE(AddDatasetFlag("cifar10=" + cifar, &dirs).ok());
  EXPECT_EQ(dirs.by_name.at("cifar10"), cifar);
  for (const char* bad : {"cifar10", "=/x", "x=", "Upper=/x", "../x=/y", "fashion-mnist=/x"}) {
    Status s = AddDatasetFlag(bad, &dirs);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--dataset: expected NAME=DIR"), std::string::npos) << s.message();
  }
  Status twice = AddDatasetFlag("cifar10=/other", &dirs);
  EXPECT_NE(twice.message().find("given twice"), std::string::npos) << twice.message();
  // A mistyped directory stops the coordinator at start, not every job at its submission.
  const std::string missing = (dir / "cifer").string();
  EXPECT_EQ(AddDatasetFlag("tab=" + missing, &dirs).message(),
            "--dataset tab='" + missing + "': cannot read it (No such file or directory)");
  std::ofstream(dir / "file") << "not a directory";
  EXPECT_EQ(AddDatasetFlag("tab=" + (dir / "file").string(), &dirs).message(),
            "--dataset tab='" + (dir / "file").string() + "': expected a directory, got a file");
  EXPECT_EQ(dirs.by_name.count("tab"), 0u);
  std::filesystem::remove_all(dir);
}

TEST(DatasetCatalogTest, TheShapeAndClassesComeFromTheOperatorsTestSplit) {
  const auto dir = std::filesystem::path(::testing::TempDir()) / "tessera_server_datasets";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ASSERT_TRUE(WriteCsv((dir / "test.csv").string(), {"label", "a", "b"}, {{0, 1, 2}, {4, 3, 4}}).ok());
  DatasetDirs dirs;
  dirs.by_name["tab"] = dir.string();
  v1::JobSpec spec;
  spec.mutable_data()->set_dataset("tab");
  spec.mutable_data()->set_format("csv");
  ASSERT_TRUE(InferInputShape(dirs, &spec).ok());
  EXPECT_EQ(spec.data().input_shape().channels(), 2u);
  EXPECT_EQ(spec.data().input_shape().rows(), 1u);
  EXPECT_EQ(spec.data().input_shape().classes(), 5u) << "one more than the largest label";
  // data.classes wins when it covers the labels, and is refused when it does not.
  spec.mutable_data()->set_classes(7);
  ASSERT_TRUE(InferInputShape(dirs, &spec).ok());
  EXPECT_EQ(spec.data().input_shape().classes(), 7u);
  spec.mutable_data()->set_classes(3);
  Status few = InferInputShape(dirs, &spec);
  EXPECT_NE(few.message().find("data.classes is 3 but the test split has label 4"), std::string::npos) << few.message();
  // A dataset the operator did not give, and Fashion-MNIST's fixed shape.
  spec.mutable_data()->set_dataset("other");
  Status unknown = InferInputShape(dirs, &spec);
  EXPECT_EQ(unknown.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(unknown.message().find("--dataset other=DIR"), std::string::npos) << unknown.message();
  v1::JobSpec fashion;
  ASSERT_TRUE(InferInputShape(dirs, &fashion).ok());
  EXPECT_EQ(fashion.data().input_shape().rows(), 28u);
  EXPECT_EQ(fashion.data().input_shape().classes(), 10u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tessera::server
