// FileStore's keys and reads: every key, whatever it holds, is a file of its own in the store's
// directory, never the lock file, a temporary or a name outside the directory; and a value is
// read whole or the read is an error, never a part of a file taken for the value.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "collectives/store/file_store.h"
#include "tests/fresh_directory.h"

namespace tessera::collectives {
namespace {

using std::chrono::milliseconds;

class FileStoreKeysTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Something beside the store's directory, which no key may reach.
    outside_ = ::tessera::testing::FreshTestDirectory("tessera-file-store-keys");
    dir_ = outside_ / "store";
    auto store = FileStore::Open(dir_.string(), milliseconds(50));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    store_ = *store;
  }
  void TearDown() override { std::filesystem::remove_all(outside_); }
  std::filesystem::path outside_;
  std::filesystem::path dir_;
  std::shared_ptr<FileStore> store_;
};

// A key named like the lock file is a key like any other: the lock file, made by Add, is no
// value of it, and setting it leaves the lock alone, so that Add stays atomic while another
// process holds the lock.
TEST_F(FileStoreKeysTest, AKeyNamedLikeTheLockFileNeverTouchesTheLock) {
  ASSERT_TRUE(store_->Add("counter", 1).ok());
  auto unset = store_->Get(".lock", milliseconds(50));
  EXPECT_EQ(unset.status().code(), StatusCode::kDeadlineExceeded) << "read the lock file as a value";
  // Another process holds the lock for good; a rank sets ".lock" meanwhile.
  const std::string lock_path = (dir_ / ".lock").string();
  const int holder = ::open(lock_path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(holder, 0) << std::strerror(errno);
  ASSERT_EQ(::flock(holder, LOCK_EX), 0) << std::strerror(errno);
  ASSERT_TRUE(store_->Set(".lock", "value").ok());
  auto added = store_->Add("counter", 1);
  EXPECT_EQ(added.status().code(), StatusCode::kDeadlineExceeded)
      << "Add took a lock another process holds: " << added.status().ToString();
  ::close(holder);
  auto got = store_->Get(".lock", milliseconds(2000));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "value");
  auto counter = store_->Add("counter", 0);
  ASSERT_TRUE(counter.ok()) << counter.status().ToString();
  EXPECT_EQ(*counter, added.ok() ? 2 : 1);
}

// Keys that are no file name as they are (empty, "." and "..", a path up and out, names like
// the store's own files, thousands of bytes) each get a file of their own in the directory, of
// at most 255 bytes, that is neither the lock file nor any key's temporary; Set, Get and Add
// work on them as on any key.
TEST_F(FileStoreKeysTest, EveryKeyMapsOntoAFileOfItsOwnInTheDirectory) {
  const std::string pid = std::to_string(::getpid());
  std::vector<std::string> keys = {"",        ".",         "..",        ".lock",      "../outside",
                                   "/",       "a/b",       "~" + pid,   "k~" + pid + ".0123456789abcdef",
                                   "%2E",     ".hidden",   "rank/0",    std::string(1, '\0'),
                                   std::string(4096, 'x'), std::string(4095, 'x') + "y",
                                   std::string(300, '/'), std::string(300, '/') + "x",
                                   std::string(84, 'x') + std::string(300, '/')};
  for (size_t i = 0; i < keys.size(); ++i) {
    const Status set = store_->Set(keys[i], "value " + std::to_string(i));
    ASSERT_TRUE(set.ok()) << "key " << i << ": " << set.ToString();
  }
  ASSERT_TRUE(store_->Add("counter", 1).ok());  // the lock file, too
  for (size_t i = 0; i < keys.size(); ++i) {
    auto got = store_->Get(keys[i], milliseconds(2000));
    ASSERT_TRUE(got.ok()) << "key " << i << ": " << got.status().ToString();
    EXPECT_EQ(*got, "value " + std::to_string(i)) << "key " << i;
  }
  auto added = store_->Add(std::string(4096, 'c'), 5);
  ASSERT_TRUE(added.ok()) << added.status().ToString();
  EXPECT_EQ(*store_->Add(std::string(4096, 'c'), 1), 6);
  // The keys' files, the counters' and the lock file, and nothing else, anywhere.
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    const std::string name = entry.path().filename().string();
    EXPECT_TRUE(entry.is_regular_file()) << name;
    EXPECT_LE(name.size(), 255u) << name;
    EXPECT_EQ(name.find('~'), std::string::npos) << name;
    if (name != ".lock") EXPECT_NE(name[0], '.') << name;
    names.insert(name);
  }
  EXPECT_EQ(names.size(), keys.size() + 3) << "two keys share a file";
  EXPECT_EQ(names.count(".lock"), 1u);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(outside_), {}), 1);
}

// A long key's file name still leaves room for its temporaries' suffix within 255 bytes: each
// long key is set and read back, keys alike but for their last byte included.
TEST_F(FileStoreKeysTest, KeysOfEveryLengthUpToTcpStoresLimitRoundTrip) {
  for (size_t length : {60u, 70u, 72u, 73u, 80u, 199u, 200u, 201u, 217u, 218u, 255u, 256u, 1000u, 4096u}) {
    for (char last : {'a', '/'}) {
      const std::string key = std::string(length - 1, 'k') + last;
      ASSERT_TRUE(store_->Set(key, std::to_string(length) + last).ok()) << length;
    }
  }
  for (size_t length : {60u, 70u, 72u, 73u, 80u, 199u, 200u, 201u, 217u, 218u, 255u, 256u, 1000u, 4096u}) {
    for (char last : {'a', '/'}) {
      auto got = store_->Get(std::string(length - 1, 'k') + last, milliseconds(2000));
      ASSERT_TRUE(got.ok()) << length << ": " << got.status().ToString();
      EXPECT_EQ(*got, std::to_string(length) + last);
    }
  }
}

// Reads the whole of `path`, or "" where it cannot be read.
std::string Contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// A key's file whose size, as fstat gives it, is not what reading it gives (here a sysfs file,
// which says 4096 bytes and reads a few, and a /proc file, which says 0 and reads more; in a
// store, a file written in place while it is read): the read is an error naming the key, the
// file and both sizes, never the bytes read as the value. The store's directory is the file's
// own, as a link to it would not be followed; Add needs its lock file there, which neither
// directory can hold, and reads the key's file as Get does.
TEST(FileStoreReadTest, AFileThatReadsShorterOrLongerThanItsSizeIsAnErrorNotAValue) {
  struct Source {
    std::string directory;
    std::string key;
  };
  std::vector<Source> sources;
  for (const Source& candidate : {Source{"/sys/kernel/mm/transparent_hugepage", "enabled"},
                                  Source{"/sys/devices/system/cpu", "online"},
                                  Source{"/sys/devices/system/cpu", "possible"},
                                  Source{"/sys/kernel", "uevent_seqnum"}}) {
    const std::string path = candidate.directory + "/" + candidate.key;
    struct stat info {};
    if (::lstat(path.c_str(), &info) == 0 && S_ISREG(info.st_mode) && info.st_size > 0 &&
        Contents(path).size() < static_cast<size_t>(info.st_size) && !Contents(path).empty()) {
      sources.push_back(candidate);
      break;
    }
  }
  {
    const std::string directory = "/proc/" + std::to_string(::getpid());
    struct stat info {};
    if (::lstat((directory + "/status").c_str(), &info) == 0 && S_ISREG(info.st_mode) && info.st_size == 0 &&
        !Contents(directory + "/status").empty()) {
      sources.push_back({directory, "status"});
    }
  }
  if (sources.empty()) GTEST_SKIP() << "no sysfs or procfs file here whose size differs from what it reads";
  for (const Source& source : sources) {
    auto store = FileStore::Open(source.directory, milliseconds(50));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    const std::string file = source.directory + "/" + source.key;
    struct stat info {};
    ASSERT_EQ(::stat(file.c_str(), &info), 0) << std::strerror(errno);
    const std::string size = std::to_string(info.st_size);
    auto got = (*store)->Get(source.key, milliseconds(2000));
    ASSERT_FALSE(got.ok()) << file << ": read " << got->size() << " bytes of a " << size
                           << "-byte file as the value";
    const std::string& message = got.status().message();
    EXPECT_EQ(got.status().code(), StatusCode::kFailedPrecondition) << got.status().ToString();
    EXPECT_NE(message.find("store key '" + source.key + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("'" + file + "'"), std::string::npos) << message;
    EXPECT_NE(message.find("its size was " + size + " bytes"), std::string::npos) << message;
  }
}

// Anyone who can write the store's directory may put a symbolic link where a key's file goes
// (or the lock file): it is never followed. Get and Add are FAILED_PRECONDITION naming the key
// and the link, never the value of the file it points to; a Set replaces the link with the
// key's own file, leaving that file as it was; a link at the lock file's name makes Add an
// error, the file it points to neither created nor opened.
TEST_F(FileStoreKeysTest, ASymbolicLinkInTheStoreIsNeverFollowed) {
  const std::filesystem::path secret = outside_ / "secret";
  { std::ofstream(secret) << "42"; }  // what a rank may read, and a counter's form too
  const std::filesystem::path link = dir_ / "counter";
  std::filesystem::create_symlink(secret, link);
  auto got = store_->Get("counter", milliseconds(2000));
  ASSERT_FALSE(got.ok()) << "read '" << *got << "' through a link to " << secret;
  auto added = store_->Add("counter", 1);
  ASSERT_FALSE(added.ok()) << "added to " << secret << " through a link: " << *added;
  for (const Status& status : {got.status(), added.status()}) {
    const std::string& message = status.message();
    EXPECT_EQ(status.code(), StatusCode::kFailedPrecondition) << status.ToString();
    EXPECT_NE(message.find("store key 'counter'"), std::string::npos) << message;
    EXPECT_NE(message.find("'" + link.string() + "' is a symbolic link"), std::string::npos) << message;
  }
  ASSERT_TRUE(store_->Set("counter", "7").ok());
  EXPECT_EQ(Contents(secret.string()), "42");
  auto set = store_->Get("counter", milliseconds(2000));
  ASSERT_TRUE(set.ok()) << set.status().ToString();
  EXPECT_EQ(*set, "7");

  // The lock file (the Add above made it): a link to a file that is not there yet, which an
  // open would create.
  std::filesystem::remove(dir_ / ".lock");
  const std::filesystem::path planted = outside_ / "planted";
  std::filesystem::create_symlink(planted, dir_ / ".lock");
  auto locked = store_->Add("counter", 1);
  ASSERT_FALSE(locked.ok()) << "locked through a link: " << *locked;
  EXPECT_EQ(locked.status().code(), StatusCode::kFailedPrecondition) << locked.status().ToString();
  EXPECT_NE(locked.status().message().find("'" + (dir_ / ".lock").string() + "' is a symbolic link"),
            std::string::npos)
      << locked.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(planted))) << "the link's file was created";
}

}  // namespace
}  // namespace tessera::collectives
