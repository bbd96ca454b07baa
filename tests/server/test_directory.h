// What the coordinator's tests on real state directories share: a fresh directory per test,
// and a coordinator's options for tests about jobs, state and shutdown (not about TLS).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "server/coordinator.h"

namespace tessera::server {

// An empty directory under the system's temporary directory, named after `prefix`, the
// process and the running test, so that ctest's parallel processes never share one. The
// caller removes it when the test ends.
inline std::filesystem::path FreshTestDirectory(const std::string& prefix) {
  const auto dir = std::filesystem::temp_directory_path() /
                   (prefix + "-" + std::to_string(::getpid()) + "-" +
                    ::testing::UnitTest::GetInstance()->current_test_info()->name());
  std::filesystem::remove_all(dir);
  return dir;
}

// Plaintext on loopback, a free port, state in `state_dir`, join and admin tokens named
// after `name`.
inline CoordinatorOptions LoopbackCoordinatorOptions(const std::filesystem::path& state_dir, const std::string& name) {
  CoordinatorOptions options;
  options.listen_address = "127.0.0.1:0";
  options.state_dir = state_dir.string();
  options.join_token = name + "-token";
  options.admin_token = name + "-admin-token";
  options.tls.insecure = true;
  return options;
}

}  // namespace tessera::server
