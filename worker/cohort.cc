#include "worker/cohort.h"

#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "base/escape.h"
#include "base/host_port.h"
#include "worker/round_deadline.h"

namespace tessera::worker {

CoordinatorStore::CoordinatorStore(CoordinatorClient* client, std::string worker_id, std::string session,
                                   std::function<bool()> stopped)
    : client_(client), worker_id_(std::move(worker_id)), session_(std::move(session)), stopped_(std::move(stopped)) {}

v1::StoreRequest CoordinatorStore::Request(const std::string& key) const {
  v1::StoreRequest request;
  request.set_worker_id(worker_id_);
  request.set_session(session_);
  request.set_key(key);
  return request;
}

Status CoordinatorStore::Set(const std::string& key, const std::string& value) {
  v1::StoreRequest request = Request(key);
  request.set_value(value);
  return client_->StoreSet(request);
}

Result<std::string> CoordinatorStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (stopped_ && stopped_()) {
      return CancelledError("store get " + QuoteUntrusted(key) + ": the task was cancelled or the worker is stopping");
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    v1::StoreRequest request = Request(key);
    request.set_wait_ms(static_cast<uint32_t>(std::clamp<int64_t>(left.count(), 0, 5000)));
    auto value = client_->StoreGet(request);
    if (value.ok() || value.status().code() != StatusCode::kDeadlineExceeded || left.count() <= 0) return value;
  }
}

Result<int64_t> CoordinatorStore::Add(const std::string& key, int64_t delta) {
  v1::StoreRequest request = Request(key);
  request.set_delta(delta);
  return client_->StoreAdd(request);
}

std::string CohortWait::Describe() const {
  return "up to " + std::to_string(timeout.count()) + " ms, " +
         (until_deadline ? "the time left to the round's deadline" : "--cohort-timeout-s");
}

CohortWait CohortWaitFor(uint32_t timeout_s, int64_t deadline_unix_ms, int64_t now_unix_ms) {
  CohortWait wait;
  // 1 ms to a week, what --cohort-timeout-s allows and a communicator's int milliseconds hold.
  wait.timeout = std::clamp(std::chrono::milliseconds(int64_t{timeout_s} * 1000), std::chrono::milliseconds(1),
                            std::chrono::milliseconds(kMaxCohortTimeoutS * 1000));
  if (deadline_unix_ms <= 0) return wait;
  const auto left = TimeLeftUntil(deadline_unix_ms, now_unix_ms);
  wait.round_deadline = std::chrono::steady_clock::now() + left;
  if (left < wait.timeout) {
    wait.timeout = std::max(left, std::chrono::milliseconds(1));
    wait.until_deadline = true;
  }
  return wait;
}

Status CheckCohortAddress(const std::string& address) {
  const std::string named = "--cohort-address " + QuoteUntrusted(address);
  if (!IsHost(address)) {
    return InvalidArgumentError(named + ": expected the DNS name or IP address (IPv6 without brackets) this worker's "
                                "cohort peers reach it at, without a port (each round listens on a free one)");
  }
  in6_addr ipv6{};
  in_addr ipv4{};
  const bool wildcard = (inet_pton(AF_INET6, address.c_str(), &ipv6) == 1 && IN6_IS_ADDR_UNSPECIFIED(&ipv6)) ||
                        (inet_pton(AF_INET, address.c_str(), &ipv4) == 1 && ipv4.s_addr == htonl(INADDR_ANY));
  if (wildcard) {
    return InvalidArgumentError(named + ": a wildcard, which the cohort's peers cannot dial (it is published to them); "
                                "give an address of this machine they reach");
  }
  return Status::Ok();
}

Status CohortGradientSync::OnGradients(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step) {
  const auto start = std::chrono::steady_clock::now();
  Status s = Reduce(device, flat_gradients, count, step);
  collective_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  failed_ = failed_ || !s.ok();
  return s;
}

Status CohortGradientSync::Reduce(Device& device, DeviceBuffer& flat_gradients, int64_t count, int64_t step) {
  if (count < 0 || count > flat_gradients.f32_count()) {
    return InvalidArgumentError("cohort gradient allreduce at step " + std::to_string(step) + ": " +
                                   std::to_string(count) + " gradients, expected 0 to " +
                                   std::to_string(flat_gradients.f32_count()) + " (the buffer's size)");
  }
  const size_t n = static_cast<size_t>(count);
  // The communicator's timeout, cut to what is left of the round.
  CohortWait wait;
  wait.timeout = communicator_->default_timeout();
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(round_deadline_ -
                                                                          std::chrono::steady_clock::now());
  if (left < wait.timeout) {
    wait.timeout = std::max(left, std::chrono::milliseconds(1));
    wait.until_deadline = true;
  }
  const collectives::CallOptions call{wait.timeout};
  if (on_device_) {
    RETURN_IF_ERROR(device.Synchronize());  // the gradient is complete before the collective reads it
    Status reduced = communicator_->Allreduce(flat_gradients.data(), flat_gradients.data(), n,
                                              collectives::DataType::kFloat32, collectives::ReduceOp::kAvg, call);
    if (!reduced.ok()) {
      return reduced.WithContext("cohort gradient allreduce (device buffers) at step " + std::to_string(step) +
                                 ", waiting " + wait.Describe());
    }
    return Status::Ok();
  }
  local_.resize(n);
  averaged_.resize(n);
  RETURN_IF_ERROR(device.CopyDeviceToHost(flat_gradients, 0, local_.data(), n * sizeof(float)));
  Status reduced = communicator_->Allreduce(local_.data(), averaged_.data(), n, collectives::DataType::kFloat32,
                                            collectives::ReduceOp::kAvg, call);
  if (!reduced.ok()) {
    return reduced.WithContext("cohort gradient allreduce at step " + std::to_string(step) + ", waiting " +
                               wait.Describe());
  }
  return device.CopyHostToDevice(averaged_.data(), flat_gradients, 0, n * sizeof(float));
}

}  // namespace tessera::worker
