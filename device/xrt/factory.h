// The XRT backend's only public entry: a Device on a Xilinx/AMD Alveo card through XRT's native
// C++ API (xrt::device, xrt::xclbin, xrt::bo, xrt::kernel, xrt::run).
//
// What runs where. The xclbin must hold a kernel (default "tessera_gemm", arguments as
// xclbin_writer.h's GemmKernelSpec); GEMM runs on it, every other op is a host fallback
// through the CPU backend, accounted in placement().
//
// Memory. Every buffer is an xrt::bo in the kernel's memory bank, mapped into host memory; the
// mapping is the master copy. A GEMM syncs its operands to the card before the run and its
// result back after it, so host fallbacks always see current data.
//
// Viability needs an xclbin (options or TESSERA_XRT_XCLBIN) and a device: a card, or XRT's
// no-op shim (XCL_EMULATION_MODE=noop, XILINX_XRT naming a root whose lib/ holds
// libxrt_noop.so.2). The no-op shim completes every run without computing: it proves the
// host-side control path (xclbin parsing, buffer allocation and sync, argument binding, run
// and wait), never the numbers; capabilities().name says "(no-op shim)" then. Under any
// emulation mode (XCL_EMULATION_MODE: noop, sw_emu, hw_emu) no card computes: the device is
// capabilities().emulated and its name says the mode.
//
// Thread safety: as Device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "base/status.h"
#include "device/device.h"
#include "device/registry.h"

namespace tessera {

struct XrtDeviceOptions {
  unsigned device_index = 0;
  std::string xclbin_path;                 // empty: $TESSERA_XRT_XCLBIN
  std::string kernel_name = "tessera_gemm";
};

// Why an XRT device cannot be created here (viable=false with the reason), without creating it.
Viability XrtViability(const XrtDeviceOptions& options = {});
// NotFound naming a missing xclbin; NotFound naming the kernel when the xclbin lacks it;
// Unavailable when no device can be opened or the backend's module cannot be loaded;
// Unimplemented in a build without XRT.
Result<std::unique_ptr<Device>> CreateXrtDevice(const XrtDeviceOptions& options = {});
// OK when TESSERA_XRT_XCLBIN is unset or empty, or names a regular file; otherwise
// InvalidArgument naming the variable and the file (escaped and bounded) and what is wrong. A
// worker asked for "xrt" checks it at start: an xclbin named but missing is a mistake to fix,
// not a card missing here to fall back from.
Status CheckXrtXclbinVariable();
// True when XRT runs on its no-op shim in this process.
bool XrtUsesNoopShim();
// XCL_EMULATION_MODE when it is set and not empty (XRT then runs on an emulation shim: noop,
// sw_emu, hw_emu), else empty: XRT drives a card.
std::string XrtEmulationMode();

// One buffer argument of a GEMM kernel run: the device address in the command XRT submitted,
// beside the address and size (bytes) of the buffer object the device bound to it.
struct XrtBufferArgument {
  uint64_t command_address = 0;
  uint64_t bound_address = 0;
  uint64_t bound_bytes = 0;
};

// The last GEMM kernel run of an XRT device, its scalar and buffer arguments read back from the
// run's command packet (the compute unit's register map at the kernel's argument offsets), so
// a test sees what reached the driver, not what the device meant to send. The command's fields
// (addresses, scalars) stay zero when XRT did not build an ERT_START_CU packet. On the no-op shim
// this is what can be checked of a GEMM: the shim completes the run without computing.
struct XrtGemmLaunch {
  uint64_t runs = 0;                  // kernel runs on this device so far
  int32_t m = 0, n = 0, k = 0;
  int32_t transpose_flags = 0;        // 1: a transposed, 2: b transposed
  float alpha = 0, beta = 0;
  XrtBufferArgument a, b, c;
};
// nullopt when `device` is not an XRT device or has run no GEMM kernel yet.
std::optional<XrtGemmLaunch> LastXrtGemmLaunch(Device& device);

// The registry's entry for "xrt": priority 5.
DeviceBackend XrtDeviceBackend();

}  // namespace tessera
