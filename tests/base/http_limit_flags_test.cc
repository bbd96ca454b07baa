// --metrics-max-connections and --metrics-max-connections-per-address (base/http_limit_flags.h):
// good values reach the HTTP endpoint's options, every bad one is refused naming the flag and
// what was expected, and a per-address limit of 1 given on the command line holds a second
// connection from 127.0.0.1 off while the first is open.
#include "base/http_limit_flags.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "base/http_endpoint.h"
#include "tests/base/raw_http_client.h"

namespace tessera {
namespace {

using namespace std::chrono_literals;

// A daemon's flags as tessera-coordinator and tessera-worker declare them: --metrics-listen and
// the two limits.
struct MetricsFlags {
  FlagSet flags;
  std::string listen;
  HttpLimitFlags limits;
  MetricsFlags() {
    flags.String("metrics-listen", &listen, "");
    DeclareHttpLimitFlags(flags, "metrics", &limits);
  }
  // Parses `args` and checks the limits as the daemons do; on success, the endpoint's options.
  Status Parse(std::vector<std::string> args, HttpEndpointOptions* options = nullptr) {
    args.insert(args.begin(), "binary");
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    RETURN_IF_ERROR(flags.ParseFlagsOnly(static_cast<int>(argv.size()), argv.data()));
    RETURN_IF_ERROR(CheckHttpLimitFlags(flags, "metrics", limits));
    if (options != nullptr) ApplyHttpLimitFlags(limits, options);
    return Status::Ok();
  }
};

TEST(HttpLimitFlagsTest, UngivenTheEndpointsDefaultsStand) {
  MetricsFlags daemon;
  HttpEndpointOptions options;
  options.max_connections = 1;  // overwritten with the defaults
  options.max_connections_per_address = 1;
  ASSERT_TRUE(daemon.Parse({"--metrics-listen", "127.0.0.1:0"}, &options).ok());
  EXPECT_EQ(options.max_connections, HttpEndpointOptions{}.max_connections);
  EXPECT_EQ(options.max_connections_per_address, HttpEndpointOptions{}.max_connections_per_address);
  EXPECT_EQ(options.max_connections, 256);
  EXPECT_EQ(options.max_connections_per_address, 64);
}

TEST(HttpLimitFlagsTest, GoodValuesReachTheEndpointsOptions) {
  MetricsFlags daemon;
  HttpEndpointOptions options;
  Status s = daemon.Parse({"--metrics-listen=0.0.0.0:9464", "--metrics-max-connections=4096",
                           "--metrics-max-connections-per-address", "4096"},
                          &options);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(options.max_connections, 4096);
  EXPECT_EQ(options.max_connections_per_address, 4096);

  MetricsFlags small;
  ASSERT_TRUE(small.Parse({"--metrics-listen=127.0.0.1:0", "--metrics-max-connections=1",
                           "--metrics-max-connections-per-address=1"},
                          &options)
                  .ok());
  EXPECT_EQ(options.max_connections, 1);
  EXPECT_EQ(options.max_connections_per_address, 1);

  // The per-address limit alone, within the default total; and the bound itself.
  MetricsFlags per_address;
  ASSERT_TRUE(per_address.Parse({"--metrics-listen=127.0.0.1:0", "--metrics-max-connections-per-address=256"},
                                &options)
                  .ok());
  EXPECT_EQ(options.max_connections, 256);
  EXPECT_EQ(options.max_connections_per_address, 256);
  MetricsFlags largest;
  ASSERT_TRUE(largest.Parse({"--metrics-listen=127.0.0.1:0", "--metrics-max-connections=65536"}, &options).ok());
  EXPECT_EQ(options.max_connections, 65536);
  EXPECT_EQ(options.max_connections_per_address, 64);
}

TEST(HttpLimitFlagsTest, EachBadValueIsRefusedNamingTheFlagAndWhatWasExpected) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"--metrics-max-connections=many"}, "flag --metrics-max-connections: expected an integer, got 'many'"},
      {{"--metrics-max-connections=12k"}, "flag --metrics-max-connections: expected an integer, got '12k'"},
      {{"--metrics-max-connections=+8"}, "flag --metrics-max-connections: expected an integer, got '+8'"},
      {{"--metrics-max-connections=1e3"}, "flag --metrics-max-connections: expected an integer, got '1e3'"},
      {{"--metrics-max-connections=0"}, "flag --metrics-max-connections: expected 1 to 65536, got '0'"},
      {{"--metrics-max-connections=-5"}, "flag --metrics-max-connections: expected 1 to 65536, got '-5'"},
      {{"--metrics-max-connections=65537"}, "flag --metrics-max-connections: expected 1 to 65536, got '65537'"},
      {{"--metrics-max-connections=99999999999999999999"},
       "flag --metrics-max-connections: expected 1 to 65536, got '99999999999999999999'"},
      {{"--metrics-max-connections="}, "flag --metrics-max-connections: expected an integer, got ''"},
      {{"--metrics-max-connections-per-address=0"},
       "flag --metrics-max-connections-per-address: expected 1 to 65536, got '0'"},
      {{"--metrics-max-connections-per-address=one"},
       "flag --metrics-max-connections-per-address: expected an integer, got 'one'"},
      {{"--metrics-max-connections-per-address=70000"},
       "flag --metrics-max-connections-per-address: expected 1 to 65536, got '70000'"},
      // A typo is an unknown flag, never a default.
      {{"--metrics-max-conections=8"}, "unknown flag --metrics-max-conections (see --help)"},
      {{"--metrics-max-connections-per-adress=8"}, "unknown flag --metrics-max-connections-per-adress (see --help)"},
      {{"--metrics-max-connections=8", "--metrics-max-connections=9"},
       "flag --metrics-max-connections is given twice"},
      // The per-address limit is at most the total, given or its default.
      {{"--metrics-max-connections=8", "--metrics-max-connections-per-address=16"},
       "flag --metrics-max-connections-per-address: expected at most --metrics-max-connections (8), got 16"},
      {{"--metrics-max-connections=32"},
       "flag --metrics-max-connections: expected at least --metrics-max-connections-per-address (64, its default: "
       "lower it too), got 32"},
      {{"--metrics-max-connections-per-address=1000"},
       "flag --metrics-max-connections-per-address: expected at most --metrics-max-connections (256, its default: "
       "raise it too), got 1000"},
  };
  for (const Case& c : cases) {
    MetricsFlags daemon;
    std::vector<std::string> args = {"--metrics-listen=127.0.0.1:0"};
    args.insert(args.end(), c.args.begin(), c.args.end());
    HttpEndpointOptions options;
    const Status s = daemon.Parse(args, &options);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.args[0];
    EXPECT_EQ(s.message(), c.message) << c.args[0];
  }
}

// Without --metrics-listen nothing is served for the limits to bound: given alone, they are
// refused rather than ignored.
TEST(HttpLimitFlagsTest, ALimitWithoutTheListenFlagIsRefused) {
  MetricsFlags total;
  EXPECT_EQ(total.Parse({"--metrics-max-connections=512"}).message(),
            "flag --metrics-max-connections: expected only with --metrics-listen, which serves the port it bounds");
  MetricsFlags per_address;
  EXPECT_EQ(per_address.Parse({"--metrics-max-connections-per-address=8"}).message(),
            "flag --metrics-max-connections-per-address: expected only with --metrics-listen, which serves the port "
            "it bounds");
  MetricsFlags neither;
  EXPECT_TRUE(neither.Parse({}).ok());
}

TEST(HttpLimitFlagsTest, TheHelpListsBothWithTheirRangesAndDefaults) {
  MetricsFlags daemon;
  const std::string usage = daemon.flags.Usage();
  EXPECT_NE(usage.find("--metrics-max-connections VALUE"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(1 to 65536) (default: 256)"), std::string::npos) << usage;
  EXPECT_NE(usage.find("--metrics-max-connections-per-address VALUE"), std::string::npos) << usage;
  EXPECT_NE(usage.find("(1 to 65536) (default: 64)"), std::string::npos) << usage;
}

// A per-address limit of 1, given as a daemon is given it: while one connection from 127.0.0.1
// is open, a second from it is closed unserved; the first is still served.
TEST(HttpLimitFlagsTest, APerAddressLimitOfOneGivenByTheFlagHoldsASecondConnectionOff) {
  MetricsFlags daemon;
  auto options = MetricsOnly();
  ASSERT_TRUE(daemon.Parse({"--metrics-listen=127.0.0.1:0", "--metrics-max-connections-per-address=1"}, &options).ok());
  options.read_timeout = 600s;  // the first connection stays open for the whole test
  auto endpoint = HttpEndpoint::Start(std::move(options));
  ASSERT_TRUE(endpoint.ok()) << endpoint.status().ToString();
  const int port = (*endpoint)->port();

  RawClient first(port, 0, "127.0.0.1");
  ASSERT_TRUE(first.connected());
  RawClient second(port, 0, "127.0.0.1");
  ASSERT_TRUE(second.connected());  // the kernel accepts it into the backlog; the endpoint closes it
  second.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n");
  bool closed = false;
  EXPECT_EQ(second.ReadUntilClosed(60s, &closed), "") << "closed without an answer";
  EXPECT_TRUE(closed) << "a second connection from 127.0.0.1 was not closed";

  ASSERT_TRUE(first.Send("GET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n"));
  const std::string answer = first.ReadUntilClosed(60s);
  EXPECT_EQ(answer.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << answer;
}

}  // namespace
}  // namespace tessera
