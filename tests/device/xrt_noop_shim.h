// Test support for the XRT backend without a card: XRT's no-op shim (Debian's libxrt1 ships
// libxrt_noop.so.2) and a generated xclbin holding the `tessera_gemm` kernel. The shim loads the
// xclbin, allocates and syncs buffer objects and completes every kernel run without computing
// anything, so tests on it may check the host-side control path and the host fallbacks' numbers,
// never a native op's numbers.
//
// Thread safety: call from the test's main thread (it changes the process environment).
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>
#include <utility>

#include "base/status.h"
#include "tessera/config.h"
#if TESSERA_HAVE_XRT
#include "device/xrt/xclbin_writer.h"
#endif

namespace tessera::test_support {

inline constexpr char kXrtNoopShimLibrary[] = "/usr/lib/x86_64-linux-gnu/libxrt_noop.so.2";

struct XrtNoopShim {
  bool ready = false;
  std::string reason;       // why not, when not ready: names what is missing
  std::string xclbin_path;  // the generated xclbin, when ready
};

// Points XRT at its no-op shim for the rest of this process: XCL_EMULATION_MODE=noop and
// XILINX_XRT naming a root under the test's temporary directory whose lib/ links the shim
// (XRT loads $XILINX_XRT/lib/libxrt_noop.so.2 in that mode). XRT picks its shim once per
// process, so this is never undone. Then writes the GEMM kernel's xclbin there. Not ready
// when a card run is configured (TESSERA_XRT_XCLBIN set, XCL_EMULATION_MODE not).
inline XrtNoopShim PrepareXrtNoopShim() {
  XrtNoopShim shim;
#if TESSERA_HAVE_XRT
  if (std::getenv("XCL_EMULATION_MODE") == nullptr && std::getenv("TESSERA_XRT_XCLBIN") != nullptr) {
    shim.reason = "TESSERA_XRT_XCLBIN is set without XCL_EMULATION_MODE: this process runs XRT on a card, "
                  "and XRT picks its shim once per process";
    return shim;
  }
  if (!std::filesystem::exists(kXrtNoopShimLibrary)) {
    shim.reason = std::string("XRT's no-op shim is not installed (") + kXrtNoopShimLibrary + ")";
    return shim;
  }
  const std::filesystem::path root = std::filesystem::path(::testing::TempDir()) / "tessera_xrt_root";
  std::error_code error;
  std::filesystem::create_directories(root / "lib", error);
  if (error) {
    shim.reason = "cannot create " + (root / "lib").string() + ": " + error.message();
    return shim;
  }
  // ctest runs several test processes at once over this directory: a link another process
  // made first is as good as ours, and the xclbin is renamed into place whole.
  const std::filesystem::path link = root / "lib" / "libxrt_noop.so.2";
  if (!std::filesystem::exists(link)) std::filesystem::create_symlink(kXrtNoopShimLibrary, link, error);
  if (error && std::filesystem::exists(link)) error.clear();
  if (error) {
    shim.reason = "cannot link " + link.string() + " to the shim: " + error.message();
    return shim;
  }
  setenv("XILINX_XRT", root.c_str(), 1);
  setenv("XCL_EMULATION_MODE", "noop", 1);
  shim.xclbin_path = (root / "tessera_gemm.xclbin").string();
  const std::string staging = shim.xclbin_path + "." + std::to_string(::getpid());
  const Status written = xrt_backend::WriteXclbin(xrt_backend::GemmKernelSpec(), staging);
  if (!written.ok()) {
    shim.reason = written.ToString();
    return shim;
  }
  std::filesystem::rename(staging, shim.xclbin_path, error);
  if (error) {
    shim.reason = "cannot rename " + staging + " into place: " + error.message();
    return shim;
  }
  shim.ready = true;
#else
  shim.reason = "built without XRT (TESSERA_HAVE_XRT=0)";
#endif
  return shim;
}

// Sets an environment variable for its lifetime and restores the previous value (or its
// absence) after, so one test's xclbin does not leak into the next.
class ScopedEnvironmentVariable {
 public:
  ScopedEnvironmentVariable(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* previous = std::getenv(name_.c_str())) previous_ = previous;
    setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvironmentVariable() {
    if (previous_) {
      setenv(name_.c_str(), previous_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnvironmentVariable(const ScopedEnvironmentVariable&) = delete;
  ScopedEnvironmentVariable& operator=(const ScopedEnvironmentVariable&) = delete;

 private:
  std::string name_;
  std::optional<std::string> previous_;
};

}  // namespace tessera::test_support
