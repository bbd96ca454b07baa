// WriteFileWhole: a file is written whole under its name or not at all.
#include "base/whole_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/fresh_directory.h"

namespace tessera {
namespace {

class WholeFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::tessera::testing::FreshTestDirectory("tessera-whole-file");
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  static std::string Read(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::filesystem::path dir_;
};

TEST_F(WholeFileTest, AFileIsWrittenWithItsModeWhateverTheUmaskAndNoTemporaryIsLeft) {
  const std::string path = (dir_ / "key.pem").string();
  const mode_t old_umask = ::umask(0);  // a umask that would leave the file world-writable
  Status written = WriteFileWhole(path, "secret", WholeFileOptions{.mode = 0600, .sync = true, .suffix = ".new"});
  ::umask(old_umask);
  ASSERT_TRUE(written.ok()) << written.ToString();
  EXPECT_EQ(Read(path), "secret");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".new"));
}

TEST_F(WholeFileTest, AnExistingFileIsReplacedWhole) {
  const std::string path = (dir_ / "model.npz").string();
  std::ofstream(path) << "an older and much longer content than the new one";
  ASSERT_TRUE(WriteFileWhole(path, "new", WholeFileOptions{.sync = false}).ok());
  EXPECT_EQ(Read(path), "new");
}

// A link planted in the temporary's place is neither followed (its target keeps its bytes) nor
// renamed over the file asked for: it is removed, and the temporary made new in its place.
TEST_F(WholeFileTest, ALinkInTheTemporarysPlaceIsReplacedNotFollowed) {
  const std::string path = (dir_ / "model.onnx").string();
  const std::filesystem::path target = dir_ / "elsewhere";
  std::ofstream(target) << "untouched";
  std::filesystem::create_symlink(target, path + ".tmp");
  Status written = WriteFileWhole(path, "bytes");
  ASSERT_TRUE(written.ok()) << written.ToString();
  EXPECT_EQ(Read(target), "untouched");
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(path)));
  EXPECT_EQ(Read(path), "bytes");
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(path + ".tmp")));
  // A link to a device that takes every byte, or none, is not written through either.
  std::filesystem::create_symlink("/dev/full", path + ".tmp");
  ASSERT_TRUE(WriteFileWhole(path, "again").ok());
  EXPECT_EQ(Read(path), "again");
}

// A temporary left by a run that died (a key's, readable by anyone) is not reused: the file
// is made new, with the mode asked for, and none of the old bytes.
TEST_F(WholeFileTest, AStaleTemporaryIsReplacedByANewFile) {
  const std::string path = (dir_ / "ca.key").string();
  std::ofstream(path + ".new") << "a stale temporary, longer than what is written now";
  std::filesystem::permissions(path + ".new", std::filesystem::perms::all);
  ASSERT_TRUE(WriteFileWhole(path, "key", WholeFileOptions{.mode = 0600, .suffix = ".new"}).ok());
  EXPECT_EQ(Read(path), "key");
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_FALSE(std::filesystem::exists(path + ".new"));
}

TEST_F(WholeFileTest, AFolderThatDoesNotExistIsAnErrorNamingTheFile) {
  const std::string path = (dir_ / "missing" / "file").string();
  Status written = WriteFileWhole(path, "bytes");
  EXPECT_EQ(written.code(), StatusCode::kDataLoss);
  EXPECT_NE(written.message().find(path + ".tmp"), std::string::npos) << written.message();
  EXPECT_NE(written.message().find("No such file or directory"), std::string::npos) << written.message();
}

// The path comes from a command line (export -o, trace -o): its error shows it escaped, on one
// line, and bounded, never a terminal escape or a megabyte of name.
TEST_F(WholeFileTest, AnErrorShowsThePathEscapedAndBounded) {
  const std::string hostile = (dir_ / "missing\x1b[2J\nforged line" / "file").string();
  Status written = WriteFileWhole(hostile, "bytes");
  EXPECT_EQ(written.code(), StatusCode::kDataLoss);
  EXPECT_EQ(written.message().find('\x1b'), std::string::npos) << written.message();
  EXPECT_EQ(written.message().find('\n'), std::string::npos) << written.message();
  EXPECT_NE(written.message().find("missing\\x1b[2J\\nforged line/file.tmp'"), std::string::npos) << written.message();

  const std::string long_name = (dir_ / "missing" / std::string(200, 'd') / std::string(200, 'f')).string();
  Status long_written = WriteFileWhole(long_name, "bytes");
  EXPECT_EQ(long_written.code(), StatusCode::kDataLoss);
  EXPECT_EQ(long_written.message().find(std::string(200, 'f')), std::string::npos) << long_written.message();
  EXPECT_LT(long_written.message().size(), 400u) << long_written.message();
}

}  // namespace
}  // namespace tessera
