#include "server/selection/utility_selection.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "proto/job_mapping.h"

namespace tessera::server {

std::map<std::string, double> UtilitySelection::Scores(const std::vector<Client>& candidates, const v1::JobSpec& spec,
                                                       uint32_t round) const {
  double lowest = std::numeric_limits<double>::infinity(), highest = -lowest;
  std::map<std::string, double> utility;  // samples x loss, of those accepted before
  for (const Client& c : candidates) {
    if (auto training = history_.LastAccepted(c.seat)) {
      const double u = static_cast<double>(training->samples) * training->train_loss;
      utility[c.seat] = u;
      lowest = std::min(lowest, u);
      highest = std::max(highest, u);
    }
  }
  const double deadline = spec.round_deadline_ms();
  const double alpha = wire::StragglerPenalty(spec);
  std::map<std::string, double> scores;
  for (const Client& c : candidates) {
    auto expected = history_.ExpectedTime(c.seat);
    if (!expected) continue;  // never timed: explored first, unscored
    double score = 0;
    if (auto it = utility.find(c.seat); it != utility.end()) {
      score = highest > lowest ? (it->second - lowest) / (highest - lowest) : 1.0;
    }
    const uint32_t last = std::max<uint32_t>(1, history_.LastSelected(c.seat));
    if (round > 1) score += std::sqrt(0.1 * std::log(static_cast<double>(round)) / last);
    if (expected->ms > deadline && expected->ms > 0) score *= std::pow(deadline / expected->ms, alpha);
    scores[c.seat] = score;
  }
  return scores;
}

std::vector<Client> UtilitySelection::Choose(std::vector<Client> candidates, const v1::JobSpec& spec, uint32_t round,
                                             uint32_t attempt) {
  std::vector<Client> drawn = DrawnOrder(std::move(candidates), spec, round, attempt);
  const std::map<std::string, double> scores = Scores(drawn, spec, round);
  struct Ranked {
    bool timed = false;
    double score = 0;
    size_t drawn = 0;
  };
  std::vector<Ranked> keys(drawn.size());
  for (size_t i = 0; i < drawn.size(); ++i) {
    keys[i].drawn = i;
    if (auto it = scores.find(drawn[i].seat); it != scores.end()) keys[i] = {true, it->second, i};
  }
  std::sort(keys.begin(), keys.end(), [](const Ranked& a, const Ranked& b) {
    if (a.timed != b.timed) return !a.timed;  // never timed first
    if (a.score != b.score) return a.score > b.score;
    return a.drawn < b.drawn;
  });
  std::vector<Client> ranked;
  ranked.reserve(drawn.size());
  for (const Ranked& key : keys) ranked.push_back(std::move(drawn[key.drawn]));
  return TakeFirst(std::move(ranked), spec);
}

}  // namespace tessera::server
