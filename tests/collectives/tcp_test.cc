// The TCP helpers and the p2p rendezvous against peers that misbehave at the TCP level: a
// listener whose accept queue is full (connect must honour its deadline, not the kernel's
// minutes of SYN retries), connections that never say hello, and ports that are not numbers.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "collectives/p2p/tcp_mesh.h"
#include "collectives/store/hash_store.h"
#include "collectives/tcp_socket.h"

namespace tessera::collectives {
namespace {

using std::chrono::milliseconds;

// A nonblocking connect to 127.0.0.1:port that is left to the kernel (the SYN may be dropped).
TcpSocket StartConnecting(int port) {
  TcpSocket socket(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  (void)::connect(socket.fd(), reinterpret_cast<const sockaddr*>(&address), sizeof(address));
  return socket;
}

TEST(ConnectTcpTest, AListenerThatNeverAcceptsIsDeadlineExceededAtTheDeadline) {
  // Backlog 0: the kernel queues one connection and drops the SYNs of the rest, so a connect
  // to it stays in the handshake, which a blocking connect waits out for minutes.
  auto listening = ListenTcp("127.0.0.1", 0, 0);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  const int port = listening->second;
  std::vector<TcpSocket> filling;
  for (int i = 0; i < 3; ++i) filling.push_back(StartConnecting(port));

  // The call runs on a thread of its own so that a hang fails the test instead of stalling it.
  auto result = std::make_shared<std::promise<Status>>();
  std::future<Status> connected = result->get_future();
  std::thread([result, port] {
    auto socket = ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + milliseconds(300),
                             "a listener that never accepts");
    result->set_value(socket.ok() ? Status::Ok() : socket.status());
  }).detach();
  ASSERT_EQ(connected.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "ConnectTcp did not return long after its deadline";
  const Status status = connected.get();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded) << status.ToString();
  EXPECT_NE(status.message().find("a listener that never accepts"), std::string::npos) << status.ToString();
}

TEST(ConnectTcpTest, ARefusedConnectionIsRetriedUntilTheDeadline) {
  int port = 0;
  {
    auto listening = ListenTcp("127.0.0.1", 0, 1);
    ASSERT_TRUE(listening.ok()) << listening.status().ToString();
    port = listening->second;
  }  // closed: connections to the port are refused
  auto socket = ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + milliseconds(200), "nobody");
  ASSERT_FALSE(socket.ok());
  EXPECT_EQ(socket.status().code(), StatusCode::kDeadlineExceeded) << socket.status().ToString();
  EXPECT_NE(socket.status().message().find("refused"), std::string::npos) << socket.status().ToString();
}

TEST(ConnectTcpTest, AConnectedSocketIsBlockingAndCarriesBytes) {
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto client = ConnectTcp("127.0.0.1", listening->second, deadline, "the test listener");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto server = AcceptTcp(listening->first, deadline);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const char hello[] = "hello";
  ASSERT_TRUE(client->SendAll(hello, sizeof(hello), deadline, "server").ok());
  char got[sizeof(hello)] = {};
  ASSERT_TRUE(server->RecvAll(got, sizeof(got), deadline, "client").ok());
  EXPECT_STREQ(got, hello);
}

TEST(ParseHostPortTest, APortThatIsNotANumberInRangeIsInvalid) {
  for (const char* text : {"host:12abc", "host:70000", "host:-1", "host: 80", "host:"}) {
    auto parsed = ParseHostPort(text);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << text;
  }
  auto parsed = ParseHostPort("[::1]:8080");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  EXPECT_EQ(parsed->first, "::1");
  EXPECT_EQ(parsed->second, 8080);
}

// A rank's address comes from the store, which anyone who reaches it may write: an error that
// quotes it shows it escaped and bounded, whether it is not host:port or does not resolve.
TEST(TcpMeshTest, AnAddressFromTheStoreIsQuotedEscapedAndBoundedInErrors) {
  const std::string huge(100000, 'a');
  for (const std::string& address : {"\x1b[2J" + huge + ":port", "\x1b[2J" + huge + ":1"}) {
    HashStore store;
    ASSERT_TRUE(store.Set("p2p/addr/0", address).ok());
    TcpMeshOptions options;
    options.rank = 1;
    options.size = 2;
    options.connect_timeout = milliseconds(200);
    auto mesh = TcpMesh::Connect(options, store);
    ASSERT_FALSE(mesh.ok());
    const std::string& message = mesh.status().message();
    EXPECT_LT(message.size(), 2000u) << message.substr(0, 300);
    EXPECT_EQ(message.find('\x1b'), std::string::npos) << message.substr(0, 300);
    EXPECT_NE(message.find("\\x1b[2Jaaaa"), std::string::npos) << message.substr(0, 300);
  }
}

// The hello carries the cohort in at most 4096 bytes; a longer one is refused at once rather
// than sent to peers that drop it as a stranger's.
TEST(TcpMeshTest, ACohortOverTheHelloLimitIsRefusedBeforeConnecting) {
  HashStore store;
  TcpMeshOptions options;
  options.size = 2;
  options.cohort = std::string(4097, 'c');
  options.connect_timeout = milliseconds(1000);
  auto mesh = TcpMesh::Connect(options, store);
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kInvalidArgument) << mesh.status().ToString();
  EXPECT_NE(mesh.status().message().find("4097 bytes, over the limit of 4096"), std::string::npos)
      << mesh.status().ToString();
  options.cohort = std::string(4096, 'c');
  options.size = 1;
  EXPECT_TRUE(TcpMesh::Connect(options, store).ok());
}

TEST(TcpMeshTest, ConnectionsThatNeverFinishAHelloDoNotHoldUpTheRendezvous) {
  auto store = std::make_shared<HashStore>();
  TcpMeshOptions options;
  options.size = 2;
  options.connect_timeout = milliseconds(30000);
  options.hello_timeout = milliseconds(500);
  Status rank0_status;
  std::thread rank0([&] {
    TcpMeshOptions mine = options;
    mine.rank = 0;
    auto mesh = TcpMesh::Connect(mine, *store);
    rank0_status = mesh.ok() ? Status::Ok() : mesh.status();
  });
  // Before rank 1 starts: one connection to rank 0 that stays silent and one that sends half
  // a hello. Rank 0 accepts them first (the accept queue is in order) and must move on.
  auto address = store->Get("p2p/addr/0", milliseconds(30000));
  ASSERT_TRUE(address.ok()) << address.status().ToString();
  auto host_port = ParseHostPort(*address);
  ASSERT_TRUE(host_port.ok()) << host_port.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto silent = ConnectTcp(host_port->first, host_port->second, deadline, "rank 0");
  ASSERT_TRUE(silent.ok()) << silent.status().ToString();
  auto partial = ConnectTcp(host_port->first, host_port->second, deadline, "rank 0");
  ASSERT_TRUE(partial.ok()) << partial.status().ToString();
  const uint32_t half_a_hello[2] = {0x4f4c4548, 1};
  ASSERT_TRUE(partial->SendAll(half_a_hello, sizeof(half_a_hello), deadline, "rank 0").ok());

  TcpMeshOptions mine = options;
  mine.rank = 1;
  auto mesh = TcpMesh::Connect(mine, *store);
  rank0.join();
  EXPECT_TRUE(mesh.ok()) << mesh.status().ToString();
  EXPECT_TRUE(rank0_status.ok()) << rank0_status.ToString();
}

}  // namespace
}  // namespace tessera::collectives
