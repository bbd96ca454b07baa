// Replies that list what the coordinator holds (jobs, workers) are bounded so that they fit
// the command line's receive limit whatever is stored: when entries were left out, the
// reply's trailing metadata carries their number under kMoreEntriesTrailer.
#pragma once

namespace tessera::wire {

inline constexpr char kMoreEntriesTrailer[] = "tessera-more-entries";

}  // namespace tessera::wire
