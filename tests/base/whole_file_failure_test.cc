// WriteFileWhole's failures: whichever step fails, the file asked for keeps what it held, no
// temporary is left beside it, and the error names the step, the file and the errno's text,
// with the code the caller chose (base/whole_file.h). Also: pieces are written in order, the
// directory is synced after the rename, and the umask narrows the mode only when asked to.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/whole_file.h"
#include "tests/file_size_limit.h"
#include "tests/fresh_directory.h"

namespace tessera {
namespace {

// This thread without CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH while it lives, so that root
// meets a directory's permissions as anyone does (capabilities are per thread); given back after.
class WithoutFilePrivileges {
 public:
  WithoutFilePrivileges() {
    header_.version = _LINUX_CAPABILITY_VERSION_3;
    header_.pid = 0;
    if (::syscall(SYS_capget, &header_, kept_) != 0) return;
    __user_cap_data_struct lowered[2] = {kept_[0], kept_[1]};
    lowered[0].effective &= ~((1u << CAP_DAC_OVERRIDE) | (1u << CAP_DAC_READ_SEARCH));
    lowered_ = ::syscall(SYS_capset, &header_, lowered) == 0;
  }
  ~WithoutFilePrivileges() {
    if (lowered_) ::syscall(SYS_capset, &header_, kept_);
  }
  // Whether a directory without write permission now refuses this thread.
  bool ok() const { return ::geteuid() != 0 || lowered_; }

 private:
  __user_cap_header_struct header_{};
  __user_cap_data_struct kept_[2]{};
  bool lowered_ = false;
};

using ::tessera::testing::FileSizeLimit;

class WholeFileFailureTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-whole-file-failure");
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "model.npz").string();
    std::ofstream(path_) << "old";
  }
  void TearDown() override {
    std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
    std::filesystem::remove_all(dir_);
  }
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  // What the directory holds, but for `path_`: nothing once a write failed.
  std::vector<std::string> Others() const {
    std::vector<std::string> names;
    for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
      if (entry.path() != path_) names.push_back(entry.path().filename().string());
    }
    return names;
  }
  std::filesystem::path dir_;
  std::string path_;
};

TEST_F(WholeFileFailureTest, PiecesAreWrittenOneAfterAnotherInOrder) {
  const std::string large(1 << 20, 'x');
  const std::vector<std::string_view> pieces = {"header:", "", large, ":tail"};
  ASSERT_TRUE(WriteFileWhole(path_, pieces).ok());
  EXPECT_EQ(Read(path_), "header:" + large + ":tail");
  EXPECT_TRUE(Others().empty());
  ASSERT_TRUE(WriteFileWhole(path_, std::vector<std::string_view>{}).ok());
  EXPECT_EQ(Read(path_), "");
}

// The first step: what is at the temporary's name cannot be removed (a directory there).
TEST_F(WholeFileFailureTest, ATemporaryThatCannotBeRemovedIsNamedAndTheFileStays) {
  std::filesystem::create_directories(path_ + ".tmp/inside");
  Status written = WriteFileWhole(path_, "new");
  EXPECT_EQ(written.code(), StatusCode::kDataLoss) << written.ToString();
  EXPECT_EQ(written.message().rfind("cannot remove the stale '" + path_ + ".tmp': ", 0), 0u) << written.message();
  EXPECT_EQ(Read(path_), "old");
  EXPECT_TRUE(std::filesystem::is_directory(path_ + ".tmp/inside"));
}

// The create: the file's directory cannot be written.
TEST_F(WholeFileFailureTest, ADirectoryThatCannotBeWrittenFailsAtTheCreateAndTheFileStays) {
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  Status written;
  {
    WithoutFilePrivileges unprivileged;
    if (!unprivileged.ok()) GTEST_SKIP() << "cannot drop root's file privileges here";
    written = WriteFileWhole(path_, "new");
  }
  EXPECT_EQ(written.code(), StatusCode::kDataLoss) << written.ToString();
  EXPECT_EQ(written.message(), "cannot create '" + path_ + ".tmp': " + std::strerror(EACCES));
  EXPECT_EQ(Read(path_), "old");
  EXPECT_TRUE(Others().empty());
}

// The writes: the file grows past what this process may write (as a full disk stops it).
TEST_F(WholeFileFailureTest, AWriteThatFailsRemovesTheTemporaryAndTheFileStays) {
  Status written;
  {
    FileSizeLimit limit(3);
    if (!limit.ok()) GTEST_SKIP() << "cannot limit the file size here";
    written = WriteFileWhole(path_, std::vector<std::string_view>{"header", std::string(64, 'x')});
  }
  EXPECT_EQ(written.code(), StatusCode::kDataLoss) << written.ToString();
  EXPECT_EQ(written.message(), "cannot write '" + path_ + ".tmp': " + std::strerror(EFBIG));
  EXPECT_EQ(Read(path_), "old");
  EXPECT_TRUE(Others().empty());
}

// The rename: a directory stands where the file is asked for.
TEST_F(WholeFileFailureTest, ATargetThatIsADirectoryFailsAtTheRenameAndLeavesNoTemporary) {
  std::filesystem::remove(path_);
  std::filesystem::create_directories(path_ + "/inside");
  Status written = WriteFileWhole(path_, "new");
  EXPECT_EQ(written.code(), StatusCode::kDataLoss) << written.ToString();
  EXPECT_EQ(written.message(),
            "cannot rename '" + path_ + ".tmp' to '" + path_ + "': " + std::strerror(EISDIR));
  EXPECT_TRUE(std::filesystem::is_directory(path_ + "/inside"));
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
  // The state directory's codes: Internal for anything but a full disk.
  written = WriteFileWhole(path_, "new", WholeFileOptions{.codes = WholeFileCodes::kFullDiskOrInternal});
  EXPECT_EQ(written.code(), StatusCode::kInternal) << written.ToString();
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp"));
}

// The directory sync after the rename: a directory that can be written but not read (0300)
// cannot be opened to sync. The file holds the new bytes by then; the failure is told all the
// same, and a write that need not be synced does not try.
TEST_F(WholeFileFailureTest, TheDirectoryIsSyncedAfterTheRename) {
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_write | std::filesystem::perms::owner_exec);
  Status synced, unsynced;
  {
    WithoutFilePrivileges unprivileged;
    if (!unprivileged.ok()) GTEST_SKIP() << "cannot drop root's file privileges here";
    synced = WriteFileWhole(path_, "new");
    unsynced = WriteFileWhole(path_, "newer", WholeFileOptions{.sync = false});
  }
  std::filesystem::permissions(dir_, std::filesystem::perms::owner_all);
  EXPECT_EQ(synced.code(), StatusCode::kDataLoss) << synced.ToString();
  EXPECT_EQ(synced.message(), "cannot open directory '" + dir_.string() + "': " + std::strerror(EACCES));
  EXPECT_TRUE(unsynced.ok()) << unsynced.ToString();
  EXPECT_EQ(Read(path_), "newer");
  EXPECT_TRUE(Others().empty());
}

// A full disk says so, in either code: ResourceExhausted for the state directory's files.
TEST_F(WholeFileFailureTest, AFullDiskIsNamedAsOne) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "no /dev/full here";
  const std::string bytes(1 << 16, 'x');
  const Status lost = WritePieces(fd, "/out/model.npz.tmp", {bytes});
  const Status exhausted = WritePieces(fd, "/state/model.ckpt.tmp", {bytes}, WholeFileCodes::kFullDiskOrInternal);
  ::close(fd);
  EXPECT_EQ(lost.code(), StatusCode::kDataLoss) << lost.ToString();
  EXPECT_EQ(lost.message(), "cannot write '/out/model.npz.tmp': " + std::string(std::strerror(ENOSPC)) +
                                " (the disk is full)");
  EXPECT_EQ(exhausted.code(), StatusCode::kResourceExhausted) << exhausted.ToString();
  EXPECT_EQ(exhausted.message(), "cannot write '/state/model.ckpt.tmp': " + std::string(std::strerror(ENOSPC)) +
                                     " (the disk is full)");
}

// By default a file has its mode whatever the umask (a certificate others read); the state
// directory's files take the umask, which a service sets to keep them its own.
TEST_F(WholeFileFailureTest, TheUmaskNarrowsTheModeOnlyWhenAsked) {
  const std::string exact = (dir_ / "ca.crt").string(), narrowed = (dir_ / "job.ckpt").string();
  const mode_t old_umask = ::umask(077);
  const Status exact_written = WriteFileWhole(exact, "cert");
  const Status narrowed_written = WriteFileWhole(narrowed, "model", WholeFileOptions{.apply_umask = true});
  ::umask(old_umask);
  ASSERT_TRUE(exact_written.ok()) << exact_written.ToString();
  ASSERT_TRUE(narrowed_written.ok()) << narrowed_written.ToString();
  struct stat st {};
  ASSERT_EQ(::stat(exact.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);
  ASSERT_EQ(::stat(narrowed.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

// A hand-over read back at once need not be synced: it is written all the same.
TEST_F(WholeFileFailureTest, AFileNotSyncedIsWrittenWhole) {
  ASSERT_TRUE(WriteFileWhole(path_, "handed over", WholeFileOptions{.sync = false}).ok());
  EXPECT_EQ(Read(path_), "handed over");
  EXPECT_TRUE(Others().empty());
}

}  // namespace
}  // namespace tessera
