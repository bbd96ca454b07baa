// Conversions between Tessera's Status and gRPC's, so errors keep their code and message
// across the wire.
#pragma once

#include <grpcpp/support/status.h>

#include "base/status.h"

namespace tessera::wire {

grpc::Status ToGrpc(const Status& status);
// The peer's message is untrusted: one holding a control byte or a character that hides or
// reorders text is shown escaped, and any is cut past kMaxPeerMessageChars characters. An
// honest Tessera peer escapes what it quotes itself, so its messages come through unchanged.
inline constexpr size_t kMaxPeerMessageChars = 4096;
Status FromGrpc(const grpc::Status& status, const std::string& context = "");

}  // namespace tessera::wire
