// libtessera_xrt.so's entry point (module.h). Built into the module with xrt_device.cc, never
// into tessera_device.
#include "device/xrt/module.h"

#include <xrt/experimental/xrt_xclbin.h>

#include <filesystem>

#include "base/escape.h"
#include "device/xrt/xrt_device.h"

namespace tessera {
namespace {

// What the xclbin, XRT and the environment say is shown escaped and bounded: a file's path and
// kernel names, an exception's text, XCL_EMULATION_MODE.
constexpr size_t kShownPathChars = 256;
constexpr size_t kShownNameChars = 64;
constexpr size_t kShownErrorChars = 512;
constexpr size_t kShownKernels = 16;

std::string Shown(std::string_view text, size_t max_chars) { return EscapeUntrusted(text, max_chars); }

Viability ModuleViability(const XrtDeviceOptions& options) {
  try {
    xrt::device device(options.device_index);
    (void)device;
  } catch (const std::exception& error) {
    return {false, "XRT cannot open device " + std::to_string(options.device_index) + ": " +
                       Shown(error.what(), kShownErrorChars)};
  }
  return {true, ""};
}

Result<std::unique_ptr<Device>> ModuleCreate(const XrtDeviceOptions& options, const std::string& path) {
  xrt::device device;
  xrt::uuid uuid;
  try {
    device = xrt::device(options.device_index);
  } catch (const std::exception& error) {
    return UnavailableError("XRT cannot open device " + std::to_string(options.device_index) + ": " +
                            Shown(error.what(), kShownErrorChars));
  }
  const std::string shown_path = QuoteUntrusted(path, kShownPathChars);
  const std::string shown_kernel = QuoteUntrusted(options.kernel_name, kShownNameChars);
  try {
    xrt::xclbin xclbin(path);
    bool has_kernel = false;
    std::string kernels;
    size_t listed = 0;
    for (const auto& kernel : xclbin.get_kernels()) {
      has_kernel = has_kernel || kernel.get_name() == options.kernel_name;
      if (listed++ < kShownKernels) {
        kernels += (kernels.empty() ? "" : ", ") + Shown(kernel.get_name(), kShownNameChars);
      } else if (listed == kShownKernels + 1) {
        kernels += ", ...";
      }
    }
    if (!has_kernel) {
      return NotFoundError("xclbin " + shown_path + " has no kernel " + shown_kernel + " (it has: " +
                           (kernels.empty() ? "none" : kernels) + ")");
    }
    uuid = device.load_xclbin(xclbin);
  } catch (const std::exception& error) {
    return InvalidArgumentError("xclbin " + shown_path + " cannot be loaded: " + Shown(error.what(), kShownErrorChars));
  }
  xrt::kernel kernel;
  try {
    kernel = xrt::kernel(device, uuid, options.kernel_name);
  } catch (const std::exception& error) {
    return NotFoundError("xclbin " + shown_path + ": kernel " + shown_kernel + ": " + Shown(error.what(), kShownErrorChars));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Device> host, CreateDevice("cpu"));
  std::string description = "xrt #" + std::to_string(options.device_index) + " (" +
                            Shown(options.kernel_name, kShownNameChars) + " from " +
                            Shown(std::filesystem::path(path).filename().string(), kShownNameChars) + ")";
  // An emulation shim (any XCL_EMULATION_MODE) stands in for the card: the device says so, and
  // which mode, so nothing it reports is mistaken for a card's.
  const std::string mode = XrtEmulationMode();
  if (mode == "noop") {
    description += " (no-op shim) (emulated: XCL_EMULATION_MODE=noop)";
  } else if (!mode.empty()) {
    description += " (emulated: XCL_EMULATION_MODE=" + Shown(mode, kShownNameChars) + ")";
  }
  return std::unique_ptr<Device>(std::make_unique<XrtDevice>(std::move(device), std::move(uuid), std::move(kernel),
                                                             std::move(description), !mode.empty(),
                                                             std::move(host)));
}

std::optional<XrtGemmLaunch> ModuleLastGemmLaunch(Device& device) {
  auto* xrt_device = dynamic_cast<XrtDevice*>(&device);
  if (xrt_device == nullptr) return std::nullopt;
  return xrt_device->last_gemm_launch();
}

constexpr XrtModule kModule{kXrtModuleAbiVersion, sizeof(XrtModule), &ModuleViability, &ModuleCreate,
                            &ModuleLastGemmLaunch};

}  // namespace
}  // namespace tessera

extern "C" __attribute__((visibility("default"))) const tessera::XrtModule* tessera_xrt_module_v1() {
  return &tessera::kModule;
}
