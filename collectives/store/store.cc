#include "collectives/store/store.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <thread>

#include "base/escape.h"

namespace tessera::collectives {

Result<int64_t> ParseCounter(std::string_view text, const std::string& what) {
  int64_t value = 0;
  const char* last = text.data() + text.size();
  const auto [end, error] = std::from_chars(text.data(), last, value);
  if (error == std::errc() && end == last && !text.empty()) return value;
  // Quote a bounded, printable prefix: the text may be megabytes of anything.
  std::string shown;
  for (char c : text.substr(0, 32)) shown += std::isprint(static_cast<unsigned char>(c)) ? c : '?';
  if (text.size() > 32) shown += "...";
  return InvalidArgumentError(what + " is not an int64 counter: '" + shown + "'" +
                              (error == std::errc::result_out_of_range ? " (out of range)" : ""));
}

Result<int64_t> AddToCounter(int64_t current, int64_t delta, const std::string& key) {
  int64_t sum = 0;
  if (__builtin_add_overflow(current, delta, &sum)) {
    return OutOfRangeError("store counter " + QuoteUntrusted(key) + ": " + std::to_string(current) + " + " +
                           std::to_string(delta) + " overflows int64");
  }
  return sum;
}

Status Store::Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const std::string& key : keys) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    auto value = Get(key, left);
    if (!value.ok()) return value.status();
  }
  return Status::Ok();
}

Status PrefixStore::Wait(const std::vector<std::string>& keys,
                         std::chrono::milliseconds timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(prefix_ + key);
  return base_->Wait(prefixed, timeout);
}

DeadlineStore::DeadlineStore(Store& base, std::chrono::milliseconds budget, std::string what)
    : base_(base),
      start_(std::chrono::steady_clock::now()),
      budget_(std::max(budget, std::chrono::milliseconds(0))),
      what_(std::move(what)) {}

Result<std::string> DeadlineStore::Get(const std::string& key, std::chrono::milliseconds timeout) {
  const auto now = std::chrono::steady_clock::now();
  const auto left = std::max(std::chrono::milliseconds(0),
                             std::chrono::duration_cast<std::chrono::milliseconds>(
                                 start_ + budget_ - now));
  const bool bounded_here = left <= timeout;
  auto value = base_.Get(key, std::min(timeout, left));
  if (value.ok() || !bounded_here || value.status().code() != StatusCode::kDeadlineExceeded) {
    return value;
  }
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start_);
  return DeadlineExceededError(what_ + " timed out waiting for key " + QuoteUntrusted(key) + ": waited " +
                               std::to_string(waited.count()) + " ms in all, for a deadline of " +
                               std::to_string(budget_.count()) + " ms (" +
                               value.status().message() + ")");
}

Status DeadlineStore::Wait(const std::vector<std::string>& keys,
                           std::chrono::milliseconds timeout) {
  // No wait here outlasts the budget, and capping first keeps now() + timeout from overflowing;
  // each key's Get is this store's, bounded by what is left of the budget.
  return Store::Wait(keys, std::min(timeout, budget_));
}

Status StoreBarrier(Store& store, const std::string& key, int size,
                    std::chrono::milliseconds timeout) {
  ASSIGN_OR_RETURN(int64_t arrived, store.Add(key + "/arrived", 1));
  if (arrived == size) RETURN_IF_ERROR(store.Set(key + "/done", "1"));
  auto done = store.Get(key + "/done", timeout);
  if (!done.ok()) {
    return done.status().WithContext("barrier " + QuoteUntrusted(key) + " with " + std::to_string(size) +
                                     " participants");
  }
  return Status::Ok();
}

}  // namespace tessera::collectives
