// One suite for the Store interface, instantiated for HashStore, FileStore and TcpStore.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <thread>
#include <utility>

#include "collectives/store/file_store.h"
#include "collectives/store/hash_store.h"
#include "collectives/store/tcp_store.h"
#include "tests/address_space.h"

namespace tessera::collectives {
namespace {

using std::chrono::milliseconds;

class StoreTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "hash") {
      store_ = std::make_shared<HashStore>();
    } else if (GetParam() == "file") {
      directory_ = std::filesystem::temp_directory_path() /
                   ("tessera-store-test-" + std::to_string(::getpid()));
      auto store = FileStore::Open(directory_.string());
      ASSERT_TRUE(store.ok()) << store.status().ToString();
      store_ = *store;
    } else {
      auto server = TcpStoreServer::Start("127.0.0.1", 0);
      ASSERT_TRUE(server.ok()) << server.status().ToString();
      server_ = std::move(server).value();
      store_ = Client();
    }
  }
  void TearDown() override {
    store_.reset();
    server_.reset();
    if (!directory_.empty()) std::filesystem::remove_all(directory_);
  }
  // A second handle on the same store, as another rank would have.
  std::shared_ptr<Store> Client() {
    if (server_ == nullptr) return store_;
    auto client = TcpStore::Connect("127.0.0.1", server_->port(), milliseconds(5000));
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? std::shared_ptr<Store>(*client) : nullptr;
  }

  std::shared_ptr<Store> store_;
  std::unique_ptr<TcpStoreServer> server_;
  std::filesystem::path directory_;
};

TEST_P(StoreTest, SetThenGetReturnsTheValueIncludingBinaryBytes) {
  const std::string value("a/b\0c\xff", 6);
  ASSERT_TRUE(store_->Set("job/key 1", value).ok());
  auto got = Client()->Get("job/key 1", milliseconds(1000));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, value);
}

TEST_P(StoreTest, GetOfAMissingKeyTimesOutNamingTheKey) {
  auto got = store_->Get("never-set", milliseconds(50));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(got.status().message().find("never-set"), std::string::npos);
}

TEST_P(StoreTest, GetWaitsForALaterSet) {
  auto writer = Client();
  std::thread later([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(writer->Set("late", "here").ok());
  });
  auto got = store_->Get("late", milliseconds(10000));
  later.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "here");
  EXPECT_TRUE(store_->Wait({"late"}, milliseconds(100)).ok());
}

TEST_P(StoreTest, AddIsAtomicAcrossClients) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([this] {
      auto client = Client();
      for (int i = 0; i < 50; ++i) EXPECT_TRUE(client->Add("counter", 1).ok());
    });
  }
  for (auto& thread : threads) thread.join();
  auto total = store_->Add("counter", 0);
  ASSERT_TRUE(total.ok());
  EXPECT_EQ(*total, 200);
}

TEST_P(StoreTest, PrefixStoresDoNotCollideAndBarrierReleasesAll) {
  auto a = std::make_shared<PrefixStore>("a", store_);
  auto b = std::make_shared<PrefixStore>("b", store_);
  ASSERT_TRUE(a->Set("k", "1").ok());
  EXPECT_FALSE(b->Get("k", milliseconds(20)).ok());
  std::vector<std::thread> threads;
  std::vector<Status> results(3);
  for (int i = 0; i < 3; ++i) {
    threads.emplace_back([&, i] {
      results[i] = StoreBarrier(*std::make_shared<PrefixStore>("a", Client()), "barrier", 3,
                                milliseconds(10000));
    });
  }
  for (auto& thread : threads) thread.join();
  for (const Status& status : results) EXPECT_TRUE(status.ok()) << status.ToString();
}

TEST_P(StoreTest, AddToAValueThatIsNotACounterIsAnErrorAndKeepsTheValue) {
  ASSERT_TRUE(store_->Set("word", "12abc").ok());
  auto added = Client()->Add("word", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), StatusCode::kInvalidArgument) << added.status().ToString();
  EXPECT_NE(added.status().message().find("12abc"), std::string::npos) << added.status().ToString();
  auto kept = store_->Get("word", milliseconds(1000));
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, "12abc");
  auto counter = store_->Add("counter", 2);  // the store still serves
  ASSERT_TRUE(counter.ok()) << counter.status().ToString();
  EXPECT_EQ(*counter, 2);
}

TEST_P(StoreTest, AddPastInt64IsAnErrorAndKeepsTheCounter) {
  const int64_t largest = std::numeric_limits<int64_t>::max();
  ASSERT_TRUE(store_->Add("big", largest).ok());
  auto added = store_->Add("big", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_NE(added.status().message().find("overflows"), std::string::npos) << added.status().ToString();
  auto kept = store_->Add("big", 0);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_EQ(*kept, largest);
}

// A key comes from a job's configuration or a peer: every error that names one (a wait that
// times out, a counter that overflows or is not one, a barrier, a rendezvous's deadline) shows
// it escaped and bounded, so that it neither forges a log line nor drives a terminal.
TEST_P(StoreTest, ErrorsShowTheKeyEscapedAndBounded) {
  // Long, but within TcpStoreServer's default key limit.
  const std::string key = "rank\n0\x1b[31m" + std::string(3000, 'k');
  std::vector<Status> errors;
  errors.push_back(store_->Get(key, milliseconds(50)).status());
  ASSERT_TRUE(store_->Add(key, std::numeric_limits<int64_t>::max()).ok());
  errors.push_back(store_->Add(key, 1).status());
  ASSERT_TRUE(store_->Set(key, "not a counter").ok());
  errors.push_back(store_->Add(key, 1).status());
  DeadlineStore deadline(*store_, milliseconds(50), "rendezvous");
  errors.push_back(deadline.Get(key + "/missing", milliseconds(60000)).status());
  errors.push_back(StoreBarrier(*store_, key + "/barrier", 2, milliseconds(50)));
  for (const Status& error : errors) {
    ASSERT_FALSE(error.ok());
    // Escaped once, or twice where a TcpStoreServer's refusal, escaped there, is escaped again
    // by its client as text from the wire.
    EXPECT_NE(error.message().find("rank\\"), std::string::npos) << error.ToString().substr(0, 400);
    EXPECT_NE(error.message().find("\\x1b[31mkkk"), std::string::npos) << error.ToString().substr(0, 400);
    EXPECT_EQ(error.message().find_first_of("\n\x1b"), std::string::npos) << error.ToString().substr(0, 400);
    EXPECT_LT(error.message().size(), 1500u) << error.ToString().substr(0, 400);
  }
}

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("hash", "file", "tcp"));

// A request as a client that does not use TcpStore would send it (tcp_store.h's wire format).
std::string Request(uint8_t command, const std::string& key, const std::string& value) {
  std::string request(9, '\0');
  request[0] = static_cast<char>(command);
  const uint32_t key_bytes = static_cast<uint32_t>(key.size()), value_bytes = static_cast<uint32_t>(value.size());
  std::memcpy(request.data() + 1, &key_bytes, 4);
  std::memcpy(request.data() + 5, &value_bytes, 4);
  return request + key + value;
}

// Sends `request` and reads the answer: {code, value}.
Result<std::pair<uint8_t, std::string>> RoundTrip(TcpSocket& socket, const std::string& request) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  RETURN_IF_ERROR(socket.SendAll(request.data(), request.size(), deadline, "store server"));
  uint8_t response[5];
  RETURN_IF_ERROR(socket.RecvAll(response, sizeof(response), deadline, "store server"));
  uint32_t bytes;
  std::memcpy(&bytes, response + 1, 4);
  if (bytes > 4096) return DataLossError("an answer of " + std::to_string(bytes) + " bytes");
  std::string value(bytes, '\0');
  RETURN_IF_ERROR(socket.RecvAll(value.data(), value.size(), deadline, "store server"));
  return std::make_pair(response[0], value);
}

TEST(TcpStoreServerTest, AnAddOfANonNumericValueIsRefusedAndTheServerServesOn) {
  auto server = TcpStoreServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto raw = ConnectTcp("127.0.0.1", (*server)->port(),
                        std::chrono::steady_clock::now() + std::chrono::seconds(30), "store server");
  ASSERT_TRUE(raw.ok()) << raw.status().ToString();
  for (const char* delta : {"twelve", "", "99999999999999999999", "7 "}) {
    auto refused = RoundTrip(*raw, Request(3, "counter", delta));
    ASSERT_TRUE(refused.ok()) << delta << ": " << refused.status().ToString();
    EXPECT_EQ(refused->first, 2) << "delta '" << delta << "' answered " << refused->second;
  }
  // The same connection is still served, and the counter was never touched.
  auto added = RoundTrip(*raw, Request(3, "counter", "5"));
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(added->first, 0);
  EXPECT_EQ(added->second, "5");
  // And so is another client.
  auto client = TcpStore::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto total = (*client)->Add("counter", 1);
  ASSERT_TRUE(total.ok()) << total.status().ToString();
  EXPECT_EQ(*total, 6);
}

// Connects a raw client (no TcpStore) to `server`.
TcpSocket RawClient(const TcpStoreServer& server) {
  auto raw = ConnectTcp("127.0.0.1", server.port(),
                        std::chrono::steady_clock::now() + std::chrono::seconds(30), "store server");
  EXPECT_TRUE(raw.ok()) << raw.status().ToString();
  return raw.ok() ? std::move(raw).value() : TcpSocket();
}

// What a client waiting for an answer reads: OK if the server answered, UNAVAILABLE "closed
// the connection" if it dropped the connection, DEADLINE_EXCEEDED if it did neither (held the
// connection) within a generous bound.
Status ReadFromServer(TcpSocket& socket) {
  uint8_t byte;
  return socket.RecvAll(&byte, 1, std::chrono::steady_clock::now() + std::chrono::seconds(30),
                        "store server");
}

TEST(TcpStoreServerTest, APartialRequestIsDroppedAtTheRequestTimeout) {
  TcpStoreServerOptions options;
  options.request_timeout = milliseconds(100);
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string request = Request(1, "key-of-ten", "value");
  for (size_t sent : {size_t{1}, size_t{4}, size_t{9}, size_t{14}, request.size() - 1}) {
    TcpSocket raw = RawClient(**server);
    ASSERT_TRUE(raw.SendAll(request.data(), sent, std::chrono::steady_clock::now() + std::chrono::seconds(30),
                            "store server").ok());
    Status read = ReadFromServer(raw);
    EXPECT_EQ(read.code(), StatusCode::kUnavailable) << sent << " bytes sent: " << read.ToString();
    EXPECT_NE(read.message().find("closed the connection"), std::string::npos) << read.ToString();
  }
  // A whole request is served as before.
  TcpSocket raw = RawClient(**server);
  auto stored = RoundTrip(raw, request);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->first, 0);
}

TEST(TcpStoreServerTest, ASilentConnectionIsClosedAtTheIdleTimeoutWhenOneIsSet) {
  TcpStoreServerOptions options;
  options.idle_timeout = milliseconds(100);
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  TcpSocket silent = RawClient(**server);
  Status read = ReadFromServer(silent);
  EXPECT_EQ(read.code(), StatusCode::kUnavailable) << read.ToString();
  // One that sends a request in time is answered, and dropped only after its next silence.
  TcpSocket talking = RawClient(**server);
  auto stored = RoundTrip(talking, Request(1, "k", "v"));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(ReadFromServer(talking).code(), StatusCode::kUnavailable);
}

// Connections beyond max_connections are refused, naming the limit; a closed connection gives
// its slot back, however many come and go.
TEST(TcpStoreServerTest, ConnectionsBeyondTheLimitAreRefusedNamingItUntilOneCloses) {
  TcpStoreServerOptions options;
  options.max_connections = 2;
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::vector<TcpSocket> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(RawClient(**server));
    auto served = RoundTrip(held.back(), Request(1, "held", "1"));  // served: counted by now
    ASSERT_TRUE(served.ok()) << served.status().ToString();
  }
  auto refused = TcpStore::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(refused.ok()) << refused.status().ToString();  // the kernel accepts it
  Status set = (*refused)->Set("k", "v");
  EXPECT_EQ(set.code(), StatusCode::kResourceExhausted) << set.ToString();
  EXPECT_NE(set.message().find("limit of 2 open connections"), std::string::npos) << set.ToString();
  EXPECT_EQ((*refused)->Set("k", "v").code(), StatusCode::kUnavailable);  // and it stays closed
  // A raw client is told the same in the wire format: code 3 (busy) and the reason.
  TcpSocket raw = RawClient(**server);
  auto busy = RoundTrip(raw, Request(2, "k", ""));
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  EXPECT_EQ(busy->first, 3);
  EXPECT_NE(busy->second.find("limit of 2"), std::string::npos) << busy->second;

  // Each closed connection frees its slot: 20 clients one after another, with one slot left.
  held.pop_back();
  for (int i = 0; i < 20; ++i) {
    Status last;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    do {  // the server notices the previous close a moment after it
      auto client = TcpStore::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      last = (*client)->Set("k" + std::to_string(i), "v");
      if (last.code() != StatusCode::kResourceExhausted) break;
      std::this_thread::sleep_for(milliseconds(5));
    } while (std::chrono::steady_clock::now() < give_up);
    ASSERT_TRUE(last.ok()) << "client " << i << ": " << last.ToString();
  }
}

// A key or value over the server's limits is refused naming the limit, read off the stream
// without being kept: the same connection is served on.
TEST(TcpStoreServerTest, AKeyOrValueOverItsLimitIsRefusedNamingItAndTheConnectionGoesOn) {
  TcpStoreServerOptions options;
  options.max_key_bytes = 16;
  options.max_value_bytes = 64;
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  TcpSocket raw = RawClient(**server);
  struct Case {
    uint8_t command;
    std::string key, value, limit;
  };
  for (const Case& c : {Case{1, std::string(17, 'k'), "v", "max_key_bytes"},
                        Case{2, std::string(1 << 20, 'k'), "", "max_key_bytes"},
                        Case{1, "k", std::string(65, 'v'), "max_value_bytes"},
                        Case{3, "k", std::string(4 << 20, '1'), "max_value_bytes"}}) {
    auto refused = RoundTrip(raw, Request(c.command, c.key, c.value));
    ASSERT_TRUE(refused.ok()) << c.limit << ": " << refused.status().ToString();
    EXPECT_EQ(refused->first, 2) << refused->second;
    EXPECT_NE(refused->second.find(c.limit), std::string::npos) << refused->second;
  }
  auto stored = RoundTrip(raw, Request(1, std::string(16, 'k'), std::string(64, 'v')));
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  EXPECT_EQ(stored->first, 0);
  auto missing = RoundTrip(raw, Request(2, "k", ""));  // the refused set stored nothing
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_EQ(missing->first, 1);
  // The client says the same as an error.
  auto client = TcpStore::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  Status set = (*client)->Set("k", std::string(65, 'v'));
  EXPECT_EQ(set.code(), StatusCode::kInvalidArgument) << set.ToString();
  EXPECT_NE(set.message().find("limit of 64 (max_value_bytes)"), std::string::npos) << set.ToString();
  EXPECT_TRUE((*client)->Set("k", "v").ok());
}

// The store holds at most max_keys keys and max_stored_bytes bytes: a set or add past either
// is refused naming the limit and changes nothing; overwriting a key within them is served.
TEST(TcpStoreServerTest, WhatTheStoreHoldsIsBoundedInKeysAndBytes) {
  TcpStoreServerOptions options;
  options.max_keys = 3;
  options.max_stored_bytes = 100;
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  auto client = TcpStore::Connect("127.0.0.1", (*server)->port(), milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TcpStore& store = **client;
  ASSERT_TRUE(store.Set("a", std::string(40, 'x')).ok());  // 41 bytes held
  ASSERT_TRUE(store.Set("b", std::string(40, 'x')).ok());  // 82
  Status over = store.Set("c", std::string(40, 'x'));       // 123 > 100
  EXPECT_EQ(over.code(), StatusCode::kInvalidArgument) << over.ToString();
  EXPECT_NE(over.message().find("max_stored_bytes"), std::string::npos) << over.ToString();
  EXPECT_EQ(store.Get("c", milliseconds(0)).status().code(), StatusCode::kDeadlineExceeded);
  // Overwriting counts the old value out: 41 + 41 -> 41 + 11.
  ASSERT_TRUE(store.Set("b", std::string(10, 'y')).ok());
  ASSERT_TRUE(store.Set("c", std::string(40, 'x')).ok());  // 93
  auto counted = store.Add("d", 1);
  EXPECT_EQ(counted.status().code(), StatusCode::kInvalidArgument) << counted.status().ToString();
  EXPECT_NE(counted.status().message().find("max_keys"), std::string::npos) << counted.status().ToString();
  ASSERT_TRUE(store.Set("a", "1").ok());  // an existing key may still change: 2 + 11 + 41
  auto added = store.Add("a", 41);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(*added, 42);
  auto b = store.Get("b", milliseconds(1000));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, std::string(10, 'y'));
}

TEST(TcpStoreServerTest, OptionsOutOfRangeAreRefused) {
  TcpStoreServerOptions options;
  options.max_connections = 0;
  auto server = TcpStoreServer::Start("127.0.0.1", 0, options);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), StatusCode::kInvalidArgument) << server.status().ToString();
  EXPECT_NE(server.status().message().find("max_connections"), std::string::npos);
  for (auto set : std::vector<void (*)(TcpStoreServerOptions&)>{
           [](TcpStoreServerOptions& o) { o.max_key_bytes = 0; },
           [](TcpStoreServerOptions& o) { o.max_value_bytes = (64u << 20) + 1; },
           [](TcpStoreServerOptions& o) { o.max_keys = 0; },
           [](TcpStoreServerOptions& o) { o.max_stored_bytes = -1; }}) {
    TcpStoreServerOptions bad;
    set(bad);
    auto refused = TcpStoreServer::Start("127.0.0.1", 0, bad);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument) << refused.status().ToString();
  }
}

TEST(TcpStoreTest, AMalformedReplyClosesTheConnectionSoTheNextCallReadsNoStaleBytes) {
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  // A fake server: answers the first request with an oversized length, then with the bytes of
  // a well-formed "42" that a client reading on would take for its next answer.
  std::thread fake([&listener = listening->first] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto connection = AcceptTcp(listener, deadline);
    if (!connection.ok()) return;
    uint8_t header[9];
    if (!connection->RecvAll(header, sizeof(header), deadline, "client").ok()) return;
    uint32_t key_bytes, value_bytes;
    std::memcpy(&key_bytes, header + 1, 4);
    std::memcpy(&value_bytes, header + 5, 4);
    std::string rest(key_bytes + value_bytes, '\0');
    if (!connection->RecvAll(rest.data(), rest.size(), deadline, "client").ok()) return;
    const uint8_t answer[] = {0, 0xff, 0xff, 0xff, 0xff, 0, 2, 0, 0, 0, '4', '2'};
    (void)connection->SendAll(answer, sizeof(answer), deadline, "client");
    char drain[64];
    while (connection->RecvAll(drain, 1, deadline, "client").ok()) {
    }
  });
  auto client = TcpStore::Connect("127.0.0.1", listening->second, milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto first = (*client)->Add("counter", 1);
  EXPECT_EQ(first.status().code(), StatusCode::kDataLoss) << first.status().ToString();
  auto second = (*client)->Add("counter", 1);
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable)
      << (second.ok() ? "read " + std::to_string(*second) + " left from the first answer" : second.status().ToString());
  client->reset();  // closes the connection (if the client had not): the fake server's read ends
  fake.join();
}

// A reply is held as its bytes arrive: a server that announces a 64 MiB value and then closes
// the connection costs the client a step, not 64 MiB. The client runs in a child whose address
// space has 32 MiB to spare, where taking the whole announced value at once fails
// (std::bad_alloc, which kills it).
TEST(TcpStoreTest, AnAnnouncedReplyIsHeldAsItArrivesNotAllAtOnce) {
  if (tessera::testing::kSanitizerRuntime) {
    GTEST_SKIP() << "a sanitizer's runtime reserves more address space than any cap holds";
  }
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  const int port = listening->second;
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0) << std::strerror(errno);
  if (pid == 0) {
    // The child leaves here, never through the test framework, whatever happens.
    try {
      tessera::testing::CapAddressSpace(uint64_t{32} << 20);
      auto client = TcpStore::Connect("127.0.0.1", port, milliseconds(10000));
      if (!client.ok()) ::_exit(2);
      auto value = (*client)->Get("key", milliseconds(10000));
      // The server closed the connection part way through the value.
      ::_exit(!value.ok() && value.status().code() == StatusCode::kUnavailable ? 0 : 3);
    } catch (const std::bad_alloc&) {
      ::_exit(4);
    } catch (...) {
      ::_exit(5);
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  auto connection = AcceptTcp(listening->first, deadline);
  ASSERT_TRUE(connection.ok()) << connection.status().ToString();
  uint8_t header[9];
  ASSERT_TRUE(connection->RecvAll(header, sizeof(header), deadline, "client").ok());
  uint32_t key_bytes, value_bytes;
  std::memcpy(&key_bytes, header + 1, 4);
  std::memcpy(&value_bytes, header + 5, 4);
  std::string rest(key_bytes + value_bytes, '\0');
  ASSERT_TRUE(connection->RecvAll(rest.data(), rest.size(), deadline, "client").ok());
  EXPECT_EQ(rest, "key");
  const uint32_t announced = 64u << 20;
  uint8_t answer[5 + 16] = {0};
  std::memcpy(answer + 1, &announced, 4);
  ASSERT_TRUE(connection->SendAll(answer, sizeof(answer), deadline, "client").ok());
  connection->Close();
  int wstatus = 0;
  ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
  EXPECT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      << (WIFSIGNALED(wstatus) ? "killed by signal " + std::to_string(WTERMSIG(wstatus))
                               : "exited with " + std::to_string(WEXITSTATUS(wstatus)) +
                                     " (2: no connection, 3: another result, 4: std::bad_alloc)");
}

// A server that takes the request and never answers: Get fails at its own timeout, naming the
// key, not at the round trip's 60 s limit; the connection is closed after the cut-short trip.
TEST(TcpStoreTest, GetFromAServerThatNeverAnswersEndsAtTheGetsTimeout) {
  auto listening = ListenTcp("127.0.0.1", 0, 4);
  ASSERT_TRUE(listening.ok()) << listening.status().ToString();
  std::thread silent([&listener = listening->first] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    auto connection = AcceptTcp(listener, deadline);
    if (!connection.ok()) return;
    char drain[64];
    while (connection->RecvAll(drain, 1, deadline, "client").ok()) {
    }
  });
  auto client = TcpStore::Connect("127.0.0.1", listening->second, milliseconds(5000));
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  auto value = (*client)->Get("rendezvous/key", milliseconds(300));
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), StatusCode::kDeadlineExceeded) << value.status().ToString();
  EXPECT_NE(value.status().message().find("store key 'rendezvous/key' not set within 300 ms"), std::string::npos)
      << value.status().ToString();
  auto later = (*client)->Set("k", "v");
  EXPECT_EQ(later.code(), StatusCode::kUnavailable) << later.ToString();
  client->reset();
  silent.join();
}

// A rank that holds the file store's lock for good (stopped, hung) does not hang the others:
// Add gives up at the store's lock timeout, naming the lock file and the timeout.
TEST(FileStoreTest, AddGivesUpOnALockHeldElsewhereNamingTheLockFile) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("tessera-file-store-lock-" + std::to_string(::getpid()));
  auto store = FileStore::Open(directory.string(), milliseconds(50));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  // Another open file description of the lock file, as another process would hold it.
  const std::string lock_path = directory.string() + "/.lock";
  const int holder = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  ASSERT_GE(holder, 0) << std::strerror(errno);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0) << std::strerror(errno);
  auto added = (*store)->Add("counter", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), StatusCode::kDeadlineExceeded) << added.status().ToString();
  EXPECT_NE(added.status().message().find(lock_path), std::string::npos) << added.status().ToString();
  EXPECT_NE(added.status().message().find("within 50 ms"), std::string::npos) << added.status().ToString();
  ::close(holder);  // released: the store works again, the failed Add having changed nothing
  auto later = (*store)->Add("counter", 1);
  ASSERT_TRUE(later.ok()) << later.status().ToString();
  EXPECT_EQ(*later, 1);
  std::filesystem::remove_all(directory);
}

// Whoever writes the shared directory decides what a key's file is: a FIFO (whose open would
// block until a writer came, past any timeout) or a file over the value limit is refused at
// once, naming the file, by Get and Add alike.
TEST(FileStoreTest, AKeyFileThatIsNotARegularFileOrIsTooLargeIsRefusedAtOnce) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("tessera-file-store-hostile-" + std::to_string(::getpid()));
  auto store = FileStore::Open(directory.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string fifo = (directory / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const std::string large = (directory / "large").string();
  {
    const int fd = ::open(large.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0) << std::strerror(errno);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(FileStore::kMaxValueBytes) + 1), 0) << std::strerror(errno);
    ::close(fd);
  }
  for (const auto& [key, path] : {std::pair<std::string, std::string>{"fifo", fifo}, {"large", large}}) {
    // On a thread of its own, so that a read that blocks fails the test instead of hanging it.
    auto result = std::make_shared<std::promise<std::pair<Status, Status>>>();
    std::future<std::pair<Status, Status>> done = result->get_future();
    std::thread([result, shared = *store, key = key] {
      auto got = shared->Get(key, milliseconds(30000));
      auto added = shared->Add(key, 1);
      result->set_value({got.status(), added.status()});
    }).detach();
    ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready) << key << ": the read blocked";
    const auto [got, added] = done.get();
    for (const Status& status : {got, added}) {
      EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << key << ": " << status.ToString();
      EXPECT_NE(status.message().find(path), std::string::npos) << status.ToString();
    }
  }
  std::filesystem::remove_all(directory);
}

// A key comes from a job and the directory from a command line: errors show both escaped, so
// that neither forges a log line nor drives a terminal.
TEST(FileStoreTest, ErrorsShowTheKeyAndTheDirectoryEscaped) {
  const std::filesystem::path directory = std::filesystem::temp_directory_path() /
                                          ("tessera-file-store-\x1b[2J-" + std::to_string(::getpid()));
  auto store = FileStore::Open(directory.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  auto got = (*store)->Get("rank\n0\x1b[31m", milliseconds(50));
  ASSERT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().ToString();
  const std::string& message = got.status().message();
  EXPECT_NE(message.find("store key 'rank\\n0\\x1b[31m' not set within 50 ms"), std::string::npos) << message;
  EXPECT_NE(message.find("tessera-file-store-\\x1b[2J-"), std::string::npos) << message;
  EXPECT_EQ(message.find_first_of("\n\x1b"), std::string::npos) << message;
  std::filesystem::remove_all(directory);
}

TEST(FileStoreTest, ALockTimeoutOfZeroIsRefused) {
  auto store = FileStore::Open(std::filesystem::temp_directory_path().string(), milliseconds(0));
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), StatusCode::kInvalidArgument) << store.status().ToString();
}

TEST(HashStoreTest, AddToANonNumericValueIsAnError) {
  HashStore store;
  ASSERT_TRUE(store.Set("k", "not a number").ok());
  auto added = store.Add("k", 1);
  ASSERT_FALSE(added.ok());
  EXPECT_EQ(added.status().code(), StatusCode::kInvalidArgument) << added.status().ToString();
}

}  // namespace
}  // namespace tessera::collectives
