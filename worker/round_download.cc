#include "worker/round_download.h"

#include <algorithm>

#include "core/model/model.h"
#include "proto/job_mapping.h"

namespace tessera::worker {

Result<uint64_t> DownloadBound(const v1::TrainTask& task, const std::string& what) {
  if (task.model_sets_size() > kMaxModelSets) {
    return InvalidArgumentError(what + ": the task names " + std::to_string(task.model_sets_size()) +
                                " model sets, expected at most " + std::to_string(kMaxModelSets));
  }
  auto parameters = CountParameters(wire::ToModelConfig(task.spec()));
  if (!parameters.ok()) return parameters.status().WithContext(what + ": the task's model");
  // The coordinator bounds a job's model when it has the data's shape (every job it runs has
  // it: it fills data.input_shape at submit). A task without it skipped that bound, and the
  // download's bound followed any model it named: hundreds of GiB, each allocated and zeroed as
  // the manifest declared it. The same bound holds here, with or without the shape.
  auto memory = wire::EstimateModelMemoryBytes(task.spec());
  if (!memory.ok()) return memory.status().WithContext(what + ": the task's model");
  if (*memory > wire::kMaxModelMemoryBytes) {
    return InvalidArgumentError(what + ": the task's model has " + std::to_string(*parameters) +
                                " parameters, an estimated " + std::to_string(*memory) +
                                " bytes at the coordinator, more than the " + std::to_string(wire::kMaxModelMemoryBytes) +
                                " bytes a job's model may take");
  }
  return static_cast<uint64_t>(*parameters) * sizeof(float) * static_cast<uint64_t>(1 + task.model_sets_size());
}

Result<std::map<std::string, TensorSet>> SplitDownload(TensorSet downloaded, const v1::TrainTask& task,
                                                       const std::string& what, TensorSet* model) {
  std::map<std::string, TensorSet> sets;
  for (NamedTensor& t : downloaded) {
    const auto set = std::find_if(task.model_sets().begin(), task.model_sets().end(),
                                  [&](const std::string& name) { return t.name.rfind(name + "/", 0) == 0; });
    if (set == task.model_sets().end()) {
      model->push_back(std::move(t));
    } else {
      t.name.erase(0, set->size() + 1);
      sets[*set].push_back(std::move(t));
    }
  }
  for (const std::string& name : task.model_sets()) {
    RETURN_IF_ERROR(CheckSameLayout(*model, sets[name], what + ": the download's set '" + name + "'"));
  }
  return sets;
}

}  // namespace tessera::worker
