// LockFile: a second owner is refused with the holder's PID; the lock goes with its owner.
#include "base/lock_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "tests/fresh_directory.h"

namespace tessera {
namespace {

class LockFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-lock");
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "x.lock").string();
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(LockFileTest, ASecondOwnerIsRefusedWithTheHoldersPid) {
  auto first = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::ifstream in(path_);
  std::string written;
  std::getline(in, written);
  EXPECT_EQ(written, std::to_string(::getpid()));

  auto second = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(second.status().message(), "state directory 'x' is in use by another process (pid " +
                                           std::to_string(::getpid()) + ", lock file '" + path_ + "')");
}

TEST_F(LockFileTest, DeletingTheLockFileWhileItsOwnerRunsLetsNoSecondOwnerIn) {
  auto first = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  std::filesystem::remove(path_);
  auto second = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("state directory 'x' is in use by another process (its directory"),
            std::string::npos)
      << second.status().message();
  first.value().reset();
  EXPECT_TRUE(LockFile::Acquire(path_, "x").ok()) << "free again once the owner is gone";
}

TEST_F(LockFileTest, TheLockIsReleasedWithItsOwner) {
  { auto first = LockFile::Acquire(path_, "x"); ASSERT_TRUE(first.ok()); }
  auto again = LockFile::Acquire(path_, "x");
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

TEST_F(LockFileTest, AProcessThatDiesReleasesItsLockAndAStaleFileDoesNotBlock) {
  std::ofstream(path_) << "999999\n";  // left behind by a process long gone
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto held = LockFile::Acquire(path_, "x");
    char byte = held.ok() ? 1 : 0;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(3);
    ::pause();  // until killed
    ::_exit(0);
  }
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ASSERT_EQ(byte, 1);
  auto refused = LockFile::Acquire(path_, "x");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("pid " + std::to_string(child)), std::string::npos)
      << refused.status().message();
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  auto taken = LockFile::Acquire(path_, "x");
  EXPECT_TRUE(taken.ok()) << taken.status().ToString();
  ::close(ready[0]);
  ::close(ready[1]);
}

// A symbolic link planted at the lock's path is not followed: neither the file it names nor a
// new one where it points is created, locked or written. Its error names the path and says it
// is a link.
TEST_F(LockFileTest, ASymbolicLinkAtTheLockPathIsRefused) {
  const std::string target = (dir_ / "elsewhere").string();
  std::ofstream(target) << "keep me\n";
  std::filesystem::create_symlink(target, path_);
  auto refused = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "the lock file '" + path_ + "' of state directory 'x' is a symbolic link, which is not followed; remove it");
  std::ifstream in(target);
  std::string kept;
  std::getline(in, kept);
  EXPECT_EQ(kept, "keep me") << "the link's target was written";

  // A dangling link: no file is created where it points.
  const std::string missing = (dir_ / "missing").string();
  std::filesystem::remove(path_);
  std::filesystem::create_symlink(missing, path_);
  EXPECT_FALSE(LockFile::Acquire(path_, "x").ok());
  EXPECT_FALSE(std::filesystem::exists(missing)) << "the lock followed the link and created its target";
}

// Anything at the lock's path but a regular file is refused, without blocking on a FIFO.
TEST_F(LockFileTest, ANonRegularFileAtTheLockPathIsRefused) {
  ASSERT_EQ(::mkfifo(path_.c_str(), 0644), 0);
  auto refused = LockFile::Acquire(path_, "state directory 'x'");
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.status().message(),
            "the lock file '" + path_ + "' of state directory 'x' is not a regular file; remove it");
}

}  // namespace
}  // namespace tessera
