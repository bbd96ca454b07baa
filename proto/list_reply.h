// Replies that list what the coordinator holds (jobs, workers, a job's rounds) are bounded so
// that they fit the command line's receive limit whatever is stored: when entries were left
// out, the reply's trailing metadata carries their number under kMoreEntriesTrailer.
#pragma once

#include <google/protobuf/repeated_ptr_field.h>

#include <cstddef>
#include <vector>

namespace tessera::wire {

// At most this many entries and bytes in one list reply (well under gRPC's default 4 MiB
// receive limit, which a client of its own may keep).
inline constexpr size_t kMaxListEntries = 1000;
inline constexpr size_t kMaxListBytes = 3 << 20;

inline constexpr char kMoreEntriesTrailer[] = "tessera-more-entries";

// Moves entries into `out`, in order, up to kMaxListEntries and kMaxListBytes; returns how many
// were left out. The same bound for every door that lists them (the job service, the
// coordinator's monitoring port).
template <typename T>
size_t AddBounded(std::vector<T>& entries, google::protobuf::RepeatedPtrField<T>* out) {
  size_t bytes = 0, taken = 0;
  for (auto& entry : entries) {
    const size_t size = entry.ByteSizeLong() + 8;  // and its tag and length
    if (taken == kMaxListEntries || bytes + size > kMaxListBytes) break;
    bytes += size;
    *out->Add() = std::move(entry);
    ++taken;
  }
  return entries.size() - taken;
}
// GetJob's rounds come in pages: when rounds were left out, the first of them, under this
// trailer as in GetJobResponse.next_round.
inline constexpr char kNextRoundTrailer[] = "tessera-next-round";

}  // namespace tessera::wire
