// The backend module loader (base/backend_module.h): where it looks, that a module's Tessera
// symbols resolve against this executable, and that every way a load can fail comes back as
// a Status saying why (the file is nowhere, is not a shared object, needs a symbol nobody
// defines, lacks its entry point) instead of ending the process.
#include "base/backend_module.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace tessera {
namespace {

// Sets TESSERA_MODULE_DIR (or clears it) for one test, and puts the old value back.
class ModuleDirectoryOverride {
 public:
  explicit ModuleDirectoryOverride(const std::optional<std::string>& directory) {
    if (const char* old = std::getenv("TESSERA_MODULE_DIR")) old_ = old;
    if (directory) {
      ::setenv("TESSERA_MODULE_DIR", directory->c_str(), 1);
    } else {
      ::unsetenv("TESSERA_MODULE_DIR");
    }
  }
  ~ModuleDirectoryOverride() {
    if (old_) {
      ::setenv("TESSERA_MODULE_DIR", old_->c_str(), 1);
    } else {
      ::unsetenv("TESSERA_MODULE_DIR");
    }
  }

 private:
  std::optional<std::string> old_;
};

std::string ExecutableDirectory() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().lexically_normal().string();
}

TEST(BackendModuleTest, LooksBesideTheExecutableThenInstalledThenInTheBuildTree) {
  ModuleDirectoryOverride unset(std::nullopt);
  const std::vector<std::string> directories = BackendModuleDirectories();
  ASSERT_GE(directories.size(), 2u);
  EXPECT_EQ(directories[0], ExecutableDirectory());
  // The installed layout: <prefix>/bin beside <prefix>/<libdir>/tessera.
  EXPECT_TRUE(directories[1].ends_with("/tessera")) << directories[1];
  // The build tree's own: <build>/lib/tessera.
  EXPECT_TRUE(directories.back().ends_with("/lib/tessera")) << directories.back();
}

TEST(BackendModuleTest, TheEnvironmentChoosesTheOnlyDirectory) {
  ModuleDirectoryOverride chosen("/opt/elsewhere/modules");
  EXPECT_EQ(BackendModuleDirectories(), std::vector<std::string>{"/opt/elsewhere/modules"});
  auto loaded = LoadBackendModule("libtessera_cuda.so", "tessera_cuda_module_v1");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kNotFound);
  EXPECT_NE(loaded.status().message().find("libtessera_cuda.so is in none of /opt/elsewhere/modules"),
            std::string::npos)
      << loaded.status().ToString();
}

// TESSERA_MODULE_DIR comes from the environment, and its text reaches a device's reason for
// not being usable (a worker's log, `tessera devices`): escaped and bounded there.
TEST(BackendModuleTest, TheChosenDirectoryIsShownEscapedAndBounded) {
  ModuleDirectoryOverride chosen("/opt/\x1b[31m" + std::string(5000, 'm'));
  auto loaded = LoadBackendModule("libtessera_cuda.so", "tessera_cuda_module_v1");
  ASSERT_EQ(loaded.status().code(), StatusCode::kNotFound) << loaded.status().ToString();
  const std::string& message = loaded.status().message();
  EXPECT_EQ(message.find('\x1b'), std::string::npos) << message;
  EXPECT_NE(message.find("libtessera_cuda.so is in none of /opt/\\x1b[31m"), std::string::npos) << message;
  EXPECT_LT(message.size(), 600u) << message.substr(0, 600);
}

TEST(BackendModuleTest, AModuleResolvesTesseraSymbolsAgainstTheExecutable) {
  ModuleDirectoryOverride chosen(TESSERA_FIXTURE_MODULE_DIR);
  auto loaded = LoadBackendModule("libtessera_fixture_module.so", "tessera_fixture_module_v1");
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  const Status* made = reinterpret_cast<Status* (*)()>(*loaded)();
  ASSERT_NE(made, nullptr);
  EXPECT_EQ(made->code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(made->message(), "made in the fixture module");
  // Loaded once, found again: the same entry.
  auto again = LoadBackendModule("libtessera_fixture_module.so", "tessera_fixture_module_v1");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, *loaded);
}

TEST(BackendModuleTest, AMissingEntryPointIsUnavailableNamingIt) {
  ModuleDirectoryOverride chosen(TESSERA_FIXTURE_MODULE_DIR);
  auto loaded = LoadBackendModule("libtessera_fixture_module.so", "tessera_fixture_module_v2");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(loaded.status().message().find("has no entry point tessera_fixture_module_v2"), std::string::npos)
      << loaded.status().ToString();
}

TEST(BackendModuleTest, ASymbolNobodyDefinesFailsTheLoadNamingIt) {
  ModuleDirectoryOverride chosen(TESSERA_FIXTURE_MODULE_DIR);
  auto loaded = LoadBackendModule("libtessera_unresolved_module.so", "tessera_fixture_module_v1");
  ASSERT_FALSE(loaded.ok()) << "a module needing an undefined symbol was loaded";
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(loaded.status().message().find("undefined symbol: tessera_fixture_symbol_nobody_defines"),
            std::string::npos)
      << loaded.status().ToString();
}

TEST(BackendModuleTest, AFileThatIsNotASharedObjectIsRefusedWithABoundedReason) {
  const std::filesystem::path directory =
      std::filesystem::temp_directory_path() / ("tessera-module-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(directory);
  {
    std::ofstream out(directory / "libtessera_garbage.so");
    out << std::string(4096, 'x');
  }
  ModuleDirectoryOverride chosen(directory.string());
  auto loaded = LoadBackendModule("libtessera_garbage.so", "tessera_garbage_module_v1");
  std::filesystem::remove_all(directory);
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(loaded.status().message().find("libtessera_garbage.so"), std::string::npos)
      << loaded.status().ToString();
  EXPECT_LE(loaded.status().message().size(), 512u);
}

TEST(BackendModuleTest, ASystemLibraryThatIsNotThereSaysSo) {
  Status loaded = LoadSystemLibrary("libtessera-no-such-library.so.7");
  ASSERT_FALSE(loaded.ok());
  EXPECT_EQ(loaded.code(), StatusCode::kUnavailable);
  EXPECT_NE(loaded.message().find("libtessera-no-such-library.so.7"), std::string::npos) << loaded.ToString();
}

}  // namespace
}  // namespace tessera
