// One suite for the Store interface, instantiated for HashStore, FileStore and TcpStore.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "collectives/store/file_store.h"
#include "collectives/store/hash_store.h"
#include "collectives/store/tcp_store.h"

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

INSTANTIATE_TEST_SUITE_P(Stores, StoreTest, ::testing::Values("hash", "file", "tcp"));

}  // namespace
}  // namespace tessera::collectives
