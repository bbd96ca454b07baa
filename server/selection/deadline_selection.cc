#include "server/selection/deadline_selection.h"

#include <algorithm>

namespace tessera::server {

std::vector<Client> DeadlineSelection::Choose(std::vector<Client> candidates, const v1::JobSpec& spec,
                                              uint32_t round, uint32_t attempt) {
  std::vector<Client> drawn = DrawnOrder(std::move(candidates), spec, round, attempt);
  const double deadline = spec.round_deadline_ms();
  struct Ranked {
    int tier = 0;  // 0: never timed, 1: fits the deadline, 2: does not
    ClientHistory::ReportTime expected;
    size_t drawn = 0;  // its place in the draw
  };
  std::vector<Ranked> keys(drawn.size());
  for (size_t i = 0; i < drawn.size(); ++i) {
    keys[i].drawn = i;
    if (auto expected = history_.ExpectedTime(drawn[i].seat)) {
      const bool fits = expected->ms < deadline || (expected->ms == deadline && !expected->at_least);
      keys[i].tier = fits ? 1 : 2;
      keys[i].expected = *expected;
    }
  }
  std::sort(keys.begin(), keys.end(), [](const Ranked& a, const Ranked& b) {
    if (a.tier != b.tier) return a.tier < b.tier;
    if (a.expected < b.expected) return true;
    if (b.expected < a.expected) return false;
    return a.drawn < b.drawn;
  });
  std::vector<Client> ranked;
  ranked.reserve(drawn.size());
  for (const Ranked& key : keys) ranked.push_back(std::move(drawn[key.drawn]));
  return TakeFirst(std::move(ranked), spec);
}

}  // namespace tessera::server
