// A message as the command line's --json and the dashboard's JSON show it: proto3's JSON
// mapping, field names as in the .proto files, every field present (zeros included), one line.
#pragma once

#include <google/protobuf/message.h>

#include <string>

namespace tessera::wire {

std::string ToJson(const google::protobuf::Message& message);

}  // namespace tessera::wire
