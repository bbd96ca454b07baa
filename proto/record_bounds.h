// How large a round's record can be, and the receive limit that lets the command line read
// the largest one whole.
//
// A round's record lists one WorkerRoundReport per selected client: at most kMaxRoundReports
// of them (clients_per_round <= kMaxParties, doubled by the most over-selection; an
// asynchronous step lists at most buffer_size <= kMaxParties folded updates and a few hundred
// others). Its text is bounded when the record is made, and again when a stored record is
// served (one written before these bounds held): every name at kMaxNameBytes, an outcome at
// kMaxOutcomeBytes, a cohort's members listed up to kMaxListedMembers (member_count counts
// them all). So no record passes kMaxRoundRecordBytes, and a reply or event that carries one
// (with its job, whose spec came in one request of at most kCoordinatorMaxReceiveBytes) fits
// kOperatorMaxReceiveBytes, the `tessera` command line's receive limit.
#pragma once

#include <grpcpp/support/channel_arguments.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/names.h"
#include "proto/job_mapping.h"
#include "tessera/v1/job.pb.h"

namespace tessera::wire {

// The coordinator's gRPC receive limit: an update's chunk (at most 1 MiB) with its envelope,
// and so also the largest job spec a submit can carry.
inline constexpr size_t kCoordinatorMaxReceiveBytes = size_t{2} << 20;

// A report's outcome past this many bytes is cut, between UTF-8 characters, and ends in "…"
// (within the bound); the coordinator's log keeps the whole message.
inline constexpr size_t kMaxOutcomeBytes = 512;
// A site cohort's report lists its first members (the leader first) up to this many.
inline constexpr size_t kMaxListedMembers = 4;
// The most reports one round's record lists.
inline constexpr size_t kMaxRoundReports = 2 * size_t{kMaxParties};
static_assert(kMaxOverSelection <= 1, "kMaxRoundReports counts clients_per_round x (1 + kMaxOverSelection)");

namespace record_bounds_detail {
constexpr size_t VarintBytes(uint64_t value) { return value < 128 ? 1 : 1 + VarintBytes(value >> 7); }
// A string field of at most `bytes` bytes with a tag of `tag_bytes`.
constexpr size_t StringField(size_t tag_bytes, size_t bytes) { return tag_bytes + VarintBytes(bytes) + bytes; }
// WorkerRoundReport's numbers at their largest: fields 1 to 15 have one-byte tags, the others two.
constexpr size_t kReportNumberBytes = (1 + 10) * 2 + (2 + 10) * 2   // samples, upload_bytes; download_bytes, local_test_samples
                                      + (2 + 5) * 2                  // staleness, member_count
                                      + (1 + 8) * 8 + (2 + 8) * 3;   // the doubles
constexpr size_t kReportStringBytes = StringField(1, kMaxNameBytes) * (3 + kMaxListedMembers)  // id, cohort, backend, members
                                      + StringField(1, kMaxOutcomeBytes);
}  // namespace record_bounds_detail

// The largest WorkerRoundReport, as one entry of a record (its tag and length included).
inline constexpr size_t kMaxWorkerReportBytes =
    1 + record_bounds_detail::VarintBytes(record_bounds_detail::kReportNumberBytes +
                                          record_bounds_detail::kReportStringBytes) +
    record_bounds_detail::kReportNumberBytes + record_bounds_detail::kReportStringBytes;
// A record's fields besides its reports: ids, numbers, latencies, the async step (under 2 KiB).
inline constexpr size_t kMaxRecordHeaderBytes = 4096;
inline constexpr size_t kMaxRoundRecordBytes = kMaxRoundReports * kMaxWorkerReportBytes + kMaxRecordHeaderBytes;

// The command line's receive limit: a round's record, its job (a spec of at most one request,
// the job's error and a note) and room to spare.
inline constexpr size_t kOperatorMaxReceiveBytes = kMaxRoundRecordBytes + kCoordinatorMaxReceiveBytes + (size_t{1} << 20);
static_assert(kOperatorMaxReceiveBytes <= size_t{64} << 20, "a round's record grew past what a client should take");

// `text` as valid UTF-8 of at most `max_bytes` bytes (>= 3): unchanged when it is, else cut
// between characters and ended with "…".
std::string BoundedText(std::string_view text, size_t max_bytes);

// Applies the bounds above to one report, or to a record and each of its reports (reports past
// kMaxRoundReports are left out). A report's member_count is set from its members if unset.
void BoundReport(v1::WorkerRoundReport* report);
void BoundRoundRecord(v1::RoundRecord* record);

// The channel arguments of the command line's channel to the coordinator: its receive limit.
grpc::ChannelArguments OperatorChannelArguments();

}  // namespace tessera::wire
