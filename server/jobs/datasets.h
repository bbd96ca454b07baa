// The operator's copies of the datasets jobs train on. The coordinator never opens a path a job
// spec names: Fashion-MNIST is read from --data-dir, any other dataset from the directory the
// operator gave it under its name (tessera-coordinator --dataset NAME=DIR). From that copy the
// coordinator infers a job's sample shape and classes when the job is submitted, evaluates each
// round's model on the test split, and reads the training labels to know each party's size.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/data/dataset.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

struct DatasetDirs {
  std::string fashion_mnist;                   // --data-dir
  std::map<std::string, std::string> by_name;  // --dataset NAME=DIR
};

// Parses one --dataset flag's NAME=DIR, DIR a directory that exists; InvalidArgument naming
// the flag otherwise.
Status AddDatasetFlag(const std::string& flag, DatasetDirs* dirs);

// Fills spec->data().input_shape() from the operator's copy of the job's dataset: the test
// split's sample shape, and data.classes or one more than the largest test label. Errors name
// the dataset and say what the operator must provide.
Status InferInputShape(const DatasetDirs& dirs, v1::JobSpec* spec);

// The job's test split (cut to data.max_test_samples when that is set) and its whole training
// split's labels, from the operator's copy.
Result<Dataset> LoadTestSplit(const DatasetDirs& dirs, const v1::JobSpec& spec);
Result<std::vector<uint8_t>> LoadTrainingLabels(const DatasetDirs& dirs, const v1::JobSpec& spec);

}  // namespace tessera::server
