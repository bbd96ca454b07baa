// Reading a job description (job.toml) into the wire's v1::JobSpec.
//
// The schema, every key's type, default and range, is documented in docs/JOBS.md. The reader
// is strict: an unknown key anywhere, a value of the wrong type and a value out of range are
// each an error, never ignored. Every error is kInvalidArgument and its message starts with
// "<source>:<line>:<column>: " pointing at the offending key or value, names the dotted key
// ("train.batch_size"), and says what was expected and what was found; an unknown key's message
// lists the keys its table allows. A missing required key is reported as "<source>: ...".
// What wire::ValidateJobSpec refuses keeps its "spec.FIELD: ..." message, after the position
// of the file's key for FIELD (or of the nearest key that holds it) and, where the file names
// it otherwise ("train.learning_rate" for spec.optimizer.learning_rate), "key '...': ".
//
// Defaults are filled in, so the returned spec is complete: strategy "fedavg", clients_per_round
// = data.partition.parties, min_clients = clients_per_round, round deadline 300 s, one local
// epoch, batch 64, SGD with lr 0.01, momentum 0.9, no weight decay, devices "cpu", three round
// attempts, dataset "fashion-mnist", an IID partition seeded with the job's seed, aggregation
// rule "mean", update_norm_policy "refuse", the [server] options of the strategy named, and
// for fedprox proximal_mu 0.01.
//
// Thread-safe: no shared state.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tessera/v1/job.pb.h"

namespace tessera {

// A job spec file's largest size: a declared model of 256 layers or the label sets of
// thousands of parties take a few hundred KiB at most.
inline constexpr uint64_t kMaxJobSpecBytes = uint64_t{1} << 20;

// Reads and parses the file at `path`; messages name the path as given (escaped, cut at 256
// characters). kNotFound when the file cannot be read (with the system's reason);
// InvalidArgument for anything but a regular file, or one over kMaxJobSpecBytes.
Result<v1::JobSpec> ParseJobSpecFile(const std::string& path);

// Parses TOML text; `source_name` stands for the file in messages ("job.toml").
Result<v1::JobSpec> ParseJobSpecString(std::string_view text, std::string_view source_name);

// The spec as TOML in the schema ParseJobSpecString reads, every key written out, for display
// ("tessera job show") and round trips: ParseJobSpecString(JobSpecToToml(s)) == s for any spec
// the parser produced.
std::string JobSpecToToml(const v1::JobSpec& spec);

}  // namespace tessera
