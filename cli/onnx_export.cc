#include "cli/onnx_export.h"

#include <onnx/onnx_pb.h>

#include <bit>
#include <map>

#include "base/whole_file.h"

namespace tessera::cli {
namespace {

constexpr int64_t kOpset = 13;

void AddAttribute(onnx::NodeProto* node, const std::string& name, const std::vector<int64_t>& values) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t v : values) a->add_ints(v);
}

void AddIntAttribute(onnx::NodeProto* node, const std::string& name, int64_t value) {
  auto* a = node->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(value);
}

void SetTensorType(onnx::ValueInfoProto* value, const std::string& name, const std::vector<int64_t>& dims) {
  value->set_name(name);
  auto* tensor = value->mutable_type()->mutable_tensor_type();
  tensor->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = tensor->mutable_shape();
  shape->add_dim()->set_dim_param("batch");
  for (int64_t d : dims) shape->add_dim()->set_dim_value(d);
}

// A node computing op(inputs) into a fresh name "<prefix>.<op>"; returns that name.
std::string Node(onnx::GraphProto* graph, const std::string& prefix, const std::string& op,
                 std::initializer_list<std::string> inputs) {
  auto* node = graph->add_node();
  const std::string output = prefix + "." + op + std::to_string(graph->node_size());
  node->set_name(output);
  node->set_op_type(op);
  for (const std::string& input : inputs) node->add_input(input);
  node->add_output(output);
  return output;
}

// A Constant node (not an initializer: initializers are the model's parameters) whose output
// is named `prefix` + "." + `kind` + a number, returned in *output; the caller fills its value.
onnx::TensorProto* Constant(onnx::GraphProto* graph, const std::string& prefix, const std::string& kind,
                            std::string* output) {
  auto* node = graph->add_node();
  *output = prefix + "." + kind + std::to_string(graph->node_size());
  node->set_name(*output);
  node->set_op_type("Constant");
  node->add_output(*output);
  auto* attribute = node->add_attribute();
  attribute->set_name("value");
  attribute->set_type(onnx::AttributeProto::TENSOR);
  return attribute->mutable_t();
}

// A scalar float32 constant.
std::string Scalar(onnx::GraphProto* graph, const std::string& prefix, float value) {
  std::string output;
  auto* tensor = Constant(graph, prefix, "const", &output);
  tensor->set_data_type(onnx::TensorProto::FLOAT);
  tensor->add_float_data(value);
  return output;
}

// [batch, C, H, W] -> [batch, C * H * W] (NCHW order, as PyTorch's flatten).
std::string Flatten(onnx::GraphProto* graph, const std::string& prefix, const std::string& input) {
  const std::string output = Node(graph, prefix, "Flatten", {input});
  AddIntAttribute(graph->mutable_node(graph->node_size() - 1), "axis", 1);
  return output;
}

// [batch, F] -> [batch, F, 1, 1]: the model's activation {F, 1, 1}, as a layer that reads
// [N, C, H, W] (a convolution, a pool) takes it.
std::string Unflatten(onnx::GraphProto* graph, const std::string& prefix, const std::string& input) {
  std::string shape;
  auto* tensor = Constant(graph, prefix, "shape", &shape);
  tensor->set_data_type(onnx::TensorProto::INT64);
  tensor->add_dims(4);
  for (int64_t d : {0, -1, 1, 1}) tensor->add_int64_data(d);  // 0: the batch, as it is
  return Node(graph, prefix, "Reshape", {input, shape});
}

// Appends the nodes of `layers` to `graph`, reading `current` and leaving it at the last
// output; `flat` tracks whether it is [batch, features] rather than [batch, C, H, W]. The model
// holds both as one activation shape ({F, 1, 1} is F features), so a layer may follow either:
// each node is given the rank it takes.
Status EmitLayers(onnx::GraphProto* graph, const std::vector<LayerInfo>& layers, std::string& current, bool& flat,
                  int& index) {
  for (const LayerInfo& layer : layers) {
    std::map<std::string, int> attributes(layer.attributes.begin(), layer.attributes.end());
    if (layer.kind == "residual") {
      // Both paths read the block's input; an Add joins them (the identity when the shortcut is empty).
      std::string body = current, shortcut = current;
      bool body_flat = flat, shortcut_flat = flat;
      RETURN_IF_ERROR(EmitLayers(graph, layer.paths.at(0), body, body_flat, index));
      if (layer.paths.size() > 1 && !layer.paths[1].empty()) {
        RETURN_IF_ERROR(EmitLayers(graph, layer.paths[1], shortcut, shortcut_flat, index));
      }
      // Both of one rank: [N, F] + [N, F, 1, 1] would broadcast to [N, F, N, F].
      if (body_flat != shortcut_flat) {
        if (!body_flat) body = Flatten(graph, layer.name, body);
        if (!shortcut_flat) shortcut = Flatten(graph, layer.name, shortcut);
      }
      auto* add = graph->add_node();
      add->set_name(layer.name);
      add->set_op_type("Add");
      add->add_input(body);
      add->add_input(shortcut);
      current = "x" + std::to_string(++index);
      add->add_output(current);
      flat = body_flat || shortcut_flat;
      continue;
    }
    if (layer.kind == "gelu") {
      // Opset 13 has no Gelu: 0.5 x (1 + erf(x / sqrt(2))), the exact form the layer computes.
      const std::string& x = current;
      const std::string scaled = Node(graph, layer.name, "Div", {x, Scalar(graph, layer.name, 1.41421356f)});
      const std::string erf = Node(graph, layer.name, "Erf", {scaled});
      const std::string shifted = Node(graph, layer.name, "Add", {erf, Scalar(graph, layer.name, 1.0f)});
      const std::string product = Node(graph, layer.name, "Mul", {x, shifted});
      current = Node(graph, layer.name, "Mul", {product, Scalar(graph, layer.name, 0.5f)});
      continue;
    }
    if (layer.kind == "layer_norm") {
      // Opset 13 has no LayerNormalization: (x - mean) / sqrt(var + epsilon) * weight + bias over
      // every axis but the batch's, with the biased variance. Over [C, 1, 1] maps the weight and
      // bias are [C] (LayerNormLayer), which a [batch, C, 1, 1] node would broadcast to
      // [batch, C, 1, C]: such an input is flattened first.
      if (!flat && layer.output.height == 1 && layer.output.width == 1) {
        current = Flatten(graph, layer.name, current);
        flat = true;
      }
      std::vector<int64_t> axes = flat ? std::vector<int64_t>{1} : std::vector<int64_t>{1, 2, 3};
      auto reduce_mean = [&](const std::string& input) {
        const std::string output = Node(graph, layer.name, "ReduceMean", {input});
        auto* reduce = graph->mutable_node(graph->node_size() - 1);
        AddAttribute(reduce, "axes", axes);
        AddIntAttribute(reduce, "keepdims", 1);
        return output;
      };
      const std::string centred = Node(graph, layer.name, "Sub", {current, reduce_mean(current)});
      const std::string variance = reduce_mean(Node(graph, layer.name, "Mul", {centred, centred}));
      const float epsilon = std::bit_cast<float>(attributes.at("epsilon_bits"));
      const std::string deviation =
          Node(graph, layer.name, "Sqrt", {Node(graph, layer.name, "Add", {variance, Scalar(graph, layer.name, epsilon)})});
      const std::string normalised = Node(graph, layer.name, "Div", {centred, deviation});
      current = Node(graph, layer.name, "Add",
                     {Node(graph, layer.name, "Mul", {normalised, layer.name + ".weight"}), layer.name + ".bias"});
      continue;
    }
    if (flat && (layer.kind == "conv2d" || layer.kind == "max_pool" || layer.kind == "avg_pool" ||
                 layer.kind == "global_avg_pool")) {
      current = Unflatten(graph, layer.name, current);
      flat = false;
    }
    const std::string output = "x" + std::to_string(++index);
    auto* node = graph->add_node();
    node->set_name(layer.name);
    if (layer.kind == "conv2d") {
      node->set_op_type("Conv");
      node->add_input(current);
      node->add_input(layer.name + ".weight");
      if (attributes["bias"] != 0) node->add_input(layer.name + ".bias");
      const int k = attributes["kernel"], s = attributes["stride"], p = attributes["padding"];
      AddAttribute(node, "kernel_shape", {k, k});
      AddAttribute(node, "strides", {s, s});
      AddAttribute(node, "pads", {p, p, p, p});
      if (attributes["groups"] > 1) AddIntAttribute(node, "group", attributes["groups"]);
    } else if (layer.kind == "relu" || layer.kind == "tanh" || layer.kind == "sigmoid") {
      node->set_op_type(layer.kind == "relu" ? "Relu" : layer.kind == "tanh" ? "Tanh" : "Sigmoid");
      node->add_input(current);
    } else if (layer.kind == "dropout") {
      node->set_op_type("Identity");  // the exported graph is the inference one
      node->add_input(current);
    } else if (layer.kind == "flatten") {
      node->set_op_type("Flatten");
      node->add_input(current);
      AddIntAttribute(node, "axis", 1);
      flat = true;
    } else if (layer.kind == "avg_pool") {
      node->set_op_type("AveragePool");
      node->add_input(current);
      AddAttribute(node, "kernel_shape", {attributes["window"], attributes["window"]});
      AddAttribute(node, "strides", {attributes["stride"], attributes["stride"]});
    } else if (layer.kind == "global_avg_pool") {
      node->set_op_type("GlobalAveragePool");  // [N, C, 1, 1]: a following linear flattens it
      node->add_input(current);
    } else if (layer.kind == "batch_norm") {
      node->set_op_type("BatchNormalization");  // inference: the running statistics
      node->add_input(current);
      for (const char* part : {".weight", ".bias", ".running_mean", ".running_var"}) node->add_input(layer.name + part);
      auto* epsilon = node->add_attribute();
      epsilon->set_name("epsilon");
      epsilon->set_type(onnx::AttributeProto::FLOAT);
      epsilon->set_f(std::bit_cast<float>(attributes.at("epsilon_bits")));
    } else if (layer.kind == "max_pool") {
      node->set_op_type("MaxPool");
      node->add_input(current);
      AddAttribute(node, "kernel_shape", {attributes["window"], attributes["window"]});
      AddAttribute(node, "strides", {attributes["stride"], attributes["stride"]});
    } else if (layer.kind == "linear") {
      if (!flat) {
        // A fully connected layer reads its input flattened (NCHW order, as PyTorch's flatten).
        node->set_op_type("Flatten");
        node->set_name(layer.name + ".flatten");
        node->add_input(current);
        AddIntAttribute(node, "axis", 1);
        const std::string flattened = output + ".flat";
        node->add_output(flattened);
        current = flattened;
        flat = true;
        node = graph->add_node();
        node->set_name(layer.name);
      }
      node->set_op_type("Gemm");
      node->add_input(current);
      node->add_input(layer.name + ".weight");
      node->add_input(layer.name + ".bias");
      AddIntAttribute(node, "transB", 1);
    } else {
      return UnimplementedError("ONNX export: layer '" + layer.name + "' (" + layer.kind + ") has no ONNX form here");
    }
    node->add_output(output);
    current = output;
  }
  return Status::Ok();
}

}  // namespace

Status WriteOnnx(const Model& model, const std::string& graph_name, const std::string& path) {
  onnx::ModelProto proto;
  proto.set_ir_version(onnx::IR_VERSION_2020_5_8);  // IR 7, what opset 13 needs
  proto.set_producer_name("tessera");
  proto.set_model_version(1);
  auto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(kOpset);
  auto* graph = proto.mutable_graph();
  graph->set_name(graph_name);
  const ActivationShape& in = model.input_shape();
  SetTensorType(graph->add_input(), "input", {in.channels, in.height, in.width});

  ASSIGN_OR_RETURN(const TensorSet state, model.GetState());
  for (const NamedTensor& t : state) {
    auto* init = graph->add_initializer();
    init->set_name(t.name);
    init->set_data_type(onnx::TensorProto::FLOAT);
    for (int64_t d : t.shape) init->add_dims(d);
    init->set_raw_data(std::string(reinterpret_cast<const char*>(t.values.data()), t.ByteSize()));
  }

  std::string current = "input";
  bool flat = false;
  int index = 0;
  RETURN_IF_ERROR(EmitLayers(graph, model.DescribeLayers(1), current, flat, index));
  // A model may end at [N, classes, 1, 1] (a convolution and a global average pool): the
  // logits are [batch, classes] all the same.
  if (!flat) current = Flatten(graph, "logits", current);
  // The last node's output is the graph's: rename it "logits".
  auto* last = graph->mutable_node(graph->node_size() - 1);
  last->set_output(0, "logits");
  SetTensorType(graph->add_output(), "logits", {model.classes()});

  // Serialised whole first, then written whole or not at all (base/whole_file.h).
  std::string bytes;
  if (!proto.SerializeToString(&bytes)) return InternalError("ONNX export: the graph does not serialise");
  return WriteFileWhole(path, bytes);
}

}  // namespace tessera::cli
