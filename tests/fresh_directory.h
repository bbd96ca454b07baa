// A fresh directory for a test that writes files.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace tessera::testing {

// An empty directory under the system's temporary directory, named after `prefix`, the
// process and the running test, so that ctest's parallel processes never share one. Not
// created (the caller creates it, or lets what it tests create it); the caller removes it when
// the test ends.
inline std::filesystem::path FreshTestDirectory(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(::getpid()) + "-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  return dir;
}

}  // namespace tessera::testing
