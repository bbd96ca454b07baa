#include "server/jobs/datasets.h"

#include "base/escape.h"
#include "base/flags.h"
#include "core/data/dataset_source.h"
#include "core/data/idx.h"
#include "proto/job_mapping.h"

namespace tessera::server {
namespace {

// The operator's directory of the job's dataset (not Fashion-MNIST).
Result<std::string> DirectoryOf(const DatasetDirs& dirs, const v1::JobSpec& spec) {
  const std::string& name = spec.data().dataset();
  auto it = dirs.by_name.find(name);
  if (it == dirs.by_name.end()) {
    return FailedPreconditionError("data.dataset \"" + EscapeUntrusted(name) +
                                   "\": this coordinator has no copy of it (start it with --dataset " +
                                   EscapeUntrusted(name) + "=DIR, the operator's directory of the dataset)");
  }
  return it->second;
}

Result<DataSource> SourceOf(const DatasetDirs& dirs, const v1::JobSpec& spec) {
  ASSIGN_OR_RETURN(std::string dir, DirectoryOf(dirs, spec));
  return wire::ToDataSource(spec, std::move(dir));
}

}  // namespace

Status AddDatasetFlag(const std::string& flag, DatasetDirs* dirs) {
  const size_t eq = flag.find('=');
  const std::string name = eq == std::string::npos ? flag : flag.substr(0, eq);
  if (eq == std::string::npos || eq + 1 == flag.size() || !wire::IsDatasetName(name) || name == "fashion-mnist") {
    return InvalidArgumentError("--dataset: expected NAME=DIR with NAME 1 to 64 of [a-z0-9._-] (fashion-mnist has "
                                "--data-dir), got \"" + EscapeUntrusted(flag.substr(0, 200)) + "\"");
  }
  if (dirs->by_name.count(name)) return InvalidArgumentError("--dataset: " + name + " is given twice");
  const std::string dir = flag.substr(eq + 1);
  RETURN_IF_ERROR(CheckDirectory("--dataset " + name + "=" + QuoteUntrusted(dir, 256), dir));
  dirs->by_name.emplace(name, dir);
  return Status::Ok();
}

Status InferInputShape(const DatasetDirs& dirs, v1::JobSpec* spec) {
  v1::InputShape* shape = spec->mutable_data()->mutable_input_shape();
  if (wire::IsFashionMnist(*spec)) {
    shape->set_channels(1);
    shape->set_rows(28);
    shape->set_cols(28);
    shape->set_classes(10);
    return Status::Ok();
  }
  const std::string what = "data.dataset \"" + spec->data().dataset() + "\"";
  ASSIGN_OR_RETURN(DataSource source, SourceOf(dirs, *spec));
  auto test = InspectSplit(source, /*train=*/false);
  if (!test.ok()) return test.status().WithContext(what + ": the coordinator's test split");
  uint32_t classes = spec->data().classes();
  const uint32_t seen = static_cast<uint32_t>(test->max_label + 1);
  if (classes == 0) {
    classes = seen;
    if (classes < 2) {
      return InvalidArgumentError(what + ": its test split holds a single class; set data.classes");
    }
  } else if (classes < seen) {
    return InvalidArgumentError(what + ": data.classes is " + std::to_string(classes) + " but the test split has label " +
                                std::to_string(test->max_label));
  }
  shape->set_channels(static_cast<uint32_t>(test->channels));
  shape->set_rows(static_cast<uint32_t>(test->rows));
  shape->set_cols(static_cast<uint32_t>(test->cols));
  shape->set_classes(classes);
  return Status::Ok();
}

Result<Dataset> LoadTestSplit(const DatasetDirs& dirs, const v1::JobSpec& spec) {
  const uint32_t max = spec.data().max_test_samples();
  if (wire::IsFashionMnist(spec)) {
    // Only the images evaluated are kept (31 MB for the whole split as floats); 0: all.
    ASSIGN_OR_RETURN(IdxPairPaths paths, FindFashionMnist(dirs.fashion_mnist, /*train=*/false));
    return LoadIdxPairFirst(paths.images, paths.labels, max, 10, wire::FashionNormalisation(spec));
  }
  ASSIGN_OR_RETURN(DataSource source, SourceOf(dirs, spec));
  ASSIGN_OR_RETURN(DataShape shape, InspectSplit(source, /*train=*/false));
  const int64_t count = max > 0 ? std::min<int64_t>(max, shape.count) : shape.count;
  std::vector<int64_t> rows(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) rows[static_cast<size_t>(i)] = i;
  return LoadSplitRows(source, /*train=*/false, rows, wire::DatasetClasses(spec));
}

Result<std::vector<uint8_t>> LoadTrainingLabels(const DatasetDirs& dirs, const v1::JobSpec& spec) {
  if (wire::IsFashionMnist(spec)) {
    ASSIGN_OR_RETURN(IdxPairPaths paths, FindFashionMnist(dirs.fashion_mnist, /*train=*/true));
    return ReadIdxLabels(paths.labels);
  }
  ASSIGN_OR_RETURN(DataSource source, SourceOf(dirs, spec));
  return ReadSplitLabels(source, /*train=*/true);
}

}  // namespace tessera::server
