#include "proto/json.h"

#include <google/protobuf/util/json_util.h>

#include "base/escape.h"

namespace tessera::wire {

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  // Strings from a peer may hold C1 controls or characters that reorder text; printed to a
  // terminal (tessera --json), they are escapes, not text.
  return EscapeHiddenInJson(out);
}

}  // namespace tessera::wire
