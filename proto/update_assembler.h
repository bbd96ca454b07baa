// Reading an update's envelope back: the chunks of every set, checked as they arrive, each
// tensor checked against its manifest entry's digest of the bytes as sent (xxh3_128 when it
// gives one, else sha256) and decoded to float32 as soon as its last chunk lands. The
// coordinator's half of proto/update_envelope.h; the worker-side tests read uploads with it
// too.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/sha256.h"
#include "base/xxh3.h"
#include "base/status.h"
#include "core/buffer_pool.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "core/value_scan.h"
#include "proto/update_envelope.h"
#include "tessera/v1/tensor.pb.h"

namespace tessera::wire {

// Not thread-safe. Memory: the decoded tensors as they complete, plus the encoded bytes of
// the one tensor being received; nothing is allocated before a tensor's first chunk.
class UpdateAssembler {
 public:
  // `what` names the transfer in errors ("update from worker 'w-2' for job j-1 round 3");
  // `max_decoded_bytes` bounds the float32 bytes the sets decode to; `topk_fraction` is the
  // job's top-k fraction, which fixes each top-k tensor's pair count.
  // `pool`, when given, lends the tensors' buffers (give them back once the update is used).
  UpdateAssembler(std::string what, uint64_t max_decoded_bytes, double topk_fraction,
                  FloatBufferPool* pool = nullptr);

  // Checks the sets' manifests (as UpdateSets gave them, encodings explicit; their header
  // must outlive the call, not the assembler): each
  // tensor's dtype is its set's encoding's, its shape holds at most max_decoded_bytes of
  // float32 (overflow-safe), its byte size is the one its encoding gives that shape, and
  // each manifest's total_bytes is the sum of its tensors'. Errors name the set and tensor.
  Status Start(const std::vector<UpdateSetView>& sets);
  // The float32 bytes the sets decode to, once started.
  uint64_t decoded_bytes() const { return decoded_bytes_; }
  // One chunk: tensor_index counts across the sets in order, chunks of a tensor in offset
  // order, each at most kMaxChunkBytes and within the tensor's declared bytes.
  Status Add(const v1::TensorChunk& chunk);
  // The same in two steps, for a reader that copies a chunk's bytes from the transport
  // itself: BeginChunk checks the chunk as Add does and returns where its `size` bytes go
  // (the tensor's own memory for float32, whose bytes are its values); EndChunk, once they
  // are written there, hashes them and completes the tensor at its last chunk. A chunk
  // begun must be ended before the next.
  Result<uint8_t*> BeginChunk(uint32_t tensor_index, uint64_t offset, uint64_t size);
  Status EndChunk();
  // Between them, instead of writing at BeginChunk's pointer: the chunk's next `n` bytes as
  // the transport holds them, hashed and scanned here while they are in cache and then
  // copied into place; the pieces must add up to the chunk's size by EndChunk. An update of
  // kStreamingMinBytes or more is copied past the caches (core/streaming_copy.h): its fold
  // comes after other updates have been through them, and a smaller one's at once.
  static constexpr uint64_t kStreamingMinBytes = uint64_t{1} << 20;
  Status TakePiece(const uint8_t* data, size_t n);
  // Every tensor complete: the decoded sets, by name.
  Result<std::map<std::string, TensorSet>> Finish();

  // Before Start: the float32 tensors of the set named `name` are scanned (core/value_scan.h)
  // chunk by chunk as they land, while the bytes are in cache, instead of read again later.
  void ScanSet(std::string name) { scan_set_ = std::move(name); }
  // Once every tensor is complete: one entry per tensor of the scanned set, in order, nullopt
  // for one not in float32; empty when no set was named or none had that name.
  TensorScans TakeScans() { return std::move(scans_); }

  uint64_t bytes_received() const { return received_; }

 private:
  struct Pending {
    size_t set = 0;                  // index into sets_
    UpdateEncoding encoding{};
    uint64_t byte_size = 0;
    bool xxh3 = false;               // checked against xxh3_128, else against sha256
    std::string digest;              // the manifest's, lower-case hex
    NamedTensor tensor;              // name and shape; values sized when decoded
    uint64_t elements = 0;
    int scan_slot = -1;              // its place in scans_ when its bytes are scanned as they land
  };
  Status Complete(Pending& pending);  // hash-check, decode, release the bytes
  uint8_t* Destination(Pending& pending);  // where the current tensor's bytes go
  void SizeValues(Pending& pending);        // its values, from the pool when there is one
  std::string Names(const Pending& pending) const;

  const std::string what_;
  const uint64_t max_decoded_bytes_;
  const double topk_fraction_;
  FloatBufferPool* const pool_;
  bool started_ = false;
  std::vector<std::string> set_names_;
  std::vector<Pending> tensors_;      // every set's tensors, in chunk order
  uint64_t decoded_bytes_ = 0;
  uint64_t total_bytes_ = 0;
  size_t current_ = 0;
  uint64_t offset_ = 0;
  std::string buffer_;                // the current tensor's bytes, when not float32
  // The current tensor's bytes so far, by the digest its manifest entry gives.
  std::unique_ptr<Sha256> sha256_;
  std::unique_ptr<Xxh3> xxh3_;       // kept from tensor to tensor, reset for each
  uint8_t* chunk_at_ = nullptr;       // the chunk begun, not yet ended
  uint64_t chunk_size_ = 0;
  uint64_t chunk_taken_ = 0;          // its bytes handed over by TakePiece so far
  bool chunk_in_pieces_ = false;      // hashed and scanned piece by piece, not at EndChunk
  uint64_t received_ = 0;
  std::string scan_set_;
  ValueScan scanner_;                 // the current tensor's, when it is scanned
  TensorScans scans_;
};

}  // namespace tessera::wire
