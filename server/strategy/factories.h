// The strategies that live in their own files, for CreateStrategy (strategy.cc). The spec has
// been validated (wire::ValidateJobSpec); `layout` is the model's, `buffers` the names of its
// buffers (CreateStrategy's), which both take by FedAvg's sample-weighted mean of the deltas.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "server/strategy/strategy.h"
#include "tessera/v1/job.pb.h"

namespace tessera::server {

// server/strategy/fednova.cc
Result<std::unique_ptr<Strategy>> CreateFedNova(const v1::JobSpec& spec, const TensorSet& layout,
                                                const std::vector<std::string>& buffers);
// server/strategy/scaffold.cc
Result<std::unique_ptr<Strategy>> CreateScaffold(const v1::JobSpec& spec, const TensorSet& layout,
                                                 const std::vector<std::string>& buffers);

}  // namespace tessera::server
