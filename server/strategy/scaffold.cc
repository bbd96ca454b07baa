// SCAFFOLD (Karimireddy, Kale, Mohri, Reddi, Stich, Suresh, "SCAFFOLD: Stochastic Controlled
// Averaging for Federated Learning", ICML 2020), option II, server learning rate 1.
//
// The server keeps a control variate c and, per party (seat), the client's c_i; both have the
// model's layout. A participant downloads the model with c and its own c_i (DownloadSets),
// corrects each local gradient by c - c_i, and uploads its model delta and its variate's
// change delta c_i = c_i+ - c_i (the payload set "control_delta"; the client's step is in
// core/train/client_algorithms.h). With S the round's accepted clients and N the parties:
//   x <- x + (1/|S|) sum delta y_i,   c <- c + (1/N) sum delta c_i,   c_i <- c_i + delta c_i.
// The means are unweighted, as in the paper (NIID-Bench weights the model's by samples).
// Clients that did not take part keep their c_i: sub-sampling is exact.
//
// The model's buffers (a batch norm's running statistics) are no sum of gradient steps: no
// optimiser steps them and the client's correction leaves them alone (core/train/trainer.h).
// They take FedAvg's step, x <- x + sum n_i delta y_i / sum n_i with n_i the client's samples,
// and their variates stay zero: the buffers' part of a client's control_delta is ignored.
//
// A client's variate change is bounded by its delta (ScaffoldRound::CheckControlChange): an
// honest one is (x - y_i) / (K lr) - c, so one from a hostile client, which would reach c and
// through it every client's next corrections, is refused unless it is one of those.
//
// Where the variates live: with the coordinator, in this strategy's state. They are then in
// the same checkpoint file as the model of the same round, so a restart of the coordinator
// resumes bit for bit, and a seat's c_i follows the seat, not the worker process: a worker
// that restarts, loses its disk or is replaced by another under the seat's name downloads
// the variate it needs. The cost is N + 1 model-sized tensors on the coordinator (bounded at
// submission, proto/job_mapping.h) and one more model-sized download per participant.
//
// State layout (float32, under the checkpoint's "strategy/" prefix): "control/server/NAME" for
// every model tensor, then "control/party/P/NAME" for each party P that has taken part, in
// increasing P. A party that never took part has c_i = 0. A buffer's entries are zero (and
// restored as zero from a checkpoint that holds other values there).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "base/escape.h"
#include "base/format.h"
#include "server/strategy/factories.h"

namespace tessera::server {
namespace {

constexpr char kServerPrefix[] = "control/server/";
constexpr char kPartyPrefix[] = "control/party/";
constexpr char kControlDelta[] = "control_delta";
constexpr char kServerControlSet[] = "server_control";
constexpr char kClientControlSet[] = "client_control";

std::string PartyPrefix(uint32_t party) { return kPartyPrefix + std::to_string(party) + "/"; }

// Sums of the round's model deltas (unweighted, in double; sample-weighted for a buffer) and
// control variate changes (the parameters' alone), and each participant's change by party for
// its own c_i.
class ScaffoldRound final : public RoundAggregate {
 public:
  // `server_control`: c as the participants downloaded it. `is_buffer`: per tensor of `layout`.
  ScaffoldRound(const TensorSet& layout, uint32_t parties, std::vector<bool> is_buffer, double learning_rate,
                TensorSet server_control)
      : locks_(layout.size()),
        parties_(parties),
        is_buffer_(std::move(is_buffer)),
        learning_rate_(learning_rate),
        server_control_(std::move(server_control)) {
    for (size_t i = 0; i < layout.size(); ++i) {
      model_sums_.emplace_back(layout[i].values.size(), 0.0);
      control_sums_.emplace_back(is_buffer_[i] ? 0 : layout[i].values.size(), 0.0);
    }
  }

  Status Fold(const ClientUpdate& update) override {
    if (update.samples == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
    if (update.scale != 1.0) return InvalidArgumentError("this aggregate weighs no update by staleness (scale must be 1)");
    if (update.payload == nullptr || update.payload->count(kControlDelta) == 0) {
      return InvalidArgumentError("scaffold needs the update's set 'control_delta' (its control variate's change)");
    }
    const TensorSet& delta = *update.delta;
    const TensorSet& sent = update.payload->at(kControlDelta);
    for (const auto& [set, name] : {std::pair<const TensorSet*, const char*>{&delta, "delta"}, {&sent, kControlDelta}}) {
      if (set->size() != model_sums_.size()) {
        return InvalidArgumentError(std::string("set '") + name + "' has " + std::to_string(set->size()) +
                                    " tensors, expected " + std::to_string(model_sums_.size()));
      }
      for (size_t i = 0; i < set->size(); ++i) {
        if ((*set)[i].values.size() != model_sums_[i].size()) {
          return InvalidArgumentError(std::string("set '") + name + "': tensor '" + (*set)[i].name + "' has " +
                                      std::to_string((*set)[i].values.size()) + " values, expected " +
                                      std::to_string(model_sums_[i].size()));
        }
      }
    }
    if (update.party >= parties_) {
      return InvalidArgumentError("update from party " + std::to_string(update.party) + ", but the job has " +
                                  std::to_string(parties_) + " parties");
    }
    if (!(update.clip_factor > 0 && update.clip_factor <= 1)) {
      return InvalidArgumentError("clip factor " + FormatNumber(update.clip_factor) + ": expected one in (0, 1]");
    }
    // The change is checked against the delta the client sent, before the round clipped it.
    RETURN_IF_ERROR(CheckControlChange(delta, sent, 1.0 / update.clip_factor));
    std::optional<TensorSet> scaled;
    if (update.clip_factor != 1.0) scaled = ClippedChange(sent, update.clip_factor);
    const TensorSet& control = scaled ? *scaled : sent;
    const double samples = static_cast<double>(update.samples);
    {
      std::lock_guard<std::mutex> lock(totals_mu_);
      if (!changes_.emplace(update.party, control).second) {
        return InvalidArgumentError("party " + std::to_string(update.party) + " has already been folded into this round");
      }
      ++updates_;
      samples_ += samples;
    }
    for (size_t i = 0; i < delta.size(); ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      double* model_sum = model_sums_[i].data();
      const float* dy = delta[i].values.data();
      if (is_buffer_[i]) {
        for (size_t j = 0; j < model_sums_[i].size(); ++j) model_sum[j] += samples * dy[j];
        continue;
      }
      double* control_sum = control_sums_[i].data();
      const float* dc = control[i].values.data();
      for (size_t j = 0; j < model_sums_[i].size(); ++j) {
        model_sum[j] += dy[j];
        control_sum[j] += dc[j];
      }
    }
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(totals_mu_);
    return updates_;
  }

  // Only after every fold has returned.
  const std::vector<std::vector<double>>& model_sums() const { return model_sums_; }
  const std::vector<std::vector<double>>& control_sums() const { return control_sums_; }
  const std::map<uint32_t, TensorSet>& changes() const { return changes_; }
  double samples() const { return samples_; }

 private:
  // The bound on a variate's change, over the model's parameters. A client computes its change
  // from the delta it sends (core/train/client_algorithms.h): with x the round's model, y_i its
  // trained one and K >= 1 its steps at learning rate lr,
  //   change = c_i+ - c_i = (x - y_i) / (K lr) - c,   so   ||change + c|| = ||delta|| / (K lr) <= ||delta|| / lr.
  // A change beyond that is refused: it is not one computed from this delta, and folded, (1 / N)
  // of it would reach c and all of it the party's c_i. The delta is the one folded, within
  // max_update_norm (M) or clipped to it, the change then scaled with it (ClippedChange), so
  // every folded change has ||change + c|| <= M / lr,
  // and c <- c + (1 / N) sum change = (1 - |S| / N) c + (1 / N) sum (change + c) stays within
  // M / lr however many rounds a hostile client takes part in: no correction can explode.
  // An honest client's change misses the identity by its rounding alone: the change computed in
  // double and stored as float (2^-24 of |change| <= |change + c| + |c| per value), the delta
  // rounded likewise, the learning rate as float. kSlack of (||delta|| / lr + ||c||), fifty times
  // their sum, covers them, and lets c grow to (1 + kSlack) / (1 - kSlack) M / lr at most.
  // `unclip`: 1 over the factor the round clipped the delta by (ClientUpdate::clip_factor), so
  // that the bound is the one of the delta the client sent and computed its change from.
  Status CheckControlChange(const TensorSet& delta, const TensorSet& control, double unclip) const {
    constexpr double kSlack = 1e-5;
    double delta_squares = 0, change_squares = 0, sum_squares = 0, server_squares = 0;
    for (size_t i = 0; i < delta.size(); ++i) {
      if (is_buffer_[i]) continue;
      const float* dy = delta[i].values.data();
      const float* dc = control[i].values.data();
      const float* c = server_control_[i].values.data();
      for (size_t j = 0; j < delta[i].values.size(); ++j) {
        const double sum = static_cast<double>(dc[j]) + c[j];
        delta_squares += static_cast<double>(dy[j]) * dy[j];
        change_squares += static_cast<double>(dc[j]) * dc[j];
        sum_squares += sum * sum;
        server_squares += static_cast<double>(c[j]) * c[j];
      }
    }
    const double delta_norm = std::sqrt(delta_squares) * unclip, sum_norm = std::sqrt(sum_squares);
    const double honest = delta_norm / learning_rate_;
    const double bound = honest + kSlack * (honest + std::sqrt(server_squares));
    if (sum_norm <= bound) return Status::Ok();
    return InvalidArgumentError(
        std::string("set '") + kControlDelta + "': the control variate's change plus the server's c has L2 norm " +
        FormatNumber(sum_norm) + " over the model's parameters (the change alone " +
        FormatNumber(std::sqrt(change_squares)) + "), expected at most " + FormatNumber(bound) +
        ": a change computed from this delta is (x - y_i) / (K lr) - c, so the sum is at most the delta's L2 norm " +
        FormatNumber(delta_norm) + " over the learning rate " + FormatNumber(learning_rate_) + " (K >= 1 local steps)");
  }

  // The change a client would have computed from its delta clipped by `factor` (s): with its
  // change (x - y_i) / (K lr) - c from the delta it sent, s (x - y_i) / (K lr) - c =
  // s (change + c) - c. Its ||change + c|| is then s times the sent one's, within the clipped
  // delta's bound, so c stays within max_update_norm / lr as without clipping.
  TensorSet ClippedChange(const TensorSet& sent, double factor) const {
    TensorSet scaled = sent;
    for (size_t i = 0; i < scaled.size(); ++i) {
      if (is_buffer_[i]) continue;  // ignored: a buffer keeps no variate
      float* dc = scaled[i].values.data();
      const float* c = server_control_[i].values.data();
      for (size_t j = 0; j < scaled[i].values.size(); ++j) {
        dc[j] = static_cast<float>(factor * (static_cast<double>(dc[j]) + c[j]) - c[j]);
      }
    }
    return scaled;
  }

  std::vector<std::vector<double>> model_sums_, control_sums_;  // a buffer's control sum is empty
  std::vector<std::mutex> locks_;  // one per tensor, guarding both sums
  const uint32_t parties_;
  const std::vector<bool> is_buffer_;  // per tensor
  const double learning_rate_;         // the clients' (spec.optimizer.learning_rate)
  const TensorSet server_control_;     // c, as the round's participants downloaded it
  mutable std::mutex totals_mu_;
  std::map<uint32_t, TensorSet> changes_;  // party -> delta c_i
  uint64_t updates_ = 0;
  double samples_ = 0;  // the folded updates' samples, the buffers' weights
};

class Scaffold final : public Strategy {
 public:
  Scaffold(const TensorSet& layout, uint32_t parties, const std::vector<std::string>& buffers, double learning_rate)
      : parties_(parties), learning_rate_(learning_rate), is_buffer_(BufferMask(layout, buffers)) {
    for (const auto& t : layout) {
      NamedTensor zero{t.name, t.shape, std::vector<float>(t.values.size(), 0.0f)};
      layout_.push_back(zero);
      zero.name = kServerPrefix + t.name;
      state_.push_back(std::move(zero));
    }
  }

  std::string_view name() const override { return "scaffold"; }

  Status Restore(TensorSet state) override {
    if (state.empty()) return Status::Ok();  // a fresh start: every variate zero
    std::map<uint32_t, size_t> index;
    RETURN_IF_ERROR(Parse(state, &index));
    // A buffer keeps no variate: whatever the checkpoint holds there becomes zero.
    for (size_t at = 0; at < state.size(); at += layout_.size()) {
      for (size_t i = 0; i < layout_.size(); ++i) {
        if (is_buffer_[i]) std::fill(state[at + i].values.begin(), state[at + i].values.end(), 0.0f);
      }
    }
    state_ = std::move(state);
    party_first_ = std::move(index);
    return Status::Ok();
  }
  const TensorSet& state() const override { return state_; }

  std::vector<std::string> PayloadSets() const override { return {kControlDelta}; }
  std::vector<std::string> DownloadSets() const override { return {kServerControlSet, kClientControlSet}; }

  TensorSet DownloadTensors(uint32_t party) const override {
    const size_t n = layout_.size();
    TensorSet sets;
    sets.reserve(2 * n);
    for (size_t i = 0; i < n; ++i) {
      sets.push_back({std::string(kServerControlSet) + "/" + layout_[i].name, layout_[i].shape, state_[i].values});
    }
    auto it = party_first_.find(party);
    for (size_t i = 0; i < n; ++i) {
      const std::vector<float>& values = it == party_first_.end() ? layout_[i].values : state_[it->second + i].values;
      sets.push_back({std::string(kClientControlSet) + "/" + layout_[i].name, layout_[i].shape, values});
    }
    return sets;
  }

  // Reads c besides the layout and options (Strategy::BeginRound): scaffold never runs
  // asynchronously, and its participants' downloads are encoded from the same state.
  std::unique_ptr<RoundAggregate> BeginRound(const TensorSet& global) const override {
    TensorSet server_control(state_.begin(), state_.begin() + static_cast<std::ptrdiff_t>(layout_.size()));
    return std::make_unique<ScaffoldRound>(global, parties_, is_buffer_, learning_rate_, std::move(server_control));
  }

  Result<StrategyStep> Finish(const TensorSet& global, const RoundAggregate& aggregate) const override {
    const auto* round = dynamic_cast<const ScaffoldRound*>(&aggregate);
    if (round == nullptr) return InternalError("scaffold: the round's aggregate was not opened by this strategy");
    if (aggregate.updates() == 0) return FailedPreconditionError("no update to aggregate");
    const size_t n = layout_.size();
    if (global.size() != n) {
      return InternalError("scaffold: the model has " + std::to_string(global.size()) + " tensors, its variates " +
                           std::to_string(n));
    }
    const double clients = static_cast<double>(aggregate.updates());
    StrategyStep step;
    step.model = global;
    for (size_t i = 0; i < n; ++i) {
      // The unweighted mean; a buffer's sample-weighted one.
      const double weight = is_buffer_[i] ? round->samples() : clients;
      float* x = step.model[i].values.data();
      const double* sum = round->model_sums()[i].data();
      for (size_t j = 0; j < step.model[i].values.size(); ++j) x[j] = static_cast<float>(x[j] + sum[j] / weight);
    }
    // c += (|S| / N) mean delta c_i = (1 / N) sum delta c_i; a buffer's stays zero.
    step.state.reserve(state_.size() + n * round->changes().size());
    for (size_t i = 0; i < n; ++i) {
      NamedTensor c = state_[i];
      const double* sum = round->control_sums()[i].data();
      if (!is_buffer_[i]) {
        for (size_t j = 0; j < c.values.size(); ++j) c.values[j] = static_cast<float>(c.values[j] + sum[j] / parties_);
      }
      step.state.push_back(std::move(c));
    }
    // Every party's c_i, in increasing party order: the participants' moved by their change.
    std::set<uint32_t> parties;
    for (const auto& [party, first] : party_first_) parties.insert(party);
    for (const auto& [party, change] : round->changes()) parties.insert(party);
    for (uint32_t party : parties) {
      auto kept = party_first_.find(party);
      auto changed = round->changes().find(party);
      for (size_t i = 0; i < n; ++i) {
        NamedTensor ci{PartyPrefix(party) + layout_[i].name, layout_[i].shape,
                       kept == party_first_.end() ? layout_[i].values : state_[kept->second + i].values};
        if (changed != round->changes().end() && !is_buffer_[i]) {
          const float* dc = changed->second[i].values.data();
          for (size_t j = 0; j < ci.values.size(); ++j) {
            ci.values[j] = static_cast<float>(static_cast<double>(ci.values[j]) + dc[j]);
          }
        }
        step.state.push_back(std::move(ci));
      }
    }
    return step;
  }

  void Adopt(TensorSet state) override {
    std::map<uint32_t, size_t> index;
    if (!Parse(state, &index).ok()) return;  // only Finish's own states are adopted
    state_ = std::move(state);
    party_first_ = std::move(index);
  }

 private:
  // Checks a state's layout (see the file's comment) and finds where each party's c_i starts.
  Status Parse(const TensorSet& state, std::map<uint32_t, size_t>* index) const {
    const std::string what = "scaffold state in the checkpoint";
    const size_t n = layout_.size();
    if (n == 0 || state.size() < n || state.size() % n != 0) {
      return InvalidArgumentError(what + ": " + std::to_string(state.size()) + " tensors, expected the server's " +
                                  std::to_string(n) + " and " + std::to_string(n) + " per party");
    }
    RETURN_IF_ERROR(CheckFinite(state, what));
    auto check = [&](size_t at, const std::string& prefix) -> Status {
      for (size_t i = 0; i < n; ++i) {
        const NamedTensor& t = state[at + i];
        if (t.name != prefix + layout_[i].name || t.shape != layout_[i].shape ||
            t.values.size() != layout_[i].values.size()) {
          // The checkpoint's name and shape, escaped and bounded: the file may have been edited.
          return InvalidArgumentError(what + ": tensor " + std::to_string(at + i) + " is " + QuoteUntrusted(t.name) +
                                      " " + EscapeUntrusted(ShapeToString(t.shape)) + ", expected '" + prefix +
                                      layout_[i].name + "' " + ShapeToString(layout_[i].shape));
        }
      }
      return Status::Ok();
    };
    RETURN_IF_ERROR(check(0, kServerPrefix));
    index->clear();
    int64_t previous = -1;
    for (size_t at = n; at < state.size(); at += n) {
      const std::string& name = state[at].name;
      const size_t slash = name.find('/', sizeof(kPartyPrefix) - 1);
      const std::string digits = name.rfind(kPartyPrefix, 0) == 0 && slash != std::string::npos
                                     ? name.substr(sizeof(kPartyPrefix) - 1, slash - (sizeof(kPartyPrefix) - 1))
                                     : std::string();
      const bool numeric = !digits.empty() && digits.size() <= 9 &&
                           digits.find_first_not_of("0123456789") == std::string::npos;
      const int64_t party = numeric ? std::stoll(digits) : -1;
      if (!numeric || party <= previous || party >= parties_) {
        return InvalidArgumentError(what + ": tensor " + std::to_string(at) + " is " + QuoteUntrusted(name) +
                                    ", expected a party's variate 'control/party/P/...' with P in (" +
                                    std::to_string(previous) + ", " + std::to_string(parties_) + ")");
      }
      RETURN_IF_ERROR(check(at, PartyPrefix(static_cast<uint32_t>(party))));
      (*index)[static_cast<uint32_t>(party)] = at;
      previous = party;
    }
    return Status::Ok();
  }

  const uint32_t parties_;
  const double learning_rate_;  // the clients' (spec.optimizer.learning_rate)
  const std::vector<bool> is_buffer_;  // per tensor of the layout
  TensorSet layout_;  // the model's names and shapes, values zero
  TensorSet state_;   // c, then each party's c_i
  std::map<uint32_t, size_t> party_first_;  // party -> index of its c_i's first tensor in state_
};

}  // namespace

Result<std::unique_ptr<Strategy>> CreateScaffold(const v1::JobSpec& spec, const TensorSet& layout,
                                                 const std::vector<std::string>& buffers) {
  const uint32_t parties = spec.data().partition().parties();
  if (parties == 0) {
    return InvalidArgumentError("scaffold: spec.data.partition.parties must be positive (N, the number of parties)");
  }
  const double learning_rate = spec.optimizer().learning_rate();
  if (!(learning_rate > 0) || !std::isfinite(learning_rate)) {
    return InvalidArgumentError("scaffold: spec.optimizer.learning_rate must be a positive number (the bound on a "
                                "client's control variate change divides by it), got " + FormatNumber(learning_rate));
  }
  return std::unique_ptr<Strategy>(new Scaffold(layout, parties, buffers, learning_rate));
}

}  // namespace tessera::server
