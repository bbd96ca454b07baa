// Reading an update's envelope back: the chunks of every set, checked as they arrive, each
// tensor hash-checked against its manifest entry (the bytes as sent) and decoded to float32
// as soon as its last chunk lands. The coordinator's half of proto/update_envelope.h; the
// worker-side tests read uploads with it too.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "base/status.h"
#include "core/tensor.h"
#include "core/update_codec.h"
#include "tessera/v1/tensor.pb.h"

namespace tessera::wire {

// Not thread-safe. Memory: the decoded tensors as they complete, plus the encoded bytes of
// the one tensor being received; nothing is allocated before a tensor's first chunk.
class UpdateAssembler {
 public:
  // `what` names the transfer in errors ("update from worker 'w-2' for job j-1 round 3");
  // `max_decoded_bytes` bounds the float32 bytes the sets decode to; `topk_fraction` is the
  // job's top-k fraction, which fixes each top-k tensor's pair count.
  UpdateAssembler(std::string what, uint64_t max_decoded_bytes, double topk_fraction);

  // Checks the sets' manifests (as UpdateSets returned them, encodings explicit): each
  // tensor's dtype is its set's encoding's, its shape holds at most max_decoded_bytes of
  // float32 (overflow-safe), its byte size is the one its encoding gives that shape, and
  // each manifest's total_bytes is the sum of its tensors'. Errors name the set and tensor.
  Status Start(const std::vector<v1::TensorSetInfo>& sets);
  // The float32 bytes the sets decode to, once started.
  uint64_t decoded_bytes() const { return decoded_bytes_; }
  // One chunk: tensor_index counts across the sets in order, chunks of a tensor in offset
  // order, each at most kMaxChunkBytes and within the tensor's declared bytes.
  Status Add(const v1::TensorChunk& chunk);
  // Every tensor complete: the decoded sets, by name.
  Result<std::map<std::string, TensorSet>> Finish();

  uint64_t bytes_received() const { return received_; }

 private:
  struct Pending {
    size_t set = 0;                  // index into sets_
    UpdateEncoding encoding{};
    uint64_t byte_size = 0;
    std::string sha256;
    NamedTensor tensor;              // name and shape; values sized when decoded
    uint64_t elements = 0;
  };
  Status Complete(Pending& pending);  // hash-check, decode, release the bytes
  std::string Names(const Pending& pending) const;

  const std::string what_;
  const uint64_t max_decoded_bytes_;
  const double topk_fraction_;
  bool started_ = false;
  std::vector<std::string> set_names_;
  std::vector<Pending> tensors_;      // every set's tensors, in chunk order
  uint64_t decoded_bytes_ = 0;
  uint64_t total_bytes_ = 0;
  size_t current_ = 0;
  uint64_t offset_ = 0;
  std::string buffer_;                // the current tensor's bytes so far
  uint64_t received_ = 0;
};

}  // namespace tessera::wire
