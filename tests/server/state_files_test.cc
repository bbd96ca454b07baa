// The state directory's files (server/state/state_files.h): a FIFO or another file that is
// not a regular one where a checkpoint is read fails at once, naming it; an fstat that fails
// is an I/O error, not damage; a link planted at a checkpoint's temporary path is never
// written through; directories are made with every missing parent.
#include "server/state/state_files.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "server/state/sqlite_state_store.h"
#include "tests/server/test_directory.h"

namespace tessera::server {
namespace {

class StateFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = FreshTestDirectory("tessera-state-files"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

TensorSet Model(float v) { return {{"w", {2, 2}, {v, v + 1, v + 2, v + 3}}, {"b", {2}, {v, -v}}}; }

std::string Contents(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The open waited for a writer that never came: the coordinator hung at start. It now fails
// at once, as a checkpoint that is not one, and the job falls back to the one before.
TEST_F(StateFilesTest, AFifoWhereACheckpointIsExpectedFailsAtOnceNamingIt) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  ASSERT_TRUE((*store)->SaveInitialModel("job-1-abc", Model(0)).ok());
  const std::string fifo = (*store)->CheckpointPath("job-1-abc", 1);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  auto loaded = (*store)->LoadCheckpoint("job-1-abc", 1);
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << loaded.status().ToString();
  EXPECT_EQ(loaded.status().message(), "checkpoint '" + fifo + "' is a FIFO; expected a regular file");
  std::vector<Status> damaged;
  auto newest = (*store)->LoadNewestCheckpoint("job-1-abc", 1, &damaged);
  ASSERT_TRUE(newest.ok()) << newest.status().ToString();
  EXPECT_EQ(newest->round, 0u);
  ASSERT_EQ(damaged.size(), 1u);
  EXPECT_NE(damaged[0].message().find(fifo), std::string::npos) << damaged[0].message();
}

TEST_F(StateFilesTest, ADirectoryWhereACheckpointIsExpectedIsNamedAsOne) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string path = (*store)->CheckpointPath("job-1-abc", 2);
  std::filesystem::create_directory(path);
  auto loaded = (*store)->LoadCheckpoint("job-1-abc", 2);
  EXPECT_EQ(loaded.status().code(), StatusCode::kDataLoss) << loaded.status().ToString();
  EXPECT_EQ(loaded.status().message(), "checkpoint '" + path + "' is a directory; expected a regular file");
}

// An fstat that fails says nothing about the file's content: Unavailable, not DataLoss (which
// would send a resume back to an older checkpoint), naming the file and the errno's text.
TEST_F(StateFilesTest, AnFstatThatFailsIsAnIoErrorNamingTheFile) {
  struct stat info {};
  const Status s = CheckRegularFile(-1, "/state/checkpoints/x.ckpt", "checkpoint", &info);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s.ToString();
  EXPECT_EQ(s.message(), std::string("cannot stat checkpoint '/state/checkpoints/x.ckpt': ") + std::strerror(EBADF));
}

// A link at the temporary path was followed: the checkpoint's bytes went into whatever file
// it named. The link is now replaced, its target left as it was.
TEST_F(StateFilesTest, ALinkAtACheckpointsTemporaryPathIsNotWrittenThrough) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const auto victim = dir_ / "victim";
  std::ofstream(victim) << "keep me";
  const std::string path = (*store)->CheckpointPath("job-1-abc", 1);
  std::filesystem::create_symlink(victim, path + ".tmp");
  ASSERT_TRUE((*store)->WriteCheckpoint("job-1-abc", 1, Model(1)).ok());
  EXPECT_EQ(Contents(victim), "keep me");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path + ".tmp")));
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(path)));
  EXPECT_EQ(Contents(path), EncodeCheckpoint(Model(1)));
  auto loaded = (*store)->LoadCheckpoint("job-1-abc", 1);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  EXPECT_EQ((*loaded)[0].values, Model(1)[0].values);
  // A link to a device that takes every byte (or none) is not written through either.
  std::filesystem::create_symlink("/dev/full", path + ".tmp");
  ASSERT_TRUE(WriteFileAtomically(path, "plain").ok());
  EXPECT_EQ(Contents(path), "plain");
}

// A full disk is ResourceExhausted naming the file; the writes of WriteFileAtomically's
// temporary go through the same code with the same codes.
TEST_F(StateFilesTest, AFullDiskIsResourceExhaustedNamingTheFile) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0) << std::strerror(errno);
  const std::string bytes(1 << 16, 'x');
  const Status s = WritePieces(fd, "/state/model.ckpt.tmp", {bytes}, kStateFileOptions.codes);
  ::close(fd);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find("model.ckpt.tmp"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("disk is full"), std::string::npos) << s.message();
}

// A service's UMask=0077 keeps the state's files its own: a checkpoint is not made readable by
// every account whatever the umask.
TEST_F(StateFilesTest, ACheckpointTakesTheUmask) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const mode_t old_umask = ::umask(077);
  const Status saved = (*store)->SaveInitialModel("job-1-abc", Model(0));
  ::umask(old_umask);
  ASSERT_TRUE(saved.ok()) << saved.ToString();
  struct stat info {};
  ASSERT_EQ(::stat((*store)->CheckpointPath("job-1-abc", 0).c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);
}

// A checkpoint that cannot be put in place is Internal, naming the step and the file, and
// leaves no temporary behind.
TEST_F(StateFilesTest, ACheckpointThatCannotBeRenamedIntoPlaceLeavesNoTemporary) {
  auto store = SqliteStateStore::Open(dir_.string());
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string path = (*store)->CheckpointPath("job-1-abc", 1);
  std::filesystem::create_directories(path + "/inside");
  const Status s = (*store)->WriteCheckpoint("job-1-abc", 1, Model(1));
  EXPECT_EQ(s.code(), StatusCode::kInternal) << s.ToString();
  EXPECT_EQ(s.message(), "cannot rename '" + path + ".tmp' to '" + path + "': " + std::strerror(EISDIR));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_TRUE(std::filesystem::is_directory(path + "/inside"));
}

TEST_F(StateFilesTest, DirectoriesAreMadeWithEveryMissingParent) {
  const auto deep = dir_ / "a" / "b" / "c";
  ASSERT_TRUE(CreateDirectoriesDurably(deep.string() + "/").ok());
  EXPECT_TRUE(std::filesystem::is_directory(deep));
  EXPECT_TRUE(CreateDirectoriesDurably(deep.string()).ok()) << "one that is there already is Ok";
  std::ofstream(dir_ / "file") << "x";
  const Status s = CreateDirectoriesDurably((dir_ / "file" / "d").string());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find((dir_ / "file").string()), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tessera::server
