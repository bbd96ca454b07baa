#include "device/placement.h"

#include <utility>

namespace tessera {

std::string_view PlacementName(Placement placement) {
  switch (placement) {
    case Placement::kNative: return "native";
    case Placement::kHostFallback: return "host fallback";
    case Placement::kUnsupported: return "unsupported";
  }
  return "unknown";
}

OpPlacement::OpPlacement(std::set<Op> native, bool host_fallback)
    : native_(std::move(native)), host_fallback_(host_fallback) {}

Placement OpPlacement::Place(Op op) const {
  if (native_.count(op) != 0) return Placement::kNative;
  return host_fallback_ ? Placement::kHostFallback : Placement::kUnsupported;
}

namespace {

void Add(OpAccount& account, const OpCost& cost, double measured_ms, double modelled_ms) {
  ++account.calls;
  account.measured_ms += measured_ms;
  account.modelled_ms += modelled_ms;
  account.flops += cost.flops;
  account.bytes_accessed += cost.bytes_read + cost.bytes_written;
}

void Add(OpAccount& total, const OpAccount& account) {
  total.calls += account.calls;
  total.measured_ms += account.measured_ms;
  total.modelled_ms += account.modelled_ms;
  total.bytes_to_host += account.bytes_to_host;
  total.bytes_to_device += account.bytes_to_device;
  total.flops += account.flops;
  total.bytes_accessed += account.bytes_accessed;
}

}  // namespace

void OpPlacement::RecordNative(Op op, const OpCost& cost, double measured_ms, double modelled_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  Add(native_accounts_[op], cost, measured_ms, modelled_ms);
}

void OpPlacement::RecordFallback(Op op, const OpCost& cost, double measured_ms, double modelled_ms) {
  std::lock_guard<std::mutex> lock(mutex_);
  OpAccount& account = fallback_accounts_[op];
  Add(account, cost, measured_ms, modelled_ms);
  account.bytes_to_host += cost.bytes_read;
  account.bytes_to_device += cost.bytes_written;
}

OpAccount OpPlacement::Native(Op op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = native_accounts_.find(op);
  return found == native_accounts_.end() ? OpAccount{} : found->second;
}

OpAccount OpPlacement::Fallback(Op op) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = fallback_accounts_.find(op);
  return found == fallback_accounts_.end() ? OpAccount{} : found->second;
}

std::map<Op, OpAccount> OpPlacement::Fallbacks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return fallback_accounts_;
}

OpAccount OpPlacement::Total() const {
  std::lock_guard<std::mutex> lock(mutex_);
  OpAccount total;
  for (const auto* accounts : {&native_accounts_, &fallback_accounts_}) {
    for (const auto& [op, account] : *accounts) Add(total, account);
  }
  return total;
}

void OpPlacement::Reset() {
  std::lock_guard<std::mutex> lock(mutex_);
  native_accounts_.clear();
  fallback_accounts_.clear();
}

}  // namespace tessera
