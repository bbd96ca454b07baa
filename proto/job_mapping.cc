#include "proto/job_mapping.h"

#include <cmath>

#include "base/escape.h"
#include "core/data/idx.h"

namespace tessera::wire {

ModelConfig ToModelConfig(const v1::JobSpec& spec) {
  ModelConfig config;
  if (!spec.model().name().empty()) config.name = spec.model().name();
  if (spec.model().hidden_size() > 0) {
    config.hidden.assign(spec.model().hidden().begin(), spec.model().hidden().end());
  }
  config.seed = spec.seed();
  return config;
}

Result<PartitionConfig> ToPartitionConfig(const v1::JobSpec& spec) {
  const v1::PartitionSpec& p = spec.data().partition();
  PartitionConfig config;
  switch (p.kind()) {
    case v1::PARTITION_UNSPECIFIED:
    case v1::PARTITION_IID: config.kind = PartitionConfig::kIid; break;
    case v1::PARTITION_DIRICHLET: config.kind = PartitionConfig::kDirichlet; break;
    case v1::PARTITION_LABEL_QUANTITY: config.kind = PartitionConfig::kLabelQuantity; break;
    case v1::PARTITION_QUANTITY: config.kind = PartitionConfig::kQuantity; break;
    default:
      return InvalidArgumentError("spec.data.partition.kind " + v1::PartitionKind_Name(p.kind()) +
                                  " has no shared partition");
  }
  config.parties = p.parties();
  config.beta = p.beta() > 0 ? p.beta() : 0.5;
  config.labels_per_party = p.labels_per_party() > 0 ? p.labels_per_party() : 2;
  config.seed = p.seed();
  return config;
}

TrainOptions ToTrainOptions(const v1::JobSpec& spec, uint32_t round, uint32_t party) {
  TrainOptions options;
  options.epochs = spec.local_epochs();
  options.batch_size = spec.batch_size();
  options.learning_rate = static_cast<float>(spec.optimizer().learning_rate());
  options.momentum = static_cast<float>(spec.optimizer().momentum());
  options.weight_decay = static_cast<float>(spec.optimizer().weight_decay());
  options.seed = spec.seed() * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(round) * 7919ull + party;
  return options;
}

std::string DatasetDirectory(const v1::JobSpec& spec) {
  return spec.data().path().empty() ? std::string(kDefaultFashionMnistDir) : spec.data().path();
}

namespace {

// A string from the spec as an error shows it: quoted, escaped and cut.
std::string Shown(const std::string& value) { return "\"" + EscapeUntrusted(value) + "\""; }

bool HasControlCharacters(const std::string& text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) return true;
  }
  return false;
}

}  // namespace

Status ValidateJobSpec(const v1::JobSpec& s) {
  auto bad = [](const std::string& field, const std::string& expected, const std::string& got) {
    return InvalidArgumentError("spec." + field + ": expected " + expected + ", got " + got);
  };
  if (s.name().size() > 128 || HasControlCharacters(s.name())) {
    return bad("name", "at most 128 bytes without control characters", Shown(s.name()));
  }
  if (s.data().path().size() > 4096 || HasControlCharacters(s.data().path())) {
    return bad("data.path", "a directory path of at most 4096 bytes without control characters",
               Shown(s.data().path()));
  }
  if (s.rounds() == 0) return bad("rounds", "at least 1", "0");
  if (s.clients_per_round() == 0) return bad("clients_per_round", "at least 1", "0");
  if (s.min_clients() == 0) return bad("min_clients", "at least 1", "0");
  if (s.min_clients() > s.clients_per_round()) {
    return bad("min_clients", "at most clients_per_round (" + std::to_string(s.clients_per_round()) + ")",
               std::to_string(s.min_clients()));
  }
  if (s.round_deadline_ms() == 0) return bad("round_deadline_ms", "a positive deadline", "0");
  if (s.local_epochs() == 0) return bad("local_epochs", "at least 1", "0");
  if (s.batch_size() == 0) return bad("batch_size", "at least 1", "0");
  const auto& o = s.optimizer();
  if (!o.name().empty() && o.name() != "sgd") return bad("optimizer.name", "\"sgd\"", Shown(o.name()));
  if (!(o.learning_rate() > 0) || !std::isfinite(o.learning_rate())) {
    return bad("optimizer.learning_rate", "a positive number", std::to_string(o.learning_rate()));
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) return bad("optimizer.momentum", "a value in [0, 1)", std::to_string(o.momentum()));
  if (!(o.weight_decay() >= 0)) return bad("optimizer.weight_decay", "a non-negative number", std::to_string(o.weight_decay()));
  if (!s.strategy().empty() && s.strategy() != "fedavg" && s.strategy() != "fedavgm") {
    return bad("strategy", "\"fedavg\" or \"fedavgm\"", Shown(s.strategy()));
  }
  const auto& server = s.server();
  if (!(server.learning_rate() >= 0 && server.learning_rate() <= 1e3)) {
    return bad("server.learning_rate", "a number in (0, 1000] (0: the default)", std::to_string(server.learning_rate()));
  }
  if (!(server.momentum() >= 0 && server.momentum() < 1)) {
    return bad("server.momentum", "a value in [0, 1)", std::to_string(server.momentum()));
  }
  if (s.strategy() != "fedavgm" && (server.learning_rate() != 0 || server.momentum() != 0)) {
    return bad("server", "no server options for strategy \"" + (s.strategy().empty() ? std::string("fedavg") : s.strategy()) +
                             "\" (they apply to fedavgm)", "learning_rate or momentum set");
  }
  const auto& m = s.model();
  if (m.name() != "simplecnn" && m.name() != "mlp") return bad("model.name", "\"simplecnn\" or \"mlp\"", Shown(m.name()));
  if (!s.data().dataset().empty() && s.data().dataset() != "fashion-mnist") {
    return bad("data.dataset", "\"fashion-mnist\"", Shown(s.data().dataset()));
  }
  const auto& p = s.data().partition();
  if (p.kind() != v1::PARTITION_LOCAL_FILES) {
    if (p.parties() == 0) return bad("data.partition.parties", "at least 1", "0");
    if (s.clients_per_round() > p.parties()) {
      return bad("clients_per_round", "at most data.partition.parties (" + std::to_string(p.parties()) + ")",
                 std::to_string(s.clients_per_round()));
    }
    auto partition = ToPartitionConfig(s);
    if (!partition.ok()) return partition.status();
  }
  if (!s.device().empty() && s.device() != "cpu" && s.device().rfind("emu:", 0) != 0 && s.device() != "cuda" &&
      s.device() != "xrt") {
    return bad("device", "a device class (cpu, cuda, xrt or emu:PROFILE)", Shown(s.device()));
  }
  if (!s.fallback_device().empty() && s.fallback_device() != "cpu" && s.fallback_device().rfind("emu:", 0) != 0 &&
      s.fallback_device() != "cuda" && s.fallback_device() != "xrt") {
    return bad("fallback_device", "a device class (cpu, cuda, xrt or emu:PROFILE)", Shown(s.fallback_device()));
  }
  const std::string& backend = s.collective_backend();
  if (!backend.empty() && backend != "auto" && backend != "gloo" && backend != "mpi" && backend != "nccl" &&
      backend != "p2p") {
    return bad("collective_backend", "auto, gloo, mpi, nccl or p2p", Shown(backend));
  }
  return Status::Ok();
}

}  // namespace tessera::wire
