// The aggregation rules' shared parts, and the sample-weighted mean.
#include "server/strategy/aggregation.h"

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "base/format.h"
#include "base/target_clones.h"
#include "proto/job_mapping.h"

namespace tessera::server {

AggregationOptions AggregationFromSpec(const v1::JobSpec& spec) {
  AggregationOptions options;
  const v1::RobustAggregationSpec& a = spec.aggregation();
  if (a.rule() == "median") options.rule = AggregationRule::kMedian;
  if (a.rule() == "trimmed-mean") options.rule = AggregationRule::kTrimmedMean;
  if (a.rule() == "krum") options.rule = AggregationRule::kKrum;
  options.trim_fraction = a.trim_fraction() > 0 ? a.trim_fraction() : wire::kDefaultTrimFraction;
  options.byzantine = a.byzantine_clients();
  if (a.selected() > 0) options.selected = a.selected();
  return options;
}

std::string_view AggregationRuleName(AggregationRule rule) {
  switch (rule) {
    case AggregationRule::kMean: return "mean";
    case AggregationRule::kMedian: return "median";
    case AggregationRule::kTrimmedMean: return "trimmed-mean";
    case AggregationRule::kKrum: return "krum";
  }
  return "mean";
}

Status CheckUpdateFits(const ClientUpdate& update, const std::vector<size_t>& sizes) {
  if (update.samples == 0) return InvalidArgumentError("update with 0 samples: expected a positive sample count");
  if (!(update.scale > 0 && update.scale <= 1)) {
    return InvalidArgumentError("update from '" + update.client + "': its scale " + FormatNumber(update.scale) +
                                " is not in (0, 1]");
  }
  const TensorSet& delta = *update.delta;
  if (delta.size() != sizes.size()) {
    return InvalidArgumentError("update has " + std::to_string(delta.size()) + " tensors, expected " +
                                std::to_string(sizes.size()));
  }
  for (size_t i = 0; i < delta.size(); ++i) {
    if (delta[i].values.size() != sizes[i]) {
      return InvalidArgumentError("tensor '" + delta[i].name + "' has " + std::to_string(delta[i].values.size()) +
                                  " values, expected " + std::to_string(sizes[i]));
    }
  }
  return Status::Ok();
}

namespace {

// sum[j] += w x d[j]: every update's fold, over the whole model. Vectorised (the build's -O2
// leaves a loop whose length is not known scalar) and cloned for AVX2, chosen when the process
// loads (target_clones). Element by element, without FMA: the same products and sums as the
// scalar loop, so the aggregate is the same to the bit on every machine.
TESSERA_CLONES_AVX2 __attribute__((optimize("tree-vectorize", "vect-cost-model=dynamic"))) void
AddScaled(double* __restrict sum, const float* __restrict d, size_t n, double w) {
  for (size_t j = 0; j < n; ++j) sum[j] += w * d[j];
}

// Running sums of weight x delta, one lock per tensor so that concurrent folds pipeline
// through the model instead of queueing for all of it.
//
// A fold reads the update once but reads and writes the sums, in double, twice its bytes:
// at 10 MiB a fold moves 50 MiB, most of it the sums, which do not stay in the caches between
// updates. So an update whose caller hands its delta over (ClientUpdate::handed) waits, once
// checked and counted, until `batch_` have come; they are then folded together a block of the
// sums at a time (kBlock values, in the first-level cache), each block read and written once
// for the batch. Every value still gets the same products added in the same order as one
// update after another would give it, so the sums are the same to the bit. Combine() folds
// what still waits first. A waiting update is accepted: its checks are made and its weight
// counted when it comes, and the arithmetic left cannot fail. Only models of kMinBatchedBytes
// and more wait (smaller sums stay in the caches), and the updates waiting hold at most
// kWaitingBytes (at 10 MiB, one waits for the next): memory a round keeps beside its sums,
// outside the coordinator's upload memory (--upload-buffer-mib), which holds updates only
// until they are received and folded or waiting.
class WeightedMean final : public DeltaAggregate {
 public:
  explicit WeightedMean(const TensorSet& layout) : locks_(layout.size()) {
    sums_.reserve(layout.size());
    sizes_.reserve(layout.size());
    uint64_t bytes = 0;
    for (const auto& t : layout) {
      sums_.emplace_back(t.values.size(), 0.0);
      sizes_.push_back(t.values.size());
      bytes += t.values.size() * sizeof(float);
    }
    // Only sums that leave the caches between updates gain from it; the deltas waiting take
    // at most kWaitingBytes beside them.
    if (bytes >= kMinBatchedBytes) batch_ = static_cast<size_t>(std::clamp<uint64_t>(kWaitingBytes / bytes, 1, kMaxBatch));
  }

  Status Fold(const ClientUpdate& update) override {
    RETURN_IF_ERROR(CheckUpdateFits(update, sizes_));
    const TensorSet& delta = *update.delta;
    const HandedDelta& handed = update.handed;
    const bool waits = batch_ > 1 && handed.tensors == &delta && handed.recycle != nullptr;
    // A waiting update's place, allocated before anything is counted: past here its fold
    // cannot fail, so an error leaves the aggregate as it was. It becomes the waiting list's
    // storage when this update completes a batch.
    std::vector<Waiting> spare;
    if (waits) spare.reserve(batch_);
    {
      std::lock_guard<std::mutex> lock(totals_mu_);
      uint64_t total = 0;
      if (__builtin_add_overflow(total_weight_, update.samples, &total)) {
        return InvalidArgumentError("update from '" + update.client + "': its sample count " +
                                    std::to_string(update.samples) + " overflows the round's total");
      }
      total_weight_ = total;
      ++updates_;
    }
    // The update's share of the mean is its samples; its staleness weight scales its delta.
    const double w = static_cast<double>(update.samples) * update.scale;
    if (waits) {
      {
        std::lock_guard<std::mutex> lock(waiting_mu_);
        if (waiting_.capacity() < batch_) waiting_.swap(spare);  // then empty: entries go in within capacity only
        waiting_.push_back(Waiting{w, std::move(*handed.tensors), handed.recycle});  // within capacity
        handed.tensors->clear();
        if (waiting_.size() < batch_) return Status::Ok();
        spare.swap(waiting_);  // the batch out; the next fold reserves again if need be
      }
      FoldBatch(spare);
      return Status::Ok();
    }
    for (size_t i = 0; i < delta.size(); ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      AddScaled(sums_[i].data(), delta[i].values.data(), sums_[i].size(), w);
    }
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(totals_mu_);
    return updates_;
  }

  Status Combine(const TensorVisitor& visit) const override {
    if (updates() == 0) return FailedPreconditionError("no update to aggregate");
    std::vector<Waiting> batch;
    {
      std::lock_guard<std::mutex> lock(waiting_mu_);
      batch.swap(waiting_);
    }
    FoldBatch(batch);
    const double total = static_cast<double>(total_weight_);
    std::vector<double> mean;
    for (size_t i = 0; i < sums_.size(); ++i) {
      mean.resize(sums_[i].size());
      for (size_t j = 0; j < mean.size(); ++j) mean[j] = sums_[i][j] / total;
      visit(i, mean);
    }
    return Status::Ok();
  }

 private:
  static constexpr uint64_t kMinBatchedBytes = uint64_t{1} << 20;
  static constexpr uint64_t kWaitingBytes = uint64_t{24} << 20;
  static constexpr uint64_t kMaxBatch = 8;
  static constexpr size_t kBlock = 4096;  // values of the sums per pass: 32 KiB

  struct Waiting {
    double w = 0;
    TensorSet delta;
    FloatBufferPool* recycle = nullptr;
  };
  static_assert(std::is_nothrow_move_constructible_v<Waiting>, "a waiting update goes in without throwing");

  // Folds `batch` (in its order), then gives its buffers back. Const for Combine(): the
  // aggregate's value does not change, only how much of it is still waiting.
  void FoldBatch(std::vector<Waiting>& batch) const {
    if (batch.empty()) return;
    for (size_t i = 0; i < sums_.size(); ++i) {
      std::lock_guard<std::mutex> lock(locks_[i]);
      double* sum = sums_[i].data();
      const size_t n = sums_[i].size();
      for (size_t at = 0; at < n; at += kBlock) {
        const size_t m = std::min(kBlock, n - at);
        for (const Waiting& u : batch) AddScaled(sum + at, u.delta[i].values.data() + at, m, u.w);
      }
    }
    for (Waiting& u : batch) {
      try {
        u.recycle->Give(std::move(u.delta));
      } catch (...) {  // the pool could not keep it: the buffers are freed instead
      }
    }
    batch.clear();
  }

  mutable std::vector<std::vector<double>> sums_;  // mutable: Combine() folds what waits
  std::vector<size_t> sizes_;
  mutable std::vector<std::mutex> locks_;  // one per tensor, guarding its sum
  size_t batch_ = 1;
  mutable std::mutex waiting_mu_;  // guards waiting_
  mutable std::vector<Waiting> waiting_;
  mutable std::mutex totals_mu_;
  uint64_t total_weight_ = 0;
  uint64_t updates_ = 0;
};

}  // namespace

std::unique_ptr<DeltaAggregate> OpenAggregate(const AggregationOptions& options, const TensorSet& layout) {
  if (options.rule == AggregationRule::kMean) return std::make_unique<WeightedMean>(layout);
  return OpenRetainingAggregate(options, layout);
}

}  // namespace tessera::server
