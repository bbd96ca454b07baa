// Site cohorts on the worker side: a collectives Store served by the coordinator (so that a
// site's workers find each other through the coordinator they already reach), and the
// gradient hook that averages every step's gradients across the cohort.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"
#include "collectives/store/store.h"
#include "core/train/trainer.h"
#include "worker/coordinator_client.h"

namespace tessera::worker {

// A collectives::Store over the coordinator's rendezvous RPCs. Keys are confined by the
// coordinator to the worker's own cohort. Thread-safe as the client is.
// A Get waits in calls of up to 5 s each; when `stopped` (the task was cancelled, the worker is
// stopping) says so before a call, it ends CANCELLED instead of waiting out its timeout (up to
// --cohort-timeout-s, a week at most) for members that will not come.
class CoordinatorStore final : public collectives::Store {
 public:
  CoordinatorStore(CoordinatorClient* client, std::string worker_id, std::string session,
                   std::function<bool()> stopped = {});
  Status Set(const std::string& key, const std::string& value) override;
  Result<std::string> Get(const std::string& key, std::chrono::milliseconds timeout) override;
  Result<int64_t> Add(const std::string& key, int64_t delta) override;

 private:
  v1::StoreRequest Request(const std::string& key) const;
  CoordinatorClient* client_;
  std::string worker_id_;
  std::string session_;
  std::function<bool()> stopped_;
};

// How long a cohort member waits for the others, in the rendezvous and in each collective:
// tessera-worker's --cohort-timeout-s (raised for members of very different speeds), or the
// time left to the round's deadline when that is shorter: a member of a round that is over
// waits no longer.
struct CohortWait {
  std::chrono::milliseconds timeout{0};  // at least 1 ms
  bool until_deadline = false;           // the round's deadline set it, not the flag
  // The round's deadline on this worker's steady clock; time_point::max() when it has none.
  std::chrono::steady_clock::time_point round_deadline = std::chrono::steady_clock::time_point::max();
  // "up to 1500 ms, the time left to the round's deadline", for errors.
  std::string Describe() const;
};
// `timeout_s` is --cohort-timeout-s (taken as 1 ms if 0, and at most a week); `deadline_unix_ms`
// the task's deadline on the coordinator's clock (0: none), compared with `now_unix_ms`, this
// worker's.
inline constexpr int64_t kMaxCohortTimeoutS = 7 * 24 * 3600;
CohortWait CohortWaitFor(uint32_t timeout_s, int64_t deadline_unix_ms, int64_t now_unix_ms);

// Checks --cohort-address: the address this worker's cohort listens on and publishes to its
// peers, who dial it (on a port each round picks). A DNS name, an IPv4 address or an IPv6
// address without brackets; not a wildcard (0.0.0.0, ::), which a peer on another machine
// cannot dial, and no port. InvalidArgument naming the flag and the (escaped) value otherwise:
// a mistyped address would otherwise fail only in each cohort round's rendezvous.
Status CheckCohortAddress(const std::string& address);

// Averages the flat gradient over the cohort at every step. With `on_device` (a communicator
// over device buffers, such as NCCL on CUDA devices) it reduces the device buffer in place;
// otherwise through host memory, which works for any device, with scratch buffers kept
// between steps. Each allreduce waits up to the communicator's timeout, and never past
// `round_deadline` (CohortWait::round_deadline).
class CohortGradientSync final : public GradientHook {
 public:
  CohortGradientSync(
      collectives::Communicator* communicator, bool on_device,
      std::chrono::steady_clock::time_point round_deadline = std::chrono::steady_clock::time_point::max())
      : communicator_(communicator), on_device_(on_device), round_deadline_(round_deadline) {}
  Status OnGradients(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step) override;
  // Time spent in allreduce so far, copies to and from the host included.
  double collective_seconds() const { return collective_seconds_; }
  // Whether an OnGradients call has failed (a peer stalled, left or called differently).
  bool failed() const { return failed_; }

 private:
  Status Reduce(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step);
  collectives::Communicator* communicator_;
  bool on_device_;
  std::chrono::steady_clock::time_point round_deadline_;
  std::vector<float> local_;
  std::vector<float> averaged_;
  double collective_seconds_ = 0;
  bool failed_ = false;
};

}  // namespace tessera::worker
