// HOST:PORT flags: what is accepted, and what a user who mistypes one is told.
#include "base/host_port.h"

#include <gtest/gtest.h>

namespace tessera {
namespace {

TEST(HostPortTest, AcceptsNamesIpv4AndBracketedIpv6) {
  auto a = ParseHostPort("--listen", "127.0.0.1:7070", PortZero::kAllowed);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 7070);
  auto b = ParseHostPort("--coordinator", "coordinator.example.org:65535", PortZero::kRefused);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(b->host, "coordinator.example.org");
  auto c = ParseHostPort("--listen", "[::1]:1", PortZero::kAllowed);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->ToString(), "[::1]:1");
  auto zero = ParseHostPort("--listen", "127.0.0.1:0", PortZero::kAllowed);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero->port, 0);
}

void ExpectRefused(const std::string& flag, const std::string& text, PortZero zero, const std::string& says) {
  auto parsed = ParseHostPort(flag, text, zero);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parsed.status().message().rfind(flag + " ", 0), 0u) << parsed.status().message();
  EXPECT_NE(parsed.status().message().find(says), std::string::npos) << parsed.status().message();
}

TEST(HostPortTest, AHostWithoutAPortIsRefused) {
  ExpectRefused("--listen", "localhost", PortZero::kAllowed, "'localhost': the port is missing; expected HOST:PORT");
  ExpectRefused("--listen", "localhost:", PortZero::kAllowed, "the port is missing");
  ExpectRefused("--listen", "[::1]", PortZero::kAllowed, "the port is missing");
  ExpectRefused("--listen", ":7070", PortZero::kAllowed, "the host is missing");
}

TEST(HostPortTest, APortOutOfRangeIsRefusedNotWrapped) {
  ExpectRefused("--listen", "127.0.0.1:99999", PortZero::kAllowed,
                "'127.0.0.1:99999': port 99999 is out of range (expected 1 to 65535, or 0 to pick a free port)");
  ExpectRefused("--listen", "127.0.0.1:4294967297", PortZero::kAllowed, "is out of range");
  ExpectRefused("--coordinator", "127.0.0.1:0", PortZero::kRefused, "port 0 is out of range (expected 1 to 65535)");
  ExpectRefused("--listen", "127.0.0.1:-1", PortZero::kAllowed, "the port '-1' is not a number");
  ExpectRefused("--listen", "127.0.0.1:70x", PortZero::kAllowed, "is not a number");
}

TEST(HostPortTest, MalformedHostsAreRefused) {
  ExpectRefused("--listen", "::1:7070", PortZero::kAllowed, "an IPv6 address must be in brackets");
  ExpectRefused("--listen", "[not-ipv6]:7070", PortZero::kAllowed, "not an IPv6 address");
  ExpectRefused("--listen", "host name:7070", PortZero::kAllowed, "not a DNS name or an IPv4 address");
  ExpectRefused("--coordinator", "dns:///host:7070", PortZero::kRefused, "HOST:PORT");
  // A hostile value is echoed escaped and bounded.
  auto parsed = ParseHostPort("--listen", "evil\n" + std::string(1000, 'x'), PortZero::kAllowed);
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message().find('\n'), std::string::npos);
  EXPECT_LT(parsed.status().message().size(), 300u) << parsed.status().message();
}

TEST(HostPortTest, LoopbackHosts) {
  EXPECT_TRUE(IsLoopbackHost("127.0.0.1"));
  EXPECT_TRUE(IsLoopbackHost("127.1.2.3"));
  EXPECT_TRUE(IsLoopbackHost("localhost"));
  EXPECT_TRUE(IsLoopbackHost("::1"));
  EXPECT_FALSE(IsLoopbackHost("0.0.0.0"));
  EXPECT_FALSE(IsLoopbackHost("10.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("128.0.0.1"));
  EXPECT_FALSE(IsLoopbackHost("example.org"));
  EXPECT_FALSE(IsLoopbackHost("::"));
}

}  // namespace
}  // namespace tessera
