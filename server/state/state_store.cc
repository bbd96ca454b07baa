#include "server/state/state_store.h"

#include <chrono>
#include <cstring>
#include <limits>

#include "base/escape.h"
#include "base/names.h"
#include "base/xxh3.h"
#include "proto/job_mapping.h"
#include "proto/tensor_transfer.h"

namespace tessera::server {
namespace {

constexpr char kCheckpointMagic[] = "TSRCKPT1";

}  // namespace

std::vector<std::string_view> CheckpointPieces(const TensorSet& tensors, const TensorSet& extra, std::string* header) {
  // Each tensor checked by its XXH3-128 on load: a damaged file is found as surely as by
  // SHA-256 for a tenth of the CPU, on the commit's path. (A checkpoint is no proof against
  // whoever can write the state directory, whatever its hash; files written with SHA-256
  // still load.)
  v1::TensorManifest built = wire::BuildManifest(tensors, wire::kMaxChunkBytes, /*sha256=*/false);
  if (!extra.empty()) {
    const v1::TensorManifest more = wire::BuildManifest(extra, wire::kMaxChunkBytes, /*sha256=*/false);
    for (const auto& info : more.tensors()) *built.add_tensors() = info;
    built.set_total_bytes(built.total_bytes() + more.total_bytes());
  }
  const auto tensor = [&](size_t i) -> const NamedTensor& {
    return i < tensors.size() ? tensors[i] : extra[i - tensors.size()];
  };
  for (int i = 0; i < built.tensors_size(); ++i) {
    const NamedTensor& t = tensor(static_cast<size_t>(i));
    built.mutable_tensors(i)->set_xxh3_128(Xxh3Hex(t.values.data(), t.ByteSize()));
  }
  const std::string manifest = built.SerializeAsString();
  header->clear();
  header->append(kCheckpointMagic, 8);
  const uint64_t length = manifest.size();
  header->append(reinterpret_cast<const char*>(&length), sizeof(length));
  header->append(manifest);
  std::vector<std::string_view> pieces;
  pieces.reserve(tensors.size() + extra.size() + 1);
  pieces.emplace_back(*header);
  for (const TensorSet* set : {&tensors, &extra}) {
    for (const auto& t : *set) pieces.emplace_back(reinterpret_cast<const char*>(t.values.data()), t.ByteSize());
  }
  return pieces;
}

Status NoWrittenCheckpointError(const std::string& job_id, uint32_t round) {
  return FailedPreconditionError("commit of round " + std::to_string(round) + " of job " +
                                 QuoteUntrusted(job_id, kMaxJobIdBytes) + ": no checkpoint was written for it");
}

Status TooManySeatsError(const std::string& job_id, size_t max_seats) {
  return DataLossError("seats table: job " + QuoteUntrusted(job_id, kMaxJobIdBytes) + ": more than " +
                       std::to_string(max_seats) + " seats stored; expected at most " + std::to_string(max_seats));
}

v1::Job JobRow(const v1::Job& job) {
  v1::Job row = job;
  if (row.has_last_round()) row.mutable_last_round()->clear_workers();
  return row;
}

v1::Job WithRecordedCancel(v1::Job row, bool cancel_recorded) {
  // A cancel recorded as the job ended (its end written first, or its cancel answered while
  // it ended) is no cancel pending: the state says how the job ended.
  row.set_cancel_requested(cancel_recorded && !wire::JobEnded(row.state()));
  return row;
}

int64_t StoreUnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EncodeCheckpoint(const TensorSet& tensors, const TensorSet& extra) {
  std::string header;
  const std::vector<std::string_view> pieces = CheckpointPieces(tensors, extra, &header);
  size_t size = 0;
  for (std::string_view piece : pieces) size += piece.size();
  std::string out;
  out.reserve(size);  // one allocation, not a doubling series
  for (std::string_view piece : pieces) out.append(piece);
  return out;
}

Result<TensorSet> DecodeCheckpoint(const std::string& bytes, const std::string& source) {
  if (bytes.size() < 16 || bytes.compare(0, 8, kCheckpointMagic) != 0) {
    return DataLossError(source + ": not a Tessera checkpoint (expected magic " + kCheckpointMagic + ")");
  }
  uint64_t length = 0;
  std::memcpy(&length, bytes.data() + 8, sizeof(length));
  if (length > bytes.size() - 16 || length > static_cast<uint64_t>(std::numeric_limits<int>::max())) {
    return DataLossError(source + ": truncated manifest: its length field says " + std::to_string(length) +
                         " bytes, the file holds " + std::to_string(bytes.size() - 16) + " after the header");
  }
  if (length > kMaxCheckpointManifestBytes) {
    return DataLossError(source + ": manifest length field: " + std::to_string(length) + " bytes; expected at most " +
                         std::to_string(kMaxCheckpointManifestBytes) + " (any checkpoint's manifest)");
  }
  v1::TensorManifest manifest;
  if (!manifest.ParseFromArray(bytes.data() + 16, static_cast<int>(length))) {
    return DataLossError(source + ": corrupt manifest");
  }
  // Everything the assembler refuses here came from the file: a manifest that parses but
  // does not describe its tensors (a shape, a size or a dtype damaged) is as much DataLoss as
  // a changed value, so that a resume falls back to the checkpoint before it.
  const auto damaged = [](const Status& why) {
    return why.code() == StatusCode::kDataLoss ? why : DataLossError(why.message());
  };
  wire::TensorAssembler assembler(source, bytes.size());
  if (Status s = assembler.Start(manifest); !s.ok()) return damaged(s);
  uint64_t offset = 16 + length;
  if (bytes.size() - offset != manifest.total_bytes()) {
    return DataLossError(source + ": expected " + std::to_string(manifest.total_bytes()) + " bytes of tensors, found " +
                         std::to_string(bytes.size() - offset));
  }
  for (int i = 0; i < manifest.tensors_size(); ++i) {
    const uint64_t size = manifest.tensors(i).byte_size();
    if (size == 0) continue;
    v1::TensorChunk chunk;
    chunk.set_tensor_index(i);
    uint64_t done = 0;
    while (done < size) {
      const uint64_t n = std::min<uint64_t>(wire::kMaxChunkBytes, size - done);
      chunk.set_offset(done);
      chunk.set_data(bytes.data() + offset + done, n);
      if (Status s = assembler.Add(chunk); !s.ok()) return damaged(s);
      done += n;
    }
    offset += size;
  }
  auto tensors = assembler.Finish();
  if (!tensors.ok()) return damaged(tensors.status());
  return tensors;
}

Result<StateStore::Checkpoint> StateStore::LoadNewestCheckpoint(const std::string& job_id, uint32_t round,
                                                                std::vector<Status>* damaged) {
  std::vector<uint32_t> candidates;
  for (uint32_t r = round; r > 0 && round - r < kKeptCheckpoints; --r) candidates.push_back(r);
  candidates.push_back(0);
  for (uint32_t r : candidates) {
    auto loaded = LoadCheckpoint(job_id, r);
    if (loaded.ok()) return Checkpoint{r, std::move(loaded).value()};
    // Only a missing or damaged file sends the job back to an older checkpoint; a read that
    // failed for another reason is the error, and the rounds stay as they are.
    const StatusCode code = loaded.status().code();
    if (code != StatusCode::kNotFound && code != StatusCode::kDataLoss) return loaded.status();
    damaged->push_back(loaded.status());
  }
  return DataLossError("job " + job_id + ": no checkpoint of round " + std::to_string(round) +
                       ", the rounds kept before it or the initial model loads; the first error: " +
                       damaged->front().message());
}

}  // namespace tessera::server
