#include "device/xrt/factory.h"

#include <atomic>
#include <cstdlib>
#include <filesystem>

#include "base/escape.h"
#include "tessera/config.h"

#if TESSERA_HAVE_XRT
#include "base/backend_module.h"
#include "device/xrt/module.h"
#endif

namespace tessera {
namespace {

std::string XclbinPath(const XrtDeviceOptions& options) {
  if (!options.xclbin_path.empty()) return options.xclbin_path;
  const char* from_environment = std::getenv("TESSERA_XRT_XCLBIN");
  return from_environment == nullptr ? "" : from_environment;
}

// NotFound unless `path` is a regular file, naming it escaped and bounded (it comes from a
// variable of the environment). std::filesystem::exists would throw, and end the process, on a
// name too long, a loop of links or a directory it may not search.
Status CheckXclbinFile(const std::string& path) {
  const std::string named = "xclbin " + QuoteUntrusted(path, 256);
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (status.type() == std::filesystem::file_type::not_found) return NotFoundError(named + " does not exist");
  if (error) return NotFoundError(named + " cannot be read (" + error.message() + ")");
  if (!std::filesystem::is_regular_file(status)) return NotFoundError(named + " is not a regular file");
  return Status::Ok();
}

#if TESSERA_HAVE_XRT

// The module once LoadedXrtModule() has loaded it; null before.
std::atomic<const XrtModule*> loaded_module{nullptr};

// libtessera_xrt.so, loaded once, when an XRT device is first asked about with an xclbin in
// hand; the reason when it cannot be.
const Result<const XrtModule*>& LoadedXrtModule() {
  static const Result<const XrtModule*> loaded = [] {
    auto module = LoadModuleTable<XrtModule>("xrt", kXrtModuleFile, kXrtModuleEntry, kXrtModuleAbiVersion);
    if (module.ok()) loaded_module = *module;
    return module;
  }();
  return loaded;
}

#endif

}  // namespace

Status CheckXrtXclbinVariable() {
  const char* path = std::getenv("TESSERA_XRT_XCLBIN");
  if (path == nullptr || *path == '\0') return Status::Ok();
  if (Status file = CheckXclbinFile(path); !file.ok()) {
    return InvalidArgumentError("TESSERA_XRT_XCLBIN: " + file.message());
  }
  return Status::Ok();
}

bool XrtUsesNoopShim() { return XrtEmulationMode() == "noop"; }

std::string XrtEmulationMode() {
  const char* mode = std::getenv("XCL_EMULATION_MODE");
  return mode == nullptr ? "" : mode;
}

#if TESSERA_HAVE_XRT

// Without an xclbin nothing is loaded: a process that never names one never maps XRT.
Viability XrtViability(const XrtDeviceOptions& options) {
  const std::string path = XclbinPath(options);
  if (path.empty()) return {false, "no xclbin: set TESSERA_XRT_XCLBIN or XrtDeviceOptions::xclbin_path"};
  if (Status file = CheckXclbinFile(path); !file.ok()) return {false, file.message()};
  const Result<const XrtModule*>& module = LoadedXrtModule();
  if (!module.ok()) return {false, module.status().message()};
  return (*module)->viability(options);
}

Result<std::unique_ptr<Device>> CreateXrtDevice(const XrtDeviceOptions& options) {
  const std::string path = XclbinPath(options);
  if (path.empty()) return NotFoundError("XRT device: no xclbin given (set TESSERA_XRT_XCLBIN)");
  RETURN_IF_ERROR(CheckXclbinFile(path).WithContext("XRT device"));
  const Result<const XrtModule*>& module = LoadedXrtModule();
  if (!module.ok()) return UnavailableError("XRT device: " + module.status().message());
  return (*module)->create(options, path);
}

// An XRT device exists only once the module is loaded; before, no device is one (and asking
// loads nothing).
std::optional<XrtGemmLaunch> LastXrtGemmLaunch(Device& device) {
  const XrtModule* module = loaded_module.load();
  if (module == nullptr) return std::nullopt;
  return module->last_gemm_launch(device);
}

#else

std::optional<XrtGemmLaunch> LastXrtGemmLaunch(Device&) { return std::nullopt; }

Viability XrtViability(const XrtDeviceOptions&) { return {false, "built without XRT (TESSERA_HAVE_XRT=0)"}; }

Result<std::unique_ptr<Device>> CreateXrtDevice(const XrtDeviceOptions&) {
  return UnimplementedError("this build of Tessera has no XRT backend (TESSERA_HAVE_XRT=0)");
}

#endif

DeviceBackend XrtDeviceBackend() {
  DeviceBackend backend;
  backend.name = "xrt";
  backend.priority = 5;
  backend.viability = [] { return XrtViability(); };
  backend.create = [] { return CreateXrtDevice(); };
  return backend;
}

}  // namespace tessera
