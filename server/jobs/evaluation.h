// The coordinator's own evaluation of a job's global model: the job's model on a device of the
// coordinator's, and the test split of the job's dataset. Also the source of the job's initial
// model (the model's own initialisation from the job's seed).
//
// Today: the CPU and Fashion-MNIST's test split. Other devices, datasets and federated
// evaluation on the workers slot in here. Not thread-safe: the job's thread owns it.
#pragma once

#include <memory>

#include "base/status.h"
#include "core/data/dataset.h"
#include "core/model/model.h"
#include "core/tensor.h"
#include "device/device.h"
#include "server/jobs/datasets.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

struct Evaluation {
  double accuracy = 0;
  double loss = 0;
};

class Evaluator {
 public:
  // Builds the job's model on the CPU and loads the test split from `datasets`, the
  // operator's dataset directory (never the spec's data.path, which is the workers'); `what`
  // names the job in errors.
  // `threads`: OpenBLAS threads for the evaluation (0: OpenBLAS's default).
  static Result<std::unique_ptr<Evaluator>> Create(const v1::JobSpec& spec, const DatasetDirs& datasets,
                                                   const std::string& what, int threads = 1);

  // The model's initial state (from the spec's seed).
  Result<TensorSet> InitialModel() const { return model_->GetState(); }
  // The names of the model's buffers (running statistics), which no optimiser steps.
  std::vector<std::string> BufferNames() const {
    std::vector<std::string> names;
    for (const auto& view : model_->parameter_views()) {
      if (!view.trainable) names.push_back(view.name);
    }
    return names;
  }
  // Checks that `state` fits the job's model (names and shapes).
  Status CheckFits(const TensorSet& state);
  Result<Evaluation> Evaluate(const TensorSet& state);

 private:
  Evaluator() = default;

  std::unique_ptr<Device> device_;
  std::unique_ptr<tessera::Model> model_;
  Dataset test_set_;
  uint32_t max_test_samples_ = 0;
};

}  // namespace tessera::server
