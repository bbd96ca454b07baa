// What the coordinator's tests on real state directories share: a fresh directory per test,
// and a coordinator's options for tests about jobs, state and shutdown (not about TLS).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "proto/transport_security.h"
#include "server/coordinator.h"
#include "tests/fresh_directory.h"

namespace tessera::server {

using ::tessera::testing::FreshTestDirectory;

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

// A plaintext channel to a coordinator on loopback `port` whose calls carry `admin_token`
// (operator calls), with gRPC's defaults unless `arguments` says otherwise.
inline Result<std::shared_ptr<grpc::Channel>> LoopbackAdminChannel(
    int port, const std::string& admin_token, const grpc::ChannelArguments& arguments = grpc::ChannelArguments()) {
  wire::ClientTls plaintext;
  plaintext.insecure = true;
  plaintext.admin_token = admin_token;
  return wire::MakeChannel("127.0.0.1:" + std::to_string(port), plaintext, arguments);
}

}  // namespace tessera::server
