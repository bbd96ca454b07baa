// The XRT backend as a loadable module: what factory.cc finds in libtessera_xrt.so.
// Internal to device/xrt/; everything else goes through factory.h.
//
// The module holds the device (xrt_device.cc) and the code that opens it, and links XRT's
// libxrt_coreutil (with Boost.Filesystem and libuuid, about 0.8 MB resident), so only a
// process that asks for an XRT device maps them (base/backend_module.h says how the module is
// found and how it resolves Tessera's own symbols). Its one entry point,
// tessera_xrt_module_v<N>, returns the table below. A change to the table or to the signature
// of anything it points to raises kXrtModuleAbiVersion and the entry point's name with it.
//
// Thread safety: the table is constant; its functions are as XrtViability, CreateXrtDevice and
// LastXrtGemmLaunch in factory.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "device/device.h"
#include "device/registry.h"
#include "device/xrt/factory.h"

namespace tessera {

inline constexpr uint32_t kXrtModuleAbiVersion = 1;
inline constexpr char kXrtModuleFile[] = "libtessera_xrt.so";
inline constexpr char kXrtModuleEntry[] = "tessera_xrt_module_v1";

struct XrtModule {
  uint32_t abi_version;  // kXrtModuleAbiVersion of the module's build
  uint32_t table_bytes;  // sizeof(XrtModule) of the module's build
  // Whether XRT opens options.device_index (the xclbin's path, `xclbin`, is checked already).
  Viability (*viability)(const XrtDeviceOptions& options);
  // Opens the device and loads `xclbin` (an existing file) onto it.
  Result<std::unique_ptr<Device>> (*create)(const XrtDeviceOptions& options, const std::string& xclbin);
  // As LastXrtGemmLaunch.
  std::optional<XrtGemmLaunch> (*last_gemm_launch)(Device& device);
};

}  // namespace tessera

extern "C" const tessera::XrtModule* tessera_xrt_module_v1();
