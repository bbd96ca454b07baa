#include "device/emulated/profile.h"
#include "base/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <toml++/toml.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>

#include "base/escape.h"

namespace tessera {
namespace {

constexpr uint64_t kGiB = uint64_t{1} << 30;
// A profile file is a few tables of figures: anything larger is not one (or is a device file
// such as /dev/zero that never ends), and is refused before it is parsed.
constexpr size_t kMaxProfileFileBytes = size_t{1} << 20;
// A profile's name becomes part of a device's name ("emu:<path.toml>#<name>") and is shown
// wherever the device is: a short word.
constexpr size_t kMaxProfileNameChars = 64;
// What a file's path and its words are shown as in messages: escaped, and cut this short.
constexpr size_t kShownPathChars = 256;
constexpr size_t kShownWordChars = 64;
// memory_bytes is read as a double and held as a uint64_t; from 2^63 up the conversion is
// undefined, and no pool size class reaches past it either.
constexpr double kMaxMemoryBytes = 9223372036854775808.0;  // 2^63, exclusive
// Bounds of the rates (TFLOPS, TOPS, GB/s, W): far past any chip, yet a peak x 1e12 stays
// finite; and a bandwidth of at least 1 KB/s, so that no copy is modelled as taking longer
// than the steady clock can count.
constexpr double kMaxRate = 1e9;
constexpr double kMinRate = 1e-6;
constexpr char kMinRateText[] = "0.000001";

std::set<Op> Without(std::set<Op> ops, std::initializer_list<Op> removed) {
  for (Op op : removed) ops.erase(op);
  return ops;
}

std::vector<DeviceProfile> MakeBuiltins() {
  const std::set<DType> all_dtypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8,
                                      DType::kInt32};
  std::vector<DeviceProfile> profiles;

  DeviceProfile a100;
  a100.name = "a100";
  a100.peak_tflops_fp32 = 19.5;
  a100.peak_tflops_fp16 = 312;
  a100.peak_tflops_bf16 = 312;
  a100.peak_tops_int8 = 624;
  a100.memory_bandwidth_gbps = 1555;
  a100.memory_bytes = 40 * kGiB;
  a100.host_link_gbps = 25;
  a100.power_watts = 400;
  a100.native_ops = AllOps();
  a100.dtypes = all_dtypes;
  a100.precision = DType::kFloat32;
  a100.notes = "NVIDIA A100 40GB SXM datasheet; PCIe 4.0 x16 taken as 25 GB/s effective";
  profiles.push_back(a100);

  DeviceProfile ascend;
  ascend.name = "ascend-910b";
  ascend.peak_tflops_fp32 = 80;  // assumption: not in the seed texts
  ascend.peak_tflops_fp16 = 320;
  ascend.peak_tflops_bf16 = 320;
  ascend.peak_tops_int8 = 640;
  ascend.memory_bandwidth_gbps = 1024;
  ascend.memory_bytes = 64 * kGiB;
  ascend.host_link_gbps = 25;
  ascend.power_watts = 400;
  // Assumption: the cube and vector units cover GEMM, convolutions and the element-wise ops;
  // the max-pool backward and the fused softmax cross-entropy run on the host (the seed texts
  // report partial operator coverage without naming the ops).
  ascend.native_ops = Without(AllOps(), {Op::kMaxPoolBackward, Op::kSoftmaxCrossEntropy});
  ascend.dtypes = all_dtypes;
  ascend.precision = DType::kFloat16;
  ascend.notes = "seed 002: 320 TFLOPS fp16, 1024 GB/s; fp32 peak, power and op coverage are assumptions";
  profiles.push_back(ascend);

  DeviceProfile alveo;
  alveo.name = "alveo-u55c";
  alveo.peak_tflops_fp32 = 0.5;  // assumption: DSP-limited fp32 GEMM kernel
  alveo.peak_tflops_fp16 = 1.0;
  alveo.peak_tflops_bf16 = 1.0;
  alveo.peak_tops_int8 = 16;
  alveo.memory_bandwidth_gbps = 460;
  alveo.memory_bytes = 16 * kGiB;
  alveo.host_link_gbps = 12;  // PCIe 4.0 x8
  alveo.power_watts = 150;
  // None of the layer-graph ops: the bitstream predates them, and each would be a kernel of its
  // own in the card's limited fabric.
  alveo.native_ops = {Op::kGemm, Op::kBiasAdd, Op::kRelu, Op::kFill};
  alveo.dtypes = all_dtypes;
  alveo.precision = DType::kFloat32;
  alveo.notes = "seed 003 and the U55C datasheet: 150 W, HBM2 460 GB/s, 16 GB; a GEMM kernel plus a few "
                "element-wise kernels in the bitstream (assumption); compute peaks are assumptions";
  profiles.push_back(alveo);

  DeviceProfile edge;
  edge.name = "edge-npu";
  edge.peak_tflops_fp32 = 0.25;  // assumption
  edge.peak_tflops_fp16 = 4;
  edge.peak_tflops_bf16 = 0;
  edge.peak_tops_int8 = 8;
  edge.memory_bandwidth_gbps = 34;
  edge.memory_bytes = 4 * kGiB;
  edge.host_link_gbps = 8;
  edge.power_watts = 15;
  // An inference NPU: forward ops native, every backward op and the optimiser on the host.
  // Of the layer-graph ops, the inference ones: activations, average pooling, both norms'
  // forwards (batch norm as one kernel, training statistics included) and the residual sum;
  // dropout, a training-only op (the identity at inference), falls back.
  edge.native_ops = {Op::kGemm,       Op::kConv2dForward,    Op::kBiasAdd,          Op::kRelu,
                     Op::kMaxPool,    Op::kFill,             Op::kCast,             Op::kActivation,
                     Op::kAvgPool,    Op::kBatchNormForward, Op::kLayerNormForward, Op::kAxpby};
  edge.dtypes = {DType::kFloat32, DType::kFloat16, DType::kInt8, DType::kInt32};
  edge.precision = DType::kFloat16;
  edge.notes = "seed 002: 15 W; LPDDR bandwidth, peaks and op coverage are assumptions";
  profiles.push_back(edge);

  DeviceProfile generic;
  generic.name = "generic";
  generic.peak_tflops_fp32 = 10;
  generic.peak_tflops_fp16 = 20;
  generic.peak_tflops_bf16 = 20;
  generic.peak_tops_int8 = 40;
  generic.memory_bandwidth_gbps = 200;
  generic.memory_bytes = 8 * kGiB;
  generic.host_link_gbps = 16;
  generic.power_watts = 100;
  generic.native_ops = AllOps();
  generic.dtypes = all_dtypes;
  generic.precision = DType::kFloat32;
  generic.notes = "a round-figure fp32 accelerator with full coverage";
  profiles.push_back(generic);
  return profiles;
}

std::string KnownNames() {
  std::string names;
  for (const auto& profile : BuiltinProfiles()) names += (names.empty() ? "" : ", ") + profile.name;
  return names;
}

// The file as messages name it: escaped and bounded.
std::string ShownPath(const std::string& path) { return EscapeUntrusted(path, kShownPathChars); }
// A word the file holds (a value, a key), quoted as messages show it.
std::string ShownWord(std::string_view word) { return QuoteUntrusted(word, kShownWordChars); }

bool IsProfileName(std::string_view name) {
  if (name.empty() || name.size() > kMaxProfileNameChars) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

// Reads the typed fields of one profile table, naming file, profile and field in every error.
class ProfileReader {
 public:
  ProfileReader(std::string path, std::string profile, const toml::table& table)
      : path_(std::move(path)), profile_(std::move(profile)), table_(table) {}

  Status Error(std::string_view field, const std::string& what) const {
    return InvalidArgumentError(ShownPath(path_) + ": profile " + ShownWord(profile_) + ": field " +
                                ShownWord(field) + " " + what);
  }

  Status Number(std::string_view field, bool required, double* out) const {
    const toml::node* node = table_.get(field);
    if (node == nullptr) return required ? Error(field, "is missing") : Status::Ok();
    std::optional<double> value = node->value<double>();
    if (!value || !(node->is_integer() || node->is_floating_point())) return Error(field, "must be a number");
    if (!std::isfinite(*value) || *value < 0) {
      std::ostringstream text;
      text << "must be a finite number >= 0, got " << *value;
      return Error(field, text.str());
    }
    *out = *value;
    return Status::Ok();
  }

  // A required byte count: an integer as written (past 2^53 a double would round it, and
  // toml++ will not give such an integer as one), or a number such as 16e9, below 2^63.
  Status Bytes(std::string_view field, uint64_t* out) const {
    const toml::node* node = table_.get(field);
    if (node == nullptr) return Error(field, "is missing");
    if (std::optional<int64_t> integer = node->value_exact<int64_t>()) {
      if (*integer < 0) return Error(field, "must be a number >= 0, got " + std::to_string(*integer));
      *out = static_cast<uint64_t>(*integer);
      return Status::Ok();
    }
    double value = 0;
    RETURN_IF_ERROR(Number(field, true, &value));
    if (!(value < kMaxMemoryBytes)) {
      std::ostringstream text;
      text << "must be below 2^63 bytes, got " << value;
      return Error(field, text.str());
    }
    *out = static_cast<uint64_t>(value);
    return Status::Ok();
  }

  Status Strings(std::string_view field, bool required, std::vector<std::string>* out, bool* present) const {
    const toml::node* node = table_.get(field);
    *present = node != nullptr;
    if (node == nullptr) return required ? Error(field, "is missing") : Status::Ok();
    const toml::array* array = node->as_array();
    if (array == nullptr) return Error(field, "must be an array of strings");
    for (const toml::node& element : *array) {
      std::optional<std::string> text = element.value<std::string>();
      if (!text) return Error(field, "must be an array of strings");
      out->push_back(*text);
    }
    return Status::Ok();
  }

  Status Text(std::string_view field, std::string* out, bool* present) const {
    const toml::node* node = table_.get(field);
    *present = node != nullptr;
    if (node == nullptr) return Status::Ok();
    std::optional<std::string> text = node->value<std::string>();
    if (!text) return Error(field, "must be a string");
    *out = *text;
    return Status::Ok();
  }

 private:
  std::string path_, profile_;
  const toml::table& table_;
};

Result<DType> ParseDType(std::string_view text) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8, DType::kInt32}) {
    if (DTypeName(dtype) == text) return dtype;
  }
  return InvalidArgumentError("is not a dtype (float32, float16, bfloat16, int8, int32): " + ShownWord(text));
}

Result<DeviceProfile> ReadProfile(const std::string& path, const std::string& name, const toml::table& table) {
  ProfileReader reader(path, name, table);
  static const std::set<std::string> kKnownFields = {
      "peak_tflops_fp32", "peak_tflops_fp16", "peak_tflops_bf16", "peak_tops_int8", "memory_bandwidth_gbps",
      "memory_bytes",     "host_link_gbps",   "power_watts",      "precision",      "native_ops",
      "dtypes",           "notes"};
  for (const auto& [key, value] : table) {
    if (kKnownFields.count(std::string(key.str())) == 0) return reader.Error(key.str(), "is not a profile field");
  }
  DeviceProfile profile;
  profile.name = name;
  RETURN_IF_ERROR(reader.Number("peak_tflops_fp32", true, &profile.peak_tflops_fp32));
  RETURN_IF_ERROR(reader.Number("peak_tflops_fp16", true, &profile.peak_tflops_fp16));
  profile.peak_tflops_bf16 = profile.peak_tflops_fp16;
  profile.peak_tops_int8 = 2 * profile.peak_tflops_fp16;
  RETURN_IF_ERROR(reader.Number("peak_tflops_bf16", false, &profile.peak_tflops_bf16));
  RETURN_IF_ERROR(reader.Number("peak_tops_int8", false, &profile.peak_tops_int8));
  RETURN_IF_ERROR(reader.Number("memory_bandwidth_gbps", true, &profile.memory_bandwidth_gbps));
  RETURN_IF_ERROR(reader.Bytes("memory_bytes", &profile.memory_bytes));
  RETURN_IF_ERROR(reader.Number("host_link_gbps", true, &profile.host_link_gbps));
  RETURN_IF_ERROR(reader.Number("power_watts", true, &profile.power_watts));

  bool present = false;
  std::string precision;
  RETURN_IF_ERROR(reader.Text("precision", &precision, &present));
  if (present) {
    bool matched = false;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt8}) {
      if (PrecisionName(dtype) == precision) profile.precision = dtype, matched = true;
    }
    if (!matched) return reader.Error("precision", "must be fp32, fp16, bf16 or int8, got " + ShownWord(precision));
  }

  std::vector<std::string> ops;
  RETURN_IF_ERROR(reader.Strings("native_ops", true, &ops, &present));
  for (const std::string& op_name : ops) {
    if (op_name == "all") {
      profile.native_ops = AllOps();
      continue;
    }
    bool matched = false;
    for (Op op : AllOps()) {
      if (OpName(op) == op_name) profile.native_ops.insert(op), matched = true;
    }
    if (!matched) return reader.Error("native_ops", "names an unknown op " + ShownWord(op_name));
  }

  std::vector<std::string> dtypes;
  RETURN_IF_ERROR(reader.Strings("dtypes", false, &dtypes, &present));
  if (present) {
    for (const std::string& text : dtypes) {
      Result<DType> dtype = ParseDType(text);
      if (!dtype.ok()) return reader.Error("dtypes", dtype.status().message());
      profile.dtypes.insert(*dtype);
    }
  } else {
    profile.dtypes = {DType::kFloat32, DType::kInt32, profile.precision};
  }
  std::string notes;
  RETURN_IF_ERROR(reader.Text("notes", &notes, &present));
  profile.notes = present ? notes : "loaded from " + path;
  RETURN_IF_ERROR(ValidateProfile(profile, ShownPath(path) + ": "));
  return profile;
}

}  // namespace

std::string_view PrecisionName(DType precision) {
  switch (precision) {
    case DType::kFloat32: return "fp32";
    case DType::kFloat16: return "fp16";
    case DType::kBFloat16: return "bf16";
    case DType::kInt8: return "int8";
    case DType::kInt32: return "int32";
  }
  return "unknown";
}

double DeviceProfile::PeakFlops(DType dtype) const {
  switch (dtype) {
    case DType::kFloat16: return peak_tflops_fp16 * 1e12;
    case DType::kBFloat16: return peak_tflops_bf16 * 1e12;
    case DType::kInt8: return peak_tops_int8 * 1e12;
    case DType::kFloat32:
    case DType::kInt32: return peak_tflops_fp32 * 1e12;
  }
  return 0;
}

double DeviceProfile::BalancePoint() const {
  return memory_bandwidth_gbps > 0 ? PeakFlops(precision) / (memory_bandwidth_gbps * 1e9) : 0;
}

const std::vector<DeviceProfile>& BuiltinProfiles() {
  static const std::vector<DeviceProfile> profiles = MakeBuiltins();
  return profiles;
}

Result<DeviceProfile> FindBuiltinProfile(const std::string& name) {
  for (const auto& profile : BuiltinProfiles()) {
    if (profile.name == name) return profile;
  }
  return InvalidArgumentError("unknown device profile " + QuoteUntrusted(name) + "; known profiles: " + KnownNames() +
                              ", or a TOML file path (emu:/path/profile.toml)");
}

Status ValidateProfile(const DeviceProfile& profile, const std::string& origin) {
  auto error = [&](std::string_view field, const std::string& what) {
    return InvalidArgumentError(origin + "profile " + ShownWord(profile.name) + ": field '" + std::string(field) + "' " +
                                what);
  };
  if (profile.name.empty()) return InvalidArgumentError(origin + "a profile has an empty name");
  const std::pair<const char*, double> non_negative[] = {
      {"peak_tflops_fp32", profile.peak_tflops_fp32}, {"peak_tflops_fp16", profile.peak_tflops_fp16},
      {"peak_tflops_bf16", profile.peak_tflops_bf16}, {"peak_tops_int8", profile.peak_tops_int8},
      {"power_watts", profile.power_watts}};
  for (const auto& [field, value] : non_negative) {
    if (!(value >= 0) || !std::isfinite(value)) return error(field, "must be a finite number >= 0");
    if (value > kMaxRate) return error(field, "must be at most " + std::to_string(int64_t(kMaxRate)));
  }
  const std::pair<const char*, double> positive[] = {{"memory_bandwidth_gbps", profile.memory_bandwidth_gbps},
                                                     {"host_link_gbps", profile.host_link_gbps},
                                                     {"memory_bytes", static_cast<double>(profile.memory_bytes)}};
  for (const auto& [field, value] : positive) {
    if (!(value > 0) || !std::isfinite(value)) return error(field, "must be a finite number > 0");
  }
  // The rates are scaled to per-second figures (x 1e9, x 1e12) and divided into byte and FLOP
  // counts: bounded on both sides, every modelled time stays finite.
  for (const auto& [field, value] : {positive[0], positive[1]}) {
    if (value < kMinRate || value > kMaxRate) {
      return error(field, "must lie between " + std::string(kMinRateText) + " and " +
                              std::to_string(int64_t(kMaxRate)));
    }
  }
  if (!(profile.PeakFlops(profile.precision) > 0)) {
    return error("precision", "is " + std::string(PrecisionName(profile.precision)) +
                                  " but the profile's peak for it is 0");
  }
  if (profile.dtypes.count(DType::kFloat32) == 0) {
    return error("dtypes", "must include float32 (the op set computes in float32)");
  }
  return Status::Ok();
}

Result<std::vector<DeviceProfile>> LoadProfiles(const std::string& path) {
  const std::string named = "device profile file " + QuoteUntrusted(path, kShownPathChars);
  // Opened without blocking and read only when a regular file: a FIFO or a terminal named as a
  // profile would otherwise hold its reader (a worker at start) until someone wrote to it, and
  // a directory would read as an empty file.
  const RegularFileOpen opened = OpenRegularFile(path);
  if (opened.open_errno != 0) return NotFoundError(named + " cannot be opened (" + std::strerror(opened.open_errno) + ")");
  if (!opened.ok()) return InvalidArgumentError(named + ": expected a regular file");
  const int fd = opened.fd;
  std::string text(kMaxProfileFileBytes + 1, '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = ::read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      return NotFoundError(named + " cannot be read (" + std::strerror(error) + ")");
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(got);
  if (text.size() > kMaxProfileFileBytes) {
    return InvalidArgumentError(named + " is larger than " + std::to_string(kMaxProfileFileBytes) + " bytes");
  }
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& parse_error) {
    std::ostringstream message;
    message << ShownPath(path) << ":" << parse_error.source().begin.line << ": "
            << EscapeUntrusted(parse_error.description(), kShownPathChars);
    return InvalidArgumentError(message.str());
  }
  std::vector<DeviceProfile> profiles;
  for (const auto& [key, node] : root) {
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      return InvalidArgumentError(ShownPath(path) + ": " + ShownWord(key.str()) +
                                  " must be a table [profile-name] holding a profile's fields");
    }
    if (!IsProfileName(key.str())) {
      return InvalidArgumentError(ShownPath(path) + ": profile " + ShownWord(key.str()) + ": expected a name of 1 to " +
                                  std::to_string(kMaxProfileNameChars) + " letters, digits, '-', '_' or '.'");
    }
    ASSIGN_OR_RETURN(DeviceProfile profile, ReadProfile(path, std::string(key.str()), *table));
    profiles.push_back(std::move(profile));
  }
  if (profiles.empty()) {
    return InvalidArgumentError(ShownPath(path) + ": holds no profile (expected a [profile-name] table)");
  }
  return profiles;
}

}  // namespace tessera
