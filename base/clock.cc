#include "base/clock.h"

namespace tessera {
namespace {

class Steady final : public Clock {
 public:
  TimePoint Now() const override { return std::chrono::steady_clock::now(); }
};

}  // namespace

const Clock& SteadyClock() {
  static const Steady clock;
  return clock;
}

}  // namespace tessera
