// FileStore's writes: a value is written whole or not at all. A write that fails (a full disk,
// a name taken) leaves the key as it was and no temporary beside it, and the error names the
// key, the file and the step; writers of the same key at once, in processes that share a
// process id as ranks on two machines sharing the directory do, end with one whole value.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "collectives/store/file_store.h"
#include "tests/file_size_limit.h"
#include "tests/fresh_directory.h"

namespace tessera::collectives {
namespace {

using std::chrono::milliseconds;

using ::tessera::testing::FileSizeLimit;

class FileStoreWriteTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-file-store-write");
    auto store = FileStore::Open(dir_.string());
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // The names in the store's directory, but the lock file.
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      if (entry.path().filename() != ".lock") names.push_back(entry.path().filename().string());
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  std::filesystem::path dir_;
  std::shared_ptr<FileStore> store_;
};

// The disk fills part way through a value: Set fails, naming the key, the temporary and the
// write, and the key keeps its old value, with nothing left beside it.
TEST_F(FileStoreWriteTest, AWriteCutShortLeavesTheOldValueAndNoTemporary) {
  ASSERT_TRUE(store_->Set("rank/0", "old").ok());
  Status written;
  {
    FileSizeLimit limit(3);
    if (!limit.ok()) GTEST_SKIP() << "cannot limit the file size here";
    written = store_->Set("rank/0", "10.0.0.1:29500");
  }
  EXPECT_EQ(written.code(), StatusCode::kUnavailable) << written.ToString();
  const std::string path = (dir_ / "rank%2F0").string();
  EXPECT_EQ(written.message().rfind("store key 'rank/0': cannot write '" + path + "~", 0), 0u)
      << written.message();
  EXPECT_NE(written.message().find(std::strerror(EFBIG)), std::string::npos) << written.message();
  auto got = store_->Get("rank/0", milliseconds(2000));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "old");
  EXPECT_EQ(Names(), std::vector<std::string>{"rank%2F0"});
}

// The same for a key set for the first time, and for Add: no cut value under the key's name,
// which a peer would read as a whole (wrong) one.
TEST_F(FileStoreWriteTest, AFirstValueCutShortIsNeverSeenUnderTheKeysName) {
  ASSERT_TRUE(store_->Add("counter", 1000).ok());
  Status written;
  Status added;
  {
    FileSizeLimit limit(3);
    if (!limit.ok()) GTEST_SKIP() << "cannot limit the file size here";
    written = store_->Set("address", "10.0.0.1:29500");
    added = store_->Add("counter", 1).status();
  }
  EXPECT_EQ(written.code(), StatusCode::kUnavailable) << written.ToString();
  EXPECT_EQ(added.code(), StatusCode::kUnavailable) << added.ToString();
  EXPECT_NE(added.message().find("store key 'counter': cannot write"), std::string::npos) << added.message();
  auto got = store_->Get("address", milliseconds(50));
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().ToString();
  auto counter = store_->Add("counter", 0);
  ASSERT_TRUE(counter.ok()) << counter.status().ToString();
  EXPECT_EQ(*counter, 1000);
  EXPECT_EQ(Names(), std::vector<std::string>{"counter"});
}

// Something that is not a file at the key's name (a directory): the rename fails, the error
// names it, and the temporary is removed.
TEST_F(FileStoreWriteTest, ATargetThatCannotBeReplacedFailsAtTheRenameAndLeavesNoTemporary) {
  std::filesystem::create_directories(dir_ / "key" / "inside");
  Status written = store_->Set("key", "value");
  EXPECT_EQ(written.code(), StatusCode::kUnavailable) << written.ToString();
  EXPECT_NE(written.message().find("store key 'key': cannot rename '" + (dir_ / "key").string() + "~"),
            std::string::npos)
      << written.message();
  EXPECT_NE(written.message().find(" to '" + (dir_ / "key").string() + "': "), std::string::npos)
      << written.message();
  EXPECT_EQ(Names(), std::vector<std::string>{"key"});
}

// A key's file is never a temporary's name: keys named like "k"'s temporaries (a key's file
// name holds only letters, digits, '.', '_', '-' and %XX escapes, or "%#" and a hash), set by
// other ranks, keep their values while "k" is set.
TEST_F(FileStoreWriteTest, NoTemporaryIsEverAnotherKeysFile) {
  const std::string pid = std::to_string(::getpid());
  std::vector<std::string> keys = {"k.tmp"};
  for (int n = 0; n < 1000; ++n) keys.push_back("k.tmp." + pid + "." + std::to_string(n));
  // Their files, as another process's Set leaves them (their own Sets here would count).
  for (const std::string& key : keys) std::ofstream(dir_ / key) << "mine";
  ASSERT_TRUE(store_->Set("k", "other").ok());
  for (const std::string& key : keys) {
    auto got = store_->Get(key, milliseconds(50));
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().ToString();
    EXPECT_EQ(*got, "mine") << key;
  }
  EXPECT_EQ(Names().size(), 1002u);
}

// Two processes write the same key at once, over and over, while this one reads it: each
// write succeeds and each read is one writer's whole value. The writers go in step, each round
// starting when both are ready, and each runs in a PID namespace of its own where one can be
// made, so that both have process id 1, as ranks on two machines may share an id.
TEST_F(FileStoreWriteTest, WritersOfTheSameKeyAtOnceEndWithOneWholeValue) {
  constexpr int kRounds = 300;
  const size_t value_bytes = 16 << 10;
  const std::string key = "rendezvous/address";
  // ready[w]: writer w reads there that the other writer is ready for the next round.
  int ready[2][2];
  for (auto& pipe : ready) ASSERT_EQ(::pipe(pipe), 0) << std::strerror(errno);
  std::vector<pid_t> children;
  for (int w = 0; w < 2; ++w) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0) << std::strerror(errno);
    if (child == 0) {
      const int mine = ready[w][0];
      const int theirs = ready[1 - w][1];
      ::close(ready[w][1]);
      ::close(ready[1 - w][0]);
      if (::unshare(CLONE_NEWUSER | CLONE_NEWPID) == 0) {
        const auto put = [](const char* file, const std::string& text) { std::ofstream(file) << text; };
        put("/proc/self/uid_map", std::to_string(::getuid()) + " " + std::to_string(::getuid()) + " 1");
        put("/proc/self/setgroups", "deny");
        put("/proc/self/gid_map", std::to_string(::getgid()) + " " + std::to_string(::getgid()) + " 1");
        const pid_t inner = ::fork();  // process 1 of the new namespace
        if (inner < 0) ::_exit(3);
        if (inner > 0) {
          int status = 0;
          ::waitpid(inner, &status, 0);
          ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 4);
        }
      }
      auto store = FileStore::Open(dir_.string());
      if (!store.ok()) ::_exit(5);
      const std::string value(value_bytes, static_cast<char>('a' + w));
      for (int round = 0; round < kRounds; ++round) {
        char step = 's';
        if (::write(theirs, &step, 1) != 1 || ::read(mine, &step, 1) != 1) ::_exit(6);
        Status set = (*store)->Set(key, value);
        if (!set.ok()) {
          std::fprintf(stderr, "writer %d (process %d): %s\n", w, static_cast<int>(::getpid()),
                       set.ToString().c_str());
          ::_exit(7);
        }
      }
      ::_exit(0);
    }
    children.push_back(child);
  }
  for (auto& pipe : ready) {
    ::close(pipe[0]);
    ::close(pipe[1]);
  }
  std::atomic<bool> done{false};
  std::thread reader([&] {
    do {
      auto got = store_->Get(key, milliseconds(30000));
      ASSERT_TRUE(got.ok()) << got.status().ToString();
      ASSERT_TRUE(*got == std::string(value_bytes, 'a') || *got == std::string(value_bytes, 'b'))
          << "a value of " << got->size() << " bytes, not one writer's whole value";
    } while (!done.load());
  });
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "writer exit status " << status;
  }
  done = true;
  reader.join();
  EXPECT_EQ(Names(), std::vector<std::string>{"rendezvous%2Faddress"});
}

}  // namespace
}  // namespace tessera::collectives
