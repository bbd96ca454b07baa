// The coordinator's own evaluation of a job's global model: the job's model on a device of the
// coordinator's, and the test split of the job's dataset. Also the source of the job's initial
// model (the model's own initialisation from the job's seed).
//
// The device is the operator's choice (tessera-coordinator --eval-device): the CPU by default,
// or a GPU beside the coordinator. Federated evaluation on the workers is elsewhere
// (the job's [evaluation]). Not thread-safe: the job's thread owns it.
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
  // Builds the job's model on `device` (a registry name; "cpu" with `threads` OpenBLAS
  // threads, 0: OpenBLAS's default) and loads the test split from `datasets`, the operator's
  // dataset directory (never the spec's data.path, which is the workers'); `what` names the
  // job in errors. The initial model is the same on every device: the model draws it on the
  // host from the spec's seed.
  static Result<std::unique_ptr<Evaluator>> Create(const v1::JobSpec& spec, const DatasetDirs& datasets,
                                                   const std::string& what, int threads = 1,
                                                   const std::string& device = "cpu");
  // The name of the device it evaluates on ("cpu (OpenBLAS, 1 threads)", "NVIDIA H200 #0").
  const std::string& DeviceName() const { return device_->capabilities().name; }

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
  // The names of the model's tensors whose values may not be negative (a batch norm's running
  // variance): what Evaluate refuses a state for, and an update is refused for taking below 0.
  std::vector<std::string> NonNegativeNames() const {
    std::vector<std::string> names;
    for (const auto& view : model_->parameter_views()) {
      if (view.non_negative) names.push_back(view.name);
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
