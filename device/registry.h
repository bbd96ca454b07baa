// Creating devices by name. Each backend registers a factory with a priority and says at run
// time whether it can work here (a CUDA build on a machine without a GPU is built but not
// viable) and why not. Backends are reached only through this registry or their own
// factory.h; nothing else names a backend class.
//
// Thread safety: all functions may be called from any thread.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "device/device.h"

namespace tessera {

struct Viability {
  bool viable = false;
  std::string reason;  // why not, when not viable ("no CUDA device visible"); empty otherwise
};

struct DeviceBackend {
  std::string name;   // what CreateDevice is asked for: "cpu"
  int priority = 0;   // higher is preferred when a caller asks for the best viable device
  std::function<Viability()> viability;
  std::function<Result<std::unique_ptr<Device>>()> create;  // called only when viable
};

// Adds a backend; AlreadyExists if one with that name is registered.
Status RegisterDeviceBackend(DeviceBackend backend);
// Every registered backend, highest priority first.
std::vector<DeviceBackend> RegisteredDeviceBackends();

// Creates a device of the named backend with its default options. InvalidArgument naming
// the name and the known ones when unknown; Unavailable with the backend's reason when it is
// not viable here.
Result<std::unique_ptr<Device>> CreateDevice(const std::string& name);

// OK when `name` can name a device: a registered backend ("cpu", "cuda", "xrt",
// "emu:<profile>") or an emulated profile file ("emu:<path.toml>", read only when created).
// Otherwise InvalidArgument naming `flag`, the (escaped) name and the valid choices. Says
// nothing about viability: "cuda" passes on a machine without a GPU.
Status CheckDeviceName(const std::string& flag, const std::string& name);

}  // namespace tessera
