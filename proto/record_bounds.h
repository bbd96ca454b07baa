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
//
// A job's own free text is bounded the same way: its error (JobRunner::Finish, whatever text
// a failure carried, a worker's included) at kMaxJobErrorBytes, a note of its event log at
// kMaxNoteBytes, a progress event's awaited workers at kMaxProgressWaitingOn names of
// kMaxNameBytes; when made (the runner, the event log) and again when a stored job is served.
// So a Job is at most kMaxJobBytes, one as listed (without its last round's reports)
// kMaxListedJobBytes, and every reply or event that carries jobs and rounds (GetJob,
// ListJobs, WatchJob) fits kOperatorMaxReceiveBytes (the asserts below).
#pragma once

#include <grpcpp/support/channel_arguments.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "base/names.h"
#include "proto/job_mapping.h"
#include "proto/list_reply.h"
#include "tessera/v1/job.pb.h"
#include "tessera/v1/job_service.pb.h"

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

// A job's error past this many bytes is cut as an outcome is, in the job's row and in the
// coordinator's log alike (the log keeps a thrown exception's whole text, the row its cut).
inline constexpr size_t kMaxJobErrorBytes = 4096;
// A note of a job's event log (JobEvent.message), likewise.
inline constexpr size_t kMaxNoteBytes = 4096;
// A progress event names at most this many of the workers a round awaits (waiting_more counts
// the others).
inline constexpr size_t kMaxProgressWaitingOn = 8;
// A job's spec at its largest: it came in one request (kCoordinatorMaxReceiveBytes), and the
// coordinator adds the input shape it read (data.input_shape, under 64 bytes).
inline constexpr size_t kMaxJobSpecBytes = kCoordinatorMaxReceiveBytes + 64;

namespace record_bounds_detail {
constexpr size_t MessageField(size_t tag_bytes, size_t bytes) { return tag_bytes + VarintBytes(bytes) + bytes; }
// A Job's fields besides its spec, error and last round: its id (a name), state, rounds
// committed, creation time and cancel flag, each at its largest.
constexpr size_t kJobNumberBytes = StringField(1, kMaxNameBytes) + (1 + 10) + (1 + 5) + (1 + 10) + (1 + 1);
constexpr size_t kJobWithoutLastRoundBytes =
    kJobNumberBytes + MessageField(1, kMaxJobSpecBytes) + StringField(1, kMaxJobErrorBytes);
// RoundProgress at its largest: its numbers and the awaited workers it names.
constexpr size_t kProgressBytes = (1 + 5) * 4 + (1 + 5) + (1 + 8) + StringField(1, kMaxNameBytes) * kMaxProgressWaitingOn;
}  // namespace record_bounds_detail

// A Job as a list gives it: its last round without the per-worker reports.
inline constexpr size_t kMaxListedJobBytes =
    record_bounds_detail::kJobWithoutLastRoundBytes + record_bounds_detail::MessageField(1, kMaxRecordHeaderBytes);
// A Job with its last round's whole record (the runner's own copy).
inline constexpr size_t kMaxJobBytes =
    record_bounds_detail::kJobWithoutLastRoundBytes + record_bounds_detail::MessageField(1, kMaxRoundRecordBytes);
// GetJob's reply: the job as listed, and a page of rounds within kMaxListBytes or, when the first
// round alone passes that, that one round (Coordinator::JobWithRounds); next_round.
inline constexpr size_t kMaxGetJobReplyBytes =
    record_bounds_detail::MessageField(1, kMaxListedJobBytes) + record_bounds_detail::MessageField(1, kMaxRoundRecordBytes) +
    (1 + 5);
// A JobEvent: the job without its last round, a round's record, a note and a progress.
inline constexpr size_t kMaxJobEventBytes =
    record_bounds_detail::MessageField(1, record_bounds_detail::kJobWithoutLastRoundBytes) +
    record_bounds_detail::MessageField(1, kMaxRoundRecordBytes) + record_bounds_detail::StringField(1, kMaxNoteBytes) +
    record_bounds_detail::MessageField(1, record_bounds_detail::kProgressBytes);
// ListJobs' reply is within kMaxListBytes, and any one job fits it: the newest is always listed.
static_assert(kMaxListedJobBytes + 8 <= kMaxListBytes, "a listed job passes a list reply's bound");
static_assert(kMaxGetJobReplyBytes <= kOperatorMaxReceiveBytes, "GetJob's largest reply passes the command line's limit");
static_assert(kMaxJobEventBytes <= kOperatorMaxReceiveBytes, "a watch's largest event passes the command line's limit");
static_assert(kMaxJobBytes <= kOperatorMaxReceiveBytes, "a job with its last round passes the command line's limit");

// `text` as valid UTF-8 of at most `max_bytes` bytes (>= 3): unchanged when it is, else cut
// between characters and ended with "…".
std::string BoundedText(std::string_view text, size_t max_bytes);

// Applies the bounds above to one report, or to a record and each of its reports (reports past
// kMaxRoundReports are left out). A report's member_count is set from its members if unset.
void BoundReport(v1::WorkerRoundReport* report);
void BoundRoundRecord(v1::RoundRecord* record);
// Applies the bounds to a job: its id, its error, its last round (BoundRoundRecord).
void BoundJob(v1::Job* job);
// Applies them to an event of a job's log: its job (without its last round's reports, which a
// round event carries in `round`), its round, its note, its progress's awaited workers.
void BoundJobEvent(v1::JobEvent* event);

// The channel arguments of the command line's channel to the coordinator: its receive limit.
grpc::ChannelArguments OperatorChannelArguments();

}  // namespace tessera::wire
