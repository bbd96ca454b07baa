// How ConnectTcp (and so TcpStore::Connect and the p2p mesh) finds a host's addresses: a
// numeric address is used as it is, and a name's lookup ends at the caller's deadline even
// when the resolver never answers. A stand-in resolver (SetHostResolverForTesting) plays the
// slow one; the real one is asked only for a name under ".invalid", which never resolves.
#include <gtest/gtest.h>
#include <netdb.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>

#include "collectives/benchmark.h"
#include "collectives/p2p/tcp_mesh.h"
#include "collectives/store/hash_store.h"
#include "collectives/store/tcp_store.h"
#include "collectives/tcp_socket.h"

namespace tessera::collectives {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Puts back getaddrinfo when a test ends, however it ends.
struct ResolverGuard {
  explicit ResolverGuard(HostResolver resolver) { SetHostResolverForTesting(resolver); }
  ~ResolverGuard() { SetHostResolverForTesting(nullptr); }
};

std::atomic<int> lookups{0};

int CountingResolver(const char*, const char*, const addrinfo*, addrinfo**) {
  ++lookups;
  return EAI_FAIL;
}

TEST(ResolveTest, ANumericAddressIsNotLookedUp) {
  ResolverGuard guard(&CountingResolver);
  lookups = 0;
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  const auto deadline = steady_clock::now() + std::chrono::seconds(30);
  auto client = ConnectTcp("127.0.0.1", listening->second, deadline, "the test listener");
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(lookups.load(), 0);
  // A name does go to the resolver, whose failure the error carries. The lookup is retried
  // until the deadline, as a refused connection is; the deadline leaves a loaded machine time
  // to run the lookup's thread at least once.
  auto named = ConnectTcp("tessera-test.invalid", listening->second,
                          steady_clock::now() + std::chrono::seconds(2), "the test listener");
  ASSERT_FALSE(named.ok());
  EXPECT_GE(lookups.load(), 1);
  EXPECT_NE(named.status().message().find("cannot resolve 'tessera-test.invalid': " +
                                          std::string(::gai_strerror(EAI_FAIL))),
            std::string::npos)
      << named.status().ToString();
}

// A resolver that answers only when the test lets it (or after a minute, so that a broken
// build fails instead of hanging), with the loopback address.
std::mutex stuck_mutex;
std::condition_variable stuck_changed;
bool stuck_released = false;    // guarded by stuck_mutex
bool stuck_returned = false;    // guarded by stuck_mutex

int StuckResolver(const char*, const char* service, const addrinfo* hints, addrinfo** found) {
  {
    std::unique_lock<std::mutex> lock(stuck_mutex);
    stuck_changed.wait_for(lock, std::chrono::minutes(1), [] { return stuck_released; });
  }
  const int rc = ::getaddrinfo("127.0.0.1", service, hints, found);
  std::lock_guard<std::mutex> lock(stuck_mutex);
  stuck_returned = true;
  stuck_changed.notify_all();
  return rc;
}

TEST(ResolveTest, ALookupThatDoesNotAnswerEndsAtTheDeadline) {
  ResolverGuard guard(&StuckResolver);
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    stuck_released = false;
    stuck_returned = false;
  }
  auto connected = ConnectTcp("slow.invalid", 1, steady_clock::now() + milliseconds(200),
                              "store server slow.invalid:1");
  bool returned_first = false;
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    returned_first = stuck_returned;
    stuck_released = true;
    stuck_changed.notify_all();
  }
  EXPECT_FALSE(returned_first) << "ConnectTcp waited for the resolver past its deadline";
  ASSERT_FALSE(connected.ok());
  EXPECT_EQ(connected.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(connected.status().message().find(
                "could not connect to store server slow.invalid:1 at slow.invalid:1 before the "
                "deadline (resolving 'slow.invalid' did not finish before the deadline"),
            std::string::npos)
      << connected.status().ToString();
  // The abandoned lookup ends on its own and frees its answer.
  std::unique_lock<std::mutex> lock(stuck_mutex);
  stuck_changed.wait(lock, [] { return stuck_returned; });
}

TEST(ResolveTest, AStoreAtANameThatDoesNotResolveFailsNamingIt) {
  auto store = TcpStore::Connect("tessera-no-such-host.invalid", 29500, milliseconds(300));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kDeadlineExceeded) << store.status().ToString();
  const std::string& message = store.status().message();
  EXPECT_NE(message.find("could not connect to store server tessera-no-such-host.invalid:29500"),
            std::string::npos)
      << message;
  // The real resolver's reason, or, if it did not answer in time, that it did not.
  EXPECT_TRUE(message.find("cannot resolve 'tessera-no-such-host.invalid': ") != std::string::npos ||
              message.find("resolving 'tessera-no-such-host.invalid' did not finish") !=
                  std::string::npos)
      << message;
}

// Listening: a numeric address is not looked up either, with a deadline or without.
TEST(ResolveTest, ANumericBindAddressIsNotLookedUp) {
  ResolverGuard guard(&CountingResolver);
  lookups = 0;
  for (const std::string address : {"127.0.0.1", "::1", ""}) {
    auto listening = ListenTcp(address, 0, 4, steady_clock::now() + std::chrono::seconds(30));
    // "::1" may be missing where IPv6 is off; the lookup is what is checked.
    if (address != "::1") EXPECT_TRUE(listening.ok()) << address << ": " << listening.status().ToString();
  }
  EXPECT_EQ(lookups.load(), 0);
}

// A p2p rank's bind address given as a name is looked up within the rendezvous' deadline:
// a resolver that does not answer ends the rendezvous at its connect_timeout, naming the
// address, instead of holding the round's training until it answers.
TEST(ResolveTest, ABindAddressLookupThatDoesNotAnswerEndsAtTheRendezvousDeadline) {
  ResolverGuard guard(&StuckResolver);
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    stuck_released = false;
    stuck_returned = false;
  }
  HashStore store;
  TcpMeshOptions options;
  options.rank = 0;
  options.size = 2;
  options.bind_address = "slow-cohort-host.invalid";
  options.connect_timeout = milliseconds(200);
  auto mesh = TcpMesh::Connect(options, store);
  bool returned_first = false;
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    returned_first = stuck_returned;
    stuck_released = true;
    stuck_changed.notify_all();
  }
  EXPECT_FALSE(returned_first) << "the rendezvous waited for the resolver past its deadline";
  ASSERT_FALSE(mesh.ok());
  EXPECT_EQ(mesh.status().code(), StatusCode::kDeadlineExceeded) << mesh.status().ToString();
  EXPECT_NE(mesh.status().message().find("bind address 'slow-cohort-host.invalid': resolving "
                                         "'slow-cohort-host.invalid' did not finish before the deadline"),
            std::string::npos)
      << mesh.status().ToString();
  std::unique_lock<std::mutex> lock(stuck_mutex);
  stuck_changed.wait(lock, [] { return stuck_returned; });
}

// A lookup cut off by its deadline goes on inside the resolver, holding whatever locks the
// resolver holds (the stand-in's stuck_mutex here, glibc's in a real process). Ranks forked
// then would get those locks held for good: the benchmark forks none until the lookup ends,
// and says why when it does not end in time. Once it has, ranks are forked, and their own
// lookups work.
TEST(ResolveTest, RanksAreNotForkedWhileALookupIsStillInTheResolver) {
  ResolverGuard guard(&StuckResolver);
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    stuck_released = false;
    stuck_returned = false;
  }
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  const int port = listening->second;
  auto cut_off = ConnectTcp("slow.invalid", port, steady_clock::now() + milliseconds(200),
                            "the test listener");
  ASSERT_FALSE(cut_off.ok());
  ASSERT_EQ(cut_off.status().code(), StatusCode::kDeadlineExceeded) << cut_off.status().ToString();

  // The resolver has not answered: nothing is forked.
  auto refused = ForkChildren(2, [](int) { ::_exit(0); }, ::fork, milliseconds(0));
  if (refused.ok()) (void)WaitForChildren(*refused);
  ASSERT_FALSE(refused.ok()) << "ranks were forked while a lookup was still in the resolver";
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(
                "not forking 2 ranks: 1 host-name lookup is still waiting for the name resolver"),
            std::string::npos)
      << refused.status().ToString();

  // Once it answers, ranks are forked (the wait covers the thread's last steps), and a rank
  // looks names up as this process does.
  {
    std::lock_guard<std::mutex> lock(stuck_mutex);
    stuck_released = true;
    stuck_changed.notify_all();
  }
  auto forked = ForkChildren(1, [port](int) {
    auto connected = ConnectTcp("slow.invalid", port,
                                steady_clock::now() + std::chrono::seconds(30), "the test listener");
    ::_exit(connected.ok() ? 0 : 3);
  }, ::fork, std::chrono::minutes(1));
  ASSERT_TRUE(forked.ok()) << forked.status().ToString();
  EXPECT_TRUE(WaitForChildren(*forked).empty());
}

}  // namespace
}  // namespace tessera::collectives
