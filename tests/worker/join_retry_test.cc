// What the worker logs while its joins fail (worker/join_retry.h): a failed TLS handshake with a
// hint at the flags to check, and repeats rate-limited. The clock is given, not read.
#include "worker/join_retry.h"

#include <gtest/gtest.h>

namespace tessera::worker {
namespace {

using Clock = JoinRetryLog::Clock;

const Status kHandshake = UnavailableError(
    "join 127.0.0.1:7070: failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:7070: Ssl "
    "handshake failed: SSL_ERROR_SSL: error:0A000086:SSL routines::certificate verify failed");
const Status kRefused = UnavailableError(
    "join 127.0.0.1:7070: failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:7070: "
    "Connection refused");

TEST(JoinRetryLogTest, AFailedHandshakeComesWithAHintAtTheTlsFlags) {
  EXPECT_EQ(TlsHandshakeHint(kHandshake),
            "the TLS handshake with the coordinator failed, which trying again does not mend: check that --tls-ca (or "
            "ca.crt in --tls-dir) is the CA that issued the coordinator's certificate, and that the certificate "
            "names the host in --coordinator (or --tls-server-name)");
  EXPECT_EQ(TlsHandshakeHint(UnavailableError("join 127.0.0.1:7070: failed to connect to all addresses; last error: "
                                              "UNKNOWN: ipv4:127.0.0.1:7070: Peer name other.example is not in peer "
                                              "certificate")),
            TlsHandshakeHint(kHandshake));
  EXPECT_EQ(TlsHandshakeHint(kRefused), "");
  EXPECT_EQ(TlsHandshakeHint(PermissionDeniedError(kHandshake.message())), "") << "only an UNAVAILABLE join";
  JoinRetryLog log;
  auto line = log.Failed(kHandshake, 200, Clock::now());
  ASSERT_TRUE(line.has_value());
  EXPECT_EQ(*line, "could not join the coordinator: " + kHandshake.message() + " (" + TlsHandshakeHint(kHandshake) +
                       "); trying again in 200 ms");
}

TEST(JoinRetryLogTest, ARepeatedFailureIsSaidOncePerIntervalWithItsCount) {
  JoinRetryLog log;
  const Clock::time_point start{};  // the clock's own epoch: a process that started a moment ago
  ASSERT_TRUE(log.Failed(kRefused, 200, start).has_value());
  EXPECT_FALSE(log.Failed(kRefused, 400, start + std::chrono::seconds(1)).has_value());
  EXPECT_FALSE(log.Failed(kRefused, 800, start + std::chrono::seconds(59)).has_value());
  // The same kind of failure at another of the host's addresses is no change.
  const Status other_address = UnavailableError(
      "join localhost:7070: failed to connect to all addresses; last error: UNAVAILABLE: ipv6:[::1]:7070: "
      "Connection refused");
  EXPECT_FALSE(log.Failed(other_address, 1600, start + std::chrono::seconds(59)).has_value());
  auto again = log.Failed(kRefused, 5000, start + JoinRetryLog::kRepeatEvery);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, "could not join the coordinator: " + kRefused.message() +
                        "; trying again in 5000 ms (3 more tries failed the same way since this was last said)");
  // Another failure is said at once, and so is the first after a join.
  const Clock::time_point later = start + JoinRetryLog::kRepeatEvery + std::chrono::seconds(1);
  auto changed = log.Failed(kHandshake, 5000, later);
  ASSERT_TRUE(changed.has_value());
  EXPECT_EQ(changed->find("more tries"), std::string::npos) << *changed;
  EXPECT_FALSE(log.Failed(kHandshake, 5000, later).has_value());
  log.Joined();
  EXPECT_TRUE(log.Failed(kHandshake, 200, later).has_value());
}

}  // namespace
}  // namespace tessera::worker
