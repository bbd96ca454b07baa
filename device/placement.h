// Op placement: for one device, which ops run natively on it and which run on the host as a
// fallback, and an account of what every op cost. A backend that lacks an op (an NPU without a
// native max-pool backward, an FPGA card with only a GEMM kernel) asks its OpPlacement where
// each op goes and records the call; callers read the account to see what fell back and what
// it cost (calls, measured and modelled milliseconds, bytes across the host link each way).
//
// Thread safety: every method may be called from any thread (one mutex); the device records
// from its thread while a monitor reads the account from another.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>

#include "device/device.h"

namespace tessera {

enum class Placement {
  kNative,        // runs on the device itself
  kHostFallback,  // operands go to the host, the host computes, results come back
  kUnsupported,   // neither: the device cannot run it and has no host path
};
std::string_view PlacementName(Placement placement);  // "native", "host fallback", "unsupported"

// The work of one op call: floating-point operations and the device-memory bytes it reads and
// writes. A host fallback moves exactly the read bytes to the host and the written bytes back.
struct OpCost {
  double flops = 0;
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;
};

// What the calls of one op cost, summed. Times in milliseconds, transfers in bytes.
struct OpAccount {
  uint64_t calls = 0;
  double measured_ms = 0;          // wall time the computation took here
  double modelled_ms = 0;          // time the modelled chip would take, transfers included
  uint64_t bytes_to_host = 0;      // operands sent to the host (fallbacks only)
  uint64_t bytes_to_device = 0;    // results sent back to the device (fallbacks only)
  double flops = 0;                // work done, from OpCost
  uint64_t bytes_accessed = 0;     // device-memory traffic, from OpCost (read + written)

  uint64_t host_link_bytes() const { return bytes_to_host + bytes_to_device; }
};

class OpPlacement {
 public:
  // `native` are the ops the device runs itself; every other op is a host fallback when
  // `host_fallback` is true and unsupported otherwise.
  explicit OpPlacement(std::set<Op> native, bool host_fallback = true);

  Placement Place(Op op) const;
  const std::set<Op>& native_ops() const { return native_; }

  // Adds one call of `op` to its account. A native call carries no host-link bytes; a
  // fallback sends cost.bytes_read to the host and cost.bytes_written back.
  void RecordNative(Op op, const OpCost& cost, double measured_ms, double modelled_ms);
  void RecordFallback(Op op, const OpCost& cost, double measured_ms, double modelled_ms);

  // The account of one op's native calls / fallback calls (zero when it never ran that way).
  OpAccount Native(Op op) const;
  OpAccount Fallback(Op op) const;
  // Every op that fell back at least once, with its account.
  std::map<Op, OpAccount> Fallbacks() const;
  // Sums over every op, native and fallback.
  OpAccount Total() const;
  // Forgets every account (the placement itself is unchanged).
  void Reset();

 private:
  const std::set<Op> native_;
  const bool host_fallback_;
  mutable std::mutex mutex_;
  std::map<Op, OpAccount> native_accounts_;
  std::map<Op, OpAccount> fallback_accounts_;
};

}  // namespace tessera
