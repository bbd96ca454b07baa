#include "device/registry.h"

#include <algorithm>
#include <mutex>

#include "base/escape.h"
#include "device/cpu/factory.h"
#include "device/cuda/factory.h"
#include "device/emulated/factory.h"
#include "device/xrt/factory.h"

namespace tessera {
namespace {

struct Registry {
  std::mutex mutex;
  std::vector<DeviceBackend> backends;
};

Status AddLocked(Registry& registry, DeviceBackend backend) {
  for (const auto& existing : registry.backends) {
    if (existing.name == backend.name) {
      return AlreadyExistsError("device backend '" + backend.name + "' is already registered");
    }
  }
  registry.backends.push_back(std::move(backend));
  std::stable_sort(registry.backends.begin(), registry.backends.end(),
                   [](const DeviceBackend& a, const DeviceBackend& b) { return a.priority > b.priority; });
  return Status::Ok();
}

// The built-in backends register here explicitly (a static registrar in a static library
// would be dropped by the linker). Each backend's factory.h decides whether it is viable.
Registry& GlobalRegistry() {
  static Registry* registry = [] {
    auto* created = new Registry;
    (void)AddLocked(*created, CpuDeviceBackend());
    (void)AddLocked(*created, CudaDeviceBackend());
    (void)AddLocked(*created, XrtDeviceBackend());
    for (DeviceBackend& emulated : EmulatedDeviceBackends()) (void)AddLocked(*created, std::move(emulated));
    return created;
  }();
  return *registry;
}

}  // namespace

Status RegisterDeviceBackend(DeviceBackend backend) {
  Registry& registry = GlobalRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  return AddLocked(registry, std::move(backend));
}

std::vector<DeviceBackend> RegisteredDeviceBackends() {
  Registry& registry = GlobalRegistry();
  std::lock_guard<std::mutex> lock(registry.mutex);
  return registry.backends;
}

Result<std::unique_ptr<Device>> CreateDevice(const std::string& name) {
  std::vector<DeviceBackend> backends = RegisteredDeviceBackends();
  std::string known;
  for (const auto& backend : backends) {
    if (backend.name == name) {
      Viability viability = backend.viability();
      if (!viability.viable) {
        return UnavailableError("device backend '" + name + "' is not viable here: " + viability.reason);
      }
      return backend.create();
    }
    known += (known.empty() ? "" : ", ") + backend.name;
  }
  // Emulated devices are a family: "emu:<path.toml>" names a profile file, not an entry.
  if (IsEmulatedDeviceName(name)) return CreateEmulatedDeviceByName(name);
  // The name comes from a flag, a job or a command line: shown escaped, as CheckDeviceName does.
  return InvalidArgumentError("unknown device " + QuoteUntrusted(name) + "; known devices: " + known);
}

Status CheckDeviceName(const std::string& flag, const std::string& name) {
  std::vector<std::string> classes;
  std::string profiles;
  for (const auto& backend : RegisteredDeviceBackends()) {
    if (backend.name == name) return Status::Ok();
    if (IsEmulatedDeviceName(backend.name)) {
      profiles += (profiles.empty() ? "" : ", ") + backend.name.substr(4);
    } else {
      classes.push_back(backend.name);
    }
  }
  std::sort(classes.begin(), classes.end());
  std::string listed;
  for (const auto& c : classes) listed += c + ", ";
  // A profile file is read when the device is created; a built-in profile is listed above.
  if (IsEmulatedDeviceName(name) && name.find(".toml") != std::string::npos) return Status::Ok();
  return InvalidArgumentError(flag + ": unknown device " + QuoteUntrusted(name) + "; expected " + listed +
                              "emu:PROFILE (" + profiles + "), emu:FILE.toml or emu:FILE.toml#PROFILE");
}

}  // namespace tessera
