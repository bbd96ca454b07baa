#include "server/jobs/evaluation.h"

#include "core/data/idx.h"
#include "core/train/trainer.h"
#include "device/cpu/factory.h"
#include "device/registry.h"
#include "proto/job_mapping.h"

namespace tessera::server {

Result<std::unique_ptr<Evaluator>> Evaluator::Create(const v1::JobSpec& spec, const DatasetDirs& datasets,
                                                     const std::string& what, int threads,
                                                     const std::string& device) {
  std::unique_ptr<Evaluator> e(new Evaluator());
  if (device == "cpu") {
    e->device_ = CreateCpuDevice(CpuDeviceOptions{.num_threads = threads});
  } else {
    auto made = CreateDevice(device);
    if (!made.ok()) return made.status().WithContext(what + ": the evaluation device");
    e->device_ = std::move(made).value();
  }
  ASSIGN_OR_RETURN(e->model_, CreateModel(wire::ToModelConfig(spec), e->device_.get()));
  auto test = LoadTestSplit(datasets, spec);
  if (!test.ok()) return test.status().WithContext(what + ": loading the evaluation set");
  e->test_set_ = std::move(test).value();
  e->max_test_samples_ = spec.data().max_test_samples();
  return e;
}

Status Evaluator::CheckFits(const TensorSet& state) { return model_->SetState(state); }

Result<Evaluation> Evaluator::Evaluate(const TensorSet& state) {
  RETURN_IF_ERROR(model_->SetState(state));
  ASSIGN_OR_RETURN(EvalReport report, tessera::Evaluate(*model_, test_set_, 500, max_test_samples_));
  // The batches' activations go back between rounds: the round's uploads need the memory more
  // than the next evaluation needs them cached.
  device_->ReleaseCachedMemory();
  return Evaluation{report.accuracy, report.loss};
}

}  // namespace tessera::server
