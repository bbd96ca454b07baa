// A peer's gRPC status read back (proto/grpc_status.h): the code kept, the message shown as
// one bounded line when it holds what could forge a log line, unchanged otherwise.
#include "proto/grpc_status.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::wire {
namespace {

TEST(GrpcStatusTest, AnHonestMessageComesThroughUnchangedWithItsCode) {
  const std::string said = "join: field 'name' 'w\\n1': expected letters, digits, '-', '_' or '.' (\xe2\x80\xa6)";
  const Status s = FromGrpc(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, said), "join 127.0.0.1:7070");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "join 127.0.0.1:7070: " + said);
}

TEST(GrpcStatusTest, AMessageThatAlreadyNamesTheCallIsNotPrefixedTwice) {
  const std::string said = "forget worker 'w1': it is alive; stop it first";
  const Status s = FromGrpc(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, said), "forget worker 'w1'");
  EXPECT_EQ(s.message(), said);
  // Only a whole prefix counts: another worker's name is still named.
  const Status other = FromGrpc(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, said), "forget worker 'w'");
  EXPECT_EQ(other.message(), "forget worker 'w': " + said);
}

TEST(GrpcStatusTest, AMessageThatCouldForgeALogLineIsEscapedAndALongOneCut) {
  const Status forged =
      FromGrpc(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone\n[2026-01-01 00:00:00] [info] all is well\x1b[2J"));
  EXPECT_EQ(forged.code(), StatusCode::kUnavailable);
  EXPECT_EQ(forged.message().find('\n'), std::string::npos) << forged.message();
  EXPECT_EQ(forged.message().find('\x1b'), std::string::npos) << forged.message();
  EXPECT_NE(forged.message().find("gone\\n[2026-01-01"), std::string::npos) << forged.message();
  const Status huge = FromGrpc(grpc::Status(grpc::StatusCode::INTERNAL, std::string(1 << 20, 'x')));
  EXPECT_LT(huge.message().size(), kMaxPeerMessageChars + 64) << "a megabyte from the peer was kept whole";
  EXPECT_NE(huge.message().find("(1048576 bytes)"), std::string::npos) << huge.message().substr(4000);
}

}  // namespace
}  // namespace tessera::wire
