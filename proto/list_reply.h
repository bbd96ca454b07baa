// Replies that list what the coordinator holds (jobs, workers, a job's rounds) are bounded so
// that they fit the command line's receive limit whatever is stored: when entries were left
// out, the reply's trailing metadata carries their number under kMoreEntriesTrailer.
#pragma once

#include <cstddef>

namespace tessera::wire {

// At most this many entries and bytes in one list reply (well under the command line's 4 MiB).
inline constexpr size_t kMaxListEntries = 1000;
inline constexpr size_t kMaxListBytes = 3 << 20;

inline constexpr char kMoreEntriesTrailer[] = "tessera-more-entries";
// GetJob's rounds come in pages: when rounds were left out, the first of them, under this
// trailer as in GetJobResponse.next_round.
inline constexpr char kNextRoundTrailer[] = "tessera-next-round";

}  // namespace tessera::wire
