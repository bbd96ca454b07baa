#include "device/xrt/factory.h"

#include <cstdlib>
#include <filesystem>

#include "tessera/config.h"

#if TESSERA_HAVE_XRT
#include <xrt/experimental/xrt_xclbin.h>
#include "device/xrt/xrt_device.h"
#endif

namespace tessera {
namespace {

std::string XclbinPath(const XrtDeviceOptions& options) {
  if (!options.xclbin_path.empty()) return options.xclbin_path;
  const char* from_environment = std::getenv("TESSERA_XRT_XCLBIN");
  return from_environment == nullptr ? "" : from_environment;
}

}  // namespace

bool XrtUsesNoopShim() {
  const char* mode = std::getenv("XCL_EMULATION_MODE");
  return mode != nullptr && std::string(mode) == "noop";
}

#if TESSERA_HAVE_XRT

Viability XrtViability(const XrtDeviceOptions& options) {
  const std::string path = XclbinPath(options);
  if (path.empty()) return {false, "no xclbin: set TESSERA_XRT_XCLBIN or XrtDeviceOptions::xclbin_path"};
  if (!std::filesystem::exists(path)) return {false, "xclbin '" + path + "' does not exist"};
  try {
    xrt::device device(options.device_index);
    (void)device;
  } catch (const std::exception& error) {
    return {false, "XRT cannot open device " + std::to_string(options.device_index) + ": " + error.what()};
  }
  return {true, ""};
}

Result<std::unique_ptr<Device>> CreateXrtDevice(const XrtDeviceOptions& options) {
  const std::string path = XclbinPath(options);
  if (path.empty()) return NotFoundError("XRT device: no xclbin given (set TESSERA_XRT_XCLBIN)");
  if (!std::filesystem::exists(path)) return NotFoundError("XRT device: xclbin '" + path + "' does not exist");
  xrt::device device;
  xrt::uuid uuid;
  try {
    device = xrt::device(options.device_index);
  } catch (const std::exception& error) {
    return UnavailableError("XRT cannot open device " + std::to_string(options.device_index) + ": " + error.what());
  }
  try {
    xrt::xclbin xclbin(path);
    bool has_kernel = false;
    std::string kernels;
    for (const auto& kernel : xclbin.get_kernels()) {
      kernels += (kernels.empty() ? "" : ", ") + kernel.get_name();
      has_kernel = has_kernel || kernel.get_name() == options.kernel_name;
    }
    if (!has_kernel) {
      return NotFoundError("xclbin '" + path + "' has no kernel '" + options.kernel_name + "' (it has: " +
                           (kernels.empty() ? "none" : kernels) + ")");
    }
    uuid = device.load_xclbin(xclbin);
  } catch (const std::exception& error) {
    return InvalidArgumentError("xclbin '" + path + "' cannot be loaded: " + error.what());
  }
  xrt::kernel kernel;
  try {
    kernel = xrt::kernel(device, uuid, options.kernel_name);
  } catch (const std::exception& error) {
    return NotFoundError("xclbin '" + path + "': kernel '" + options.kernel_name + "': " + error.what());
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Device> host, CreateDevice("cpu"));
  std::string description = "xrt #" + std::to_string(options.device_index) + " (" + options.kernel_name + " from " +
                            std::filesystem::path(path).filename().string() + ")";
  if (XrtUsesNoopShim()) description += " (no-op shim)";
  return std::unique_ptr<Device>(std::make_unique<XrtDevice>(std::move(device), std::move(uuid), std::move(kernel),
                                                             std::move(description), std::move(host)));
}

std::optional<XrtGemmLaunch> LastXrtGemmLaunch(Device& device) {
  auto* xrt_device = dynamic_cast<XrtDevice*>(&device);
  if (xrt_device == nullptr) return std::nullopt;
  return xrt_device->last_gemm_launch();
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
