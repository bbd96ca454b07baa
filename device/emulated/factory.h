// The emulated backend's only public entry: a Device that models an accelerator described by a
// DeviceProfile (profile.h) while computing on the host.
//
// What it models. Ops in the profile's native_ops compute on the host CPU backend (created
// through the registry) and their results are rounded to the profile's precision (fp16, bf16
// or int8: per-tensor symmetric); optimiser updates, casts and fills are not rounded (fp32
// master weights, as in mixed-precision training). Ops outside native_ops behave as on a chip
// without them: they are host fallbacks, computed in float32 and accounted in placement()
// (calls, measured and modelled ms, bytes to the host and back).
//
// Modelled time. A native op takes max(flops / peak(precision), bytes / memory bandwidth),
// with bytes scaled to the precision's element size; a fallback takes bytes read / host link
// + its measured host time + bytes written / host link. Copies to and from the host take
// bytes / host link. With `pace_real_time`, every op and copy sleeps until the modelled time
// since the device was created (or since ResetEmulatedClock) has elapsed, so a slow emulated
// node is really slow; SetEmulatedPacingStop ends such a sleep early.
//
// Memory. Buffers are host memory behind a MemoryPool limited to the profile's
// memory_bytes; past it Allocate returns ResourceExhausted naming the device and the bytes.
//
// Names. Registry names are "emu:<profile>" for the built-ins and "emu:<path.toml>" (the file's
// only profile) or "emu:<path.toml>#<profile>" for files. capabilities().kind is that name;
// capabilities().name is "<kind> (emulated)"; capabilities().emulated is true.
//
// Thread safety: as Device (one thread at a time); placement() may be read from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "device/device.h"
#include "device/emulated/profile.h"
#include "device/registry.h"

namespace tessera {

struct EmulatedDeviceOptions {
  bool pace_real_time = false;     // sleep until modelled time has elapsed
  bool round_to_precision = true;  // false: native results stay float32 whatever the profile says
};

// `kind` is the registry name to report; empty means "emu:<profile.name>". InvalidArgument
// when the profile does not validate; Unavailable when no CPU backend can be created.
Result<std::unique_ptr<Device>> CreateEmulatedDevice(const DeviceProfile& profile,
                                                     const EmulatedDeviceOptions& options = {},
                                                     const std::string& kind = "");

// Resolves "emu:<profile>", "emu:<path.toml>" or "emu:<path.toml>#<profile>". InvalidArgument
// listing the known profiles for an unknown one; the profile file's errors as LoadProfiles.
Result<std::unique_ptr<Device>> CreateEmulatedDeviceByName(const std::string& name,
                                                           const EmulatedDeviceOptions& options = {});
// True when `name` starts with "emu:".
bool IsEmulatedDeviceName(const std::string& name);

// One registry entry per built-in profile ("emu:a100", ...): always viable, priority -10 (an
// emulation is never preferred to real hardware).
std::vector<DeviceBackend> EmulatedDeviceBackends();

// The profile behind an emulated device; null for any other device.
const DeviceProfile* EmulatedProfile(const Device& device);
// Restarts the pacing clock and the modelled time of an emulated device (and its placement
// account); no-op for other devices.
void ResetEmulatedClock(Device& device);
// Modelled milliseconds since creation or the last ResetEmulatedClock: ops and host copies.
double EmulatedModelledMs(const Device& device);
// Sets what a paced emulated device asks, every few milliseconds while it sleeps, whether to
// stop pacing (a cancel, a stop, a deadline passed): once `stop` returns true the sleep ends at
// once and the op returns; the modelled time is still counted. An empty function (the
// default) never stops. Called from the thread that runs the device's ops; no-op for other
// devices.
void SetEmulatedPacingStop(Device& device, std::function<bool()> stop);
// Whether an emulated device was created with pace_real_time; false for any other device.
bool EmulatedPacesRealTime(const Device& device);

}  // namespace tessera
