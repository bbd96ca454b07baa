// A native model as an ONNX file (opset 13): its layers as Conv, Relu, MaxPool, Flatten and
// Gemm nodes, its parameters as initializers named by their state_dict keys, one input
// "input" [batch, C, H, W] and one output "logits" [batch, classes] (the batch size symbolic).
// The file passes onnx.checker (tests/integration/export_test.cc checks it with python3-onnx).
#pragma once

#include <string>

#include "base/status.h"
#include "core/model/model.h"

namespace tessera::cli {

// Writes `model` (its current parameters) to `path`, atomically. Unimplemented naming the
// layer when a layer has no ONNX form here.
Status WriteOnnx(const Model& model, const std::string& graph_name, const std::string& path);

}  // namespace tessera::cli
