// Fuzzes the update envelope (proto/update_envelope.h) the way the coordinator reads an upload:
// UpdateSets on the header, one UpdateAssembler over the sets (every encoding; top-k with a
// fraction of 0.25), the chunks, Finish. Input: records (fuzz_records.h), the first a
// serialized v1::UpdateHeader, each further one a serialized v1::TensorChunk.
//
// Each chunk goes in twice, into two assemblers: parsed and added (UpdateAssembler::Add), and
// as the coordinator reads it off the wire, wrapped in an UpdateChunkMessage and cut into two
// gRPC slices where the record's first byte says (wire::AddChunkMessage, which reads the
// writers' layout in place and parses any other). The two must agree on every verdict and on
// every decoded value.
//
// The records also go in whole as one inline update (a TaskSessionMessage carrying the header
// and every chunk, cut into two slices), read by wire::InlineUpdateReader into a third
// assembler: it must accept exactly the uploads the parsed chunks make whole.
//
// Checks that an accepted header has a "delta" set and at most kMaxUpdateSets sets, and that an
// accepted upload decodes into sets of the tensors, names and element counts their manifests
// declare.
#include <grpcpp/support/byte_buffer.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "fuzz_records.h"
#include "fuzz_wire.h"
#include "proto/update_assembler.h"
#include "proto/update_chunk_reader.h"
#include "proto/update_envelope.h"

namespace {

constexpr uint64_t kMaxModelBytes = 1 << 20;
constexpr double kTopKFraction = 0.25;

// `field` (length-delimited) holding `bytes`, appended to `out`.
void AppendField(int field, std::string_view bytes, std::string* out) {
  out->push_back(static_cast<char>((field << 3) | 2));
  for (uint64_t n = bytes.size(); ; n >>= 7) {
    out->push_back(static_cast<char>((n & 0x7f) | (n > 0x7f ? 0x80 : 0)));
    if (n <= 0x7f) break;
  }
  out->append(bytes);
}

// The whole upload as one inline update: whether it is accepted, read as a session reads it;
// and whether it is, parsed chunk by chunk.
void CheckInline(const uint8_t* data, size_t size, const std::vector<tessera::wire::UpdateSetView>& sets) {
  using namespace tessera;
  fuzz::RecordReader records(data, size);
  std::string_view bytes;
  records.Next(&bytes);
  std::string inner;
  AppendField(1, bytes, &inner);
  wire::UpdateAssembler parsed("fuzzed update", kMaxModelBytes, kTopKFraction);
  bool parsed_ok = parsed.Start(sets).ok();
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return;  // not a chunk: not compared
    parsed_ok = parsed_ok && parsed.Add(chunk).ok();
    AppendField(2, bytes, &inner);
  }
  parsed_ok = parsed_ok && parsed.Finish().ok();
  std::string message;
  AppendField(2, inner, &message);
  const size_t cut = message.size() / 2 + (size % 7);
  std::vector<grpc::Slice> slices;
  slices.emplace_back(message.substr(0, std::min(cut, message.size())));
  slices.emplace_back(message.substr(std::min(cut, message.size())));
  wire::InlineUpdateReader reader("fuzzed inline update");
  v1::UpdateHeader header;
  FUZZ_CHECK(reader.Start(grpc::ByteBuffer(slices.data(), slices.size()), &header).ok(),
             "an inline update of a readable header is refused at its header");
  wire::UpdateAssembler read("fuzzed inline update", kMaxModelBytes, kTopKFraction);
  bool read_ok = read.Start(sets).ok();
  read_ok = read_ok && reader.AddChunks(read).ok();
  read_ok = read_ok && read.Finish().ok();
  FUZZ_CHECK(read_ok == parsed_ok, std::string("the whole upload was ") + (parsed_ok ? "accepted" : "refused") +
                                       " parsed but " + (read_ok ? "accepted" : "refused") + " as an inline update");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::RecordReader records(data, size);
  std::string_view bytes;
  if (!records.Next(&bytes)) return 0;
  v1::UpdateHeader header;
  if (!header.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;

  Result<std::vector<wire::UpdateSetView>> sets = wire::UpdateSets(header, "fuzzed update");
  if (!sets.ok()) return 0;
  FUZZ_CHECK(!sets->empty() && sets->size() <= static_cast<size_t>(wire::kMaxUpdateSets), "accepted set count");
  bool has_delta = false;
  for (const auto& set : *sets) {
    has_delta |= set.name == wire::kDeltaSet;
    FUZZ_CHECK(wire::ToUpdateEncoding(set.encoding).ok(), "accepted set '" + std::string(set.name) + "' has no known encoding");
  }
  FUZZ_CHECK(has_delta, "accepted sets have no 'delta' set");

  CheckInline(data, size, *sets);

  wire::UpdateAssembler assembler("fuzzed update", kMaxModelBytes, kTopKFraction);
  wire::UpdateAssembler from_wire("fuzzed update", kMaxModelBytes, kTopKFraction);
  if (!assembler.Start(*sets).ok()) return 0;
  FUZZ_CHECK(from_wire.Start(*sets).ok(), "the same sets start one assembler and not the other");
  while (records.Next(&bytes)) {
    v1::TensorChunk chunk;
    if (!chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return 0;
    const bool added = assembler.Add(chunk).ok();
    const size_t cut = bytes.empty() ? 0 : static_cast<uint8_t>(bytes[0]);
    const bool read = wire::AddChunkMessage(fuzz::AsMessage(bytes, cut), from_wire, "fuzzed update").ok();
    FUZZ_CHECK(added == read, std::string("a chunk was ") + (added ? "added" : "refused") + " parsed but " +
                                  (read ? "added" : "refused") + " read off the wire");
    if (!added) return 0;
  }
  auto split = assembler.Finish();
  auto split_from_wire = from_wire.Finish();
  FUZZ_CHECK(split.ok() == split_from_wire.ok(), "the two assemblers disagree on the whole upload");
  if (!split.ok()) return 0;
  for (const auto& [name, set] : *split) {
    const TensorSet& other = (*split_from_wire)[name];
    FUZZ_CHECK(other.size() == set.size(), "set '" + name + "' has another tensor count read off the wire");
    for (size_t i = 0; i < set.size(); ++i) {
      FUZZ_CHECK(other[i].values.size() == set[i].values.size() &&
                     (set[i].values.empty() ||
                      std::memcmp(other[i].values.data(), set[i].values.data(), set[i].ByteSize()) == 0),
                 "set '" + name + "': tensor " + std::to_string(i) + " decodes to other values read off the wire");
    }
  }
  FUZZ_CHECK(split->size() == sets->size(), "the upload decodes into a different number of sets");
  for (const auto& set : *sets) {
    const std::string name(set.name);
    const TensorSet& part = (*split)[name];
    FUZZ_CHECK(static_cast<int>(part.size()) == set.manifest->tensors_size(),
               "set '" + name + "' decodes into a different number of tensors");
    for (size_t i = 0; i < part.size(); ++i) {
      FUZZ_CHECK(part[i].name == set.manifest->tensors(static_cast<int>(i)).name(),
                 "set '" + name + "': tensor " + std::to_string(i) + " has another name");
      FUZZ_CHECK(static_cast<int64_t>(part[i].values.size()) == part[i].NumElements(),
                 "set '" + name + "': tensor " + std::to_string(i) + " has another element count");
    }
  }
  return 0;
}
