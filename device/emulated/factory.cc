#include "device/emulated/factory.h"

#include "base/escape.h"
#include "device/emulated/emulated_device.h"

namespace tessera {
namespace {

constexpr char kPrefix[] = "emu:";
// Names and paths come from flags, jobs and command lines: messages show them escaped, and
// long enough that a path stays recognisable.
constexpr size_t kShownChars = 256;

std::string Quoted(const std::string& text) { return QuoteUntrusted(text, kShownChars); }

}  // namespace

bool IsEmulatedDeviceName(const std::string& name) { return name.rfind(kPrefix, 0) == 0; }

Result<std::unique_ptr<Device>> CreateEmulatedDevice(const DeviceProfile& profile,
                                                     const EmulatedDeviceOptions& options, const std::string& kind) {
  RETURN_IF_ERROR(ValidateProfile(profile, ""));
  ASSIGN_OR_RETURN(std::unique_ptr<Device> host, CreateDevice("cpu"));
  return std::unique_ptr<Device>(std::make_unique<EmulatedDevice>(
      profile, options, kind.empty() ? kPrefix + profile.name : kind, std::move(host)));
}

Result<std::unique_ptr<Device>> CreateEmulatedDeviceByName(const std::string& name,
                                                           const EmulatedDeviceOptions& options) {
  if (!IsEmulatedDeviceName(name)) {
    return InvalidArgumentError(Quoted(name) + " is not an emulated device name (expected emu:<profile>)");
  }
  const std::string rest = name.substr(sizeof(kPrefix) - 1);
  const size_t toml_end = rest.find(".toml");
  if (toml_end == std::string::npos) {
    Result<DeviceProfile> profile = FindBuiltinProfile(rest);
    if (!profile.ok()) return InvalidArgumentError("device " + Quoted(name) + ": " + profile.status().message());
    return CreateEmulatedDevice(*profile, options, name);
  }
  const std::string path = rest.substr(0, toml_end + 5);
  std::string wanted;
  if (toml_end + 5 < rest.size()) {
    if (rest[toml_end + 5] != '#') {
      return InvalidArgumentError("device " + Quoted(name) + ": expected emu:<path.toml> or emu:<path.toml>#<profile>");
    }
    wanted = rest.substr(toml_end + 6);
    // "x.toml#" names no profile: a typo, not "the file's only profile".
    if (wanted.empty()) {
      return InvalidArgumentError("device " + Quoted(name) + ": no profile name after '#' (expected emu:<path.toml>#<profile>)");
    }
  }
  ASSIGN_OR_RETURN(std::vector<DeviceProfile> profiles, LoadProfiles(path));
  if (wanted.empty()) {
    if (profiles.size() != 1) {
      return InvalidArgumentError("device " + Quoted(name) + ": " + Quoted(path) + " holds " +
                                  std::to_string(profiles.size()) + " profiles; name one with emu:" +
                                  EscapeUntrusted(path, kShownChars) + "#<profile>");
    }
    return CreateEmulatedDevice(profiles.front(), options, name);
  }
  std::string known;
  for (const DeviceProfile& profile : profiles) {
    if (profile.name == wanted) return CreateEmulatedDevice(profile, options, name);
    known += (known.empty() ? "" : ", ") + profile.name;
  }
  return InvalidArgumentError("device " + Quoted(name) + ": " + Quoted(path) + " has no profile " + Quoted(wanted) +
                              "; it holds: " + known);
}

std::vector<DeviceBackend> EmulatedDeviceBackends() {
  std::vector<DeviceBackend> backends;
  for (const DeviceProfile& profile : BuiltinProfiles()) {
    DeviceBackend backend;
    backend.name = kPrefix + profile.name;
    backend.priority = -10;
    backend.viability = [] { return Viability{true, ""}; };
    backend.create = [profile]() { return CreateEmulatedDevice(profile); };
    backends.push_back(std::move(backend));
  }
  return backends;
}

const DeviceProfile* EmulatedProfile(const Device& device) {
  const auto* emulated = dynamic_cast<const EmulatedDevice*>(&device);
  return emulated == nullptr ? nullptr : &emulated->profile();
}

void ResetEmulatedClock(Device& device) {
  if (auto* emulated = dynamic_cast<EmulatedDevice*>(&device)) emulated->ResetClock();
}

double EmulatedModelledMs(const Device& device) {
  const auto* emulated = dynamic_cast<const EmulatedDevice*>(&device);
  return emulated == nullptr ? 0 : emulated->modelled_ms();
}

void SetEmulatedPacingStop(Device& device, std::function<bool()> stop) {
  if (auto* emulated = dynamic_cast<EmulatedDevice*>(&device)) emulated->set_pacing_stop(std::move(stop));
}

bool EmulatedPacesRealTime(const Device& device) {
  const auto* emulated = dynamic_cast<const EmulatedDevice*>(&device);
  return emulated != nullptr && emulated->paces_real_time();
}

}  // namespace tessera
