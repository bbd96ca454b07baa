// Conversions between Tessera's Status and gRPC's, so errors keep their code and message
// across the wire.
#pragma once

#include <grpcpp/support/status.h>

#include "base/status.h"

namespace tessera::wire {

grpc::Status ToGrpc(const Status& status);
Status FromGrpc(const grpc::Status& status, const std::string& context = "");

}  // namespace tessera::wire
