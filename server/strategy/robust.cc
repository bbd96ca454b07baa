// The robust aggregation rules (aggregation.h): coordinate-wise median, trimmed mean and
// multi-Krum, over a copy of every accepted delta of the round.
#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>
#include <string>

#include "server/strategy/aggregation.h"

namespace tessera::server {
namespace {

struct RetainedUpdate {
  std::string client;
  std::vector<std::vector<float>> tensors;  // the delta's values, tensor by tensor
};

// How many values trimmed-mean cuts from each side of n: floor(fraction x n). The tolerance
// keeps a product such as 0.29 x 100 (28.999999999999996 in double) at the count the
// fraction means. Less than n / 2 for a fraction below 0.5.
size_t TrimCount(double fraction, size_t n) {
  const size_t trim = static_cast<size_t>(std::floor(fraction * static_cast<double>(n) + 1e-9));
  return std::min(trim, (n - 1) / 2);
}

class RetainingAggregate final : public DeltaAggregate {
 public:
  RetainingAggregate(const AggregationOptions& options, const TensorSet& layout) : options_(options) {
    sizes_.reserve(layout.size());
    for (const auto& t : layout) sizes_.push_back(t.values.size());
  }

  Status Fold(const ClientUpdate& update) override {
    RETURN_IF_ERROR(CheckUpdateFits(update, sizes_));
    if (update.scale != 1.0) return InvalidArgumentError("this aggregate weighs no update by staleness (scale must be 1)");
    RetainedUpdate copy;
    copy.client = update.client;
    copy.tensors.reserve(update.delta->size());
    for (const auto& t : *update.delta) copy.tensors.push_back(t.values);  // outside the lock
    std::lock_guard<std::mutex> lock(mu_);
    updates_.push_back(std::move(copy));
    return Status::Ok();
  }

  uint64_t updates() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return updates_.size();
  }

  Status Combine(const TensorVisitor& visit) const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (updates_.empty()) return FailedPreconditionError("no update to aggregate");
    // In the order of the clients' ids, not of arrival: the same updates give the same bits.
    std::vector<const RetainedUpdate*> ordered;
    for (const auto& u : updates_) ordered.push_back(&u);
    std::sort(ordered.begin(), ordered.end(),
              [](const RetainedUpdate* a, const RetainedUpdate* b) { return a->client < b->client; });
    if (options_.rule == AggregationRule::kKrum) return CombineKrum(ordered, visit);
    return CombineByCoordinate(ordered, visit);
  }

 private:
  // Median or trimmed mean, each coordinate on its own.
  Status CombineByCoordinate(const std::vector<const RetainedUpdate*>& ordered, const TensorVisitor& visit) const {
    const size_t n = ordered.size();
    const bool median = options_.rule == AggregationRule::kMedian;
    const size_t trim = median ? 0 : TrimCount(options_.trim_fraction, n);
    const double kept = static_cast<double>(n - 2 * trim);
    std::vector<double> column(n);
    std::vector<double> out;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      out.resize(sizes_[i]);
      for (size_t j = 0; j < sizes_[i]; ++j) {
        for (size_t k = 0; k < n; ++k) column[k] = ordered[k]->tensors[i][j];
        std::sort(column.begin(), column.end());
        if (median) {
          out[j] = n % 2 == 1 ? column[n / 2] : 0.5 * (column[n / 2 - 1] + column[n / 2]);
        } else {
          double sum = 0;
          for (size_t k = trim; k < n - trim; ++k) sum += column[k];
          out[j] = sum / kept;
        }
      }
      visit(i, out);
    }
    return Status::Ok();
  }

  Status CombineKrum(const std::vector<const RetainedUpdate*>& ordered, const TensorVisitor& visit) const {
    const size_t n = ordered.size();
    const size_t f = options_.byzantine;
    if (n <= 2 * f + 2) {
      return FailedPreconditionError("krum with byzantine_clients = " + std::to_string(f) + " needs more than " +
                                     std::to_string(2 * f + 2) + " updates, the round has " + std::to_string(n));
    }
    const size_t m = options_.selected;
    if (m < 1 || m > n - f) {
      return FailedPreconditionError("krum selecting " + std::to_string(m) + " updates needs 1 to n - f = " +
                                     std::to_string(n - f) + " of them");
    }
    // Squared L2 distances between every pair of updates, over the whole model.
    std::vector<std::vector<double>> distance(n, std::vector<double>(n, 0.0));
    for (size_t a = 0; a < n; ++a) {
      for (size_t b = a + 1; b < n; ++b) {
        double squares = 0;
        for (size_t i = 0; i < sizes_.size(); ++i) {
          const float* x = ordered[a]->tensors[i].data();
          const float* y = ordered[b]->tensors[i].data();
          for (size_t j = 0; j < sizes_[i]; ++j) {
            const double d = static_cast<double>(x[j]) - static_cast<double>(y[j]);
            squares += d * d;
          }
        }
        distance[a][b] = distance[b][a] = squares;
      }
    }
    // Each update's score: the sum of its distances to its n - f - 2 nearest others.
    const size_t neighbours = n - f - 2;
    std::vector<double> score(n, 0.0);
    std::vector<double> others;
    for (size_t a = 0; a < n; ++a) {
      others.clear();
      for (size_t b = 0; b < n; ++b) {
        if (b != a) others.push_back(distance[a][b]);
      }
      std::sort(others.begin(), others.end());
      score[a] = std::accumulate(others.begin(), others.begin() + static_cast<std::ptrdiff_t>(neighbours), 0.0);
    }
    // The m best scores (ties to the smaller client id), averaged in client order.
    std::vector<size_t> rank(n);
    std::iota(rank.begin(), rank.end(), 0);
    std::stable_sort(rank.begin(), rank.end(), [&](size_t a, size_t b) { return score[a] < score[b]; });
    rank.resize(m);
    std::sort(rank.begin(), rank.end());
    std::vector<double> out;
    for (size_t i = 0; i < sizes_.size(); ++i) {
      out.assign(sizes_[i], 0.0);
      for (size_t k : rank) {
        const float* x = ordered[k]->tensors[i].data();
        for (size_t j = 0; j < sizes_[i]; ++j) out[j] += x[j];
      }
      for (double& v : out) v /= static_cast<double>(m);
      visit(i, out);
    }
    return Status::Ok();
  }

  const AggregationOptions options_;
  std::vector<size_t> sizes_;
  mutable std::mutex mu_;
  std::vector<RetainedUpdate> updates_;  // guarded by mu_, in arrival order
};

}  // namespace

std::unique_ptr<DeltaAggregate> OpenRetainingAggregate(const AggregationOptions& options, const TensorSet& layout) {
  return std::make_unique<RetainingAggregate>(options, layout);
}

}  // namespace tessera::server
