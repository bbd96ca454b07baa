// A job's model made a declared one from a table of layers, for tests that need a layer no
// named model has (a batch norm): model.name "declared", no hidden widths, the layers in order.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "tessera/v1/job.pb.h"

namespace tessera::testing {

struct DeclaredLayer {
  const char* type;
  const char* name = "";
  uint32_t out = 0;
  std::optional<double> momentum = std::nullopt;  // a batch norm's; unset: the layer's default
};

inline void SetDeclaredLayers(v1::ModelSpec* model, std::initializer_list<DeclaredLayer> layers) {
  model->set_name("declared");
  model->clear_hidden();
  model->clear_layers();
  for (const DeclaredLayer& declared : layers) {
    v1::LayerSpec* layer = model->add_layers();
    layer->set_type(declared.type);
    layer->set_name(declared.name);
    layer->set_out(declared.out);
    if (declared.momentum) layer->set_momentum(*declared.momentum);
  }
}

}  // namespace tessera::testing
