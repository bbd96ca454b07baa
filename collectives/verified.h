// VerifiedCommunicator: detects calls that do not match across ranks on backends that cannot
// (Gloo, Open MPI and NCCL compute garbage, crash or hang when ranks disagree on a count, an
// op or a root). CreateCommunicator applies it to every backend whose capabilities say
// !verifies_calls, unless CommunicatorOptions::verify_calls is false.
//
// Collectives: before each call every rank contributes a fingerprint of the call (sequence
// number, op, dtype, count, reduce op, root) and its bitwise complement (~x, the negation
// less one, which no value overflows) to ONE allreduce(max) of 12 int64 values through the
// wrapped backend (its DoHostAllreduce); max == min per field means every rank is making the
// same call, and only then does the call itself run. Otherwise no
// data moves and every rank returns INVALID_ARGUMENT:
//   "rank 1: allreduce call mismatch across ranks (count differs): this rank called
//    allreduce #0 (count 20, float32, sum); rank 0 called allreduce #0 (count 10, float32,
//    sum)"
// The other ranks' calls come from a second allreduce (sum of zero-padded fingerprints,
// 48*size bytes) on the mismatch path only. Every rank ran the same two exchanges, so the
// communicator stays usable and the next call is verified normally.
//
// Send/Recv: each Send first sends a 40-byte header (MessageHeader: tag, dtype, count,
// number of the message on this pair) through DoHostSend on a tag of its own, the wrapped
// communicator's top tag (ReserveTopTag: on mpi at most MPI_TAG_UB, which the standard only
// guarantees to be 32767); callers get the tags below it, and a caller's tag at or above it
// is INVALID_ARGUMENT naming the tag and the bound, so headers and messages never share one; each Recv
// receives it and compares it with its own call before receiving the payload. A difference
// is FAILED_PRECONDITION at the receiver, naming the sender and both calls ("call mismatch
// with rank 0: this rank expected send #0 (count 10, ...), rank 0 sent send #0 (count 20,
// ...)"); the pair's stream is then out of step, so the communicator must be recreated. The
// sender learns nothing (a reply would double every send's latency); its next call on that
// pair fails or times out.
//
// A rank that issues a collective while its peers issue a Send/Recv (or nothing) is not a
// mismatch this layer can see: that call times out as with a stalled peer.
//
// Cost: one extra small allreduce per collective (latency-bound; see docs/COLLECTIVES.md for
// measurements) and one extra small message per send. No allocation per call on the
// matching path. Thread safety: as Communicator.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace tessera::collectives {

class VerifiedCommunicator final : public Communicator {
 public:
  explicit VerifiedCommunicator(std::unique_ptr<Communicator> base);

  std::string_view backend_name() const override { return base_->backend_name(); }
  // The wrapped backend's capabilities (verifies_calls stays as the backend declares it) but
  // for max_tag: one less, the top tag carrying the headers.
  const CommunicatorCapabilities& capabilities() const override { return capabilities_; }
  Communicator& base() { return *base_; }
  // Collectives verified so far (matching or not), for tests and accounting.
  uint64_t verified_calls() const { return sequence_; }

  // The tag of the Send/Recv headers: the wrapped communicator's max_tag.
  int header_tag() const { return header_tag_; }

 protected:
  Status DoAllreduce(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                     Deadline deadline) override;
  Status DoBroadcast(void* buffer, size_t count, DataType type, int root,
                     Deadline deadline) override;
  Status DoAllgather(const void* send, void* recv, size_t count, DataType type,
                     Deadline deadline) override;
  Status DoReduceScatter(const void* send, void* recv, size_t count, DataType type, ReduceOp op,
                         Deadline deadline) override;
  Status DoBarrier(Deadline deadline) override;
  Status DoSend(const void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoRecv(void* buffer, size_t count, DataType type, int peer, int tag,
                Deadline deadline) override;
  Status DoHostAllreduce(int64_t* values, size_t count, ReduceOp op, Deadline deadline) override;
  Status DoHostSend(const void* bytes, size_t size, int peer, int tag,
                    Deadline deadline) override;
  Status DoHostRecv(void* bytes, size_t size, int peer, int tag, Deadline deadline) override;

 private:
  // sequence, op, dtype, count, reduce op, root; -1 where a field does not apply.
  static constexpr size_t kFields = 6;
  using Fingerprint = std::array<int64_t, kFields>;

  // OK when every rank's fingerprint equals `mine`; INVALID_ARGUMENT (as above) when not;
  // the backend's error when the exchange itself fails.
  Status Verify(const Fingerprint& mine, Deadline deadline);
  Status ReportMismatch(const Fingerprint& mine, const std::array<bool, kFields>& differs,
                        Deadline deadline);
  Fingerprint Make(CollectiveOp op, int64_t dtype, size_t count, int64_t reduce_op,
                   int64_t root);

  std::unique_ptr<Communicator> base_;
  int header_tag_ = 0;
  CommunicatorCapabilities capabilities_;
  uint64_t sequence_ = 0;                 // collectives issued through this communicator
  std::vector<uint64_t> sent_to_;         // Send headers per peer
  std::vector<uint64_t> received_from_;   // Recv headers per peer
  std::vector<int64_t> gathered_;         // mismatch path only: size * kFields
};

}  // namespace tessera::collectives
