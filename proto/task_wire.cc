#include "proto/task_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/slice.h>
#include <grpcpp/support/proto_buffer_reader.h>
#include <grpcpp/support/slice.h>

#include <algorithm>
#include <limits>

#include "proto/byte_buffers.h"

namespace tessera::wire {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kTrainField = v1::Task::kTrainFieldNumber;
constexpr int kInlineModelField = v1::TrainTask::kInlineModelFieldNumber;

constexpr uint32_t kTrainTag = WireFormatLite::MakeTag(kTrainField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
constexpr uint32_t kInlineModelTag = WireFormatLite::MakeTag(kInlineModelField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);

// Bytes [begin, end) of `message` as slices sharing its own.
grpc::ByteBuffer SubBuffer(const grpc::ByteBuffer& message, uint64_t begin, uint64_t end) {
  std::vector<grpc::Slice> slices, parts;
  if (!message.Dump(&slices).ok()) return grpc::ByteBuffer();
  uint64_t at = 0;
  for (const grpc::Slice& slice : slices) {
    const uint64_t from = std::max(begin, at), to = std::min<uint64_t>(end, at + slice.size());
    if (from < to) parts.push_back(slice.sub(from - at, to - at));
    at += slice.size();
    if (at >= end) break;
  }
  return grpc::ByteBuffer(parts.data(), parts.size());
}

// The in-place read of ReadTask: false when `message` is not laid out as one TrainTask with
// at most one model (the caller parses it whole).
bool ReadTrainTaskInPlace(const grpc::ByteBuffer& message, v1::Task* task, grpc::ByteBuffer* inline_model) {
  const uint64_t total = message.Length();
  if (total > static_cast<uint64_t>(std::numeric_limits<int>::max())) return false;
  grpc::ProtoBufferReader reader(Unowned(message));
  google::protobuf::io::CodedInputStream in(&reader);
  in.SetTotalBytesLimit(std::numeric_limits<int>::max());
  uint32_t length = 0;
  if (in.ReadTag() != kTrainTag || !in.ReadVarint32(&length)) return false;
  if (static_cast<uint64_t>(in.CurrentPosition()) + length != total) return false;  // other fields too
  std::string fields;  // the TrainTask's fields but its model, as they came
  int64_t model_at = -1;
  uint32_t model_bytes = 0;
  {
    google::protobuf::io::StringOutputStream stream(&fields);
    google::protobuf::io::CodedOutputStream out(&stream);
    for (uint32_t tag = in.ReadTag(); tag != 0; tag = in.ReadTag()) {
      if (tag == kInlineModelTag) {
        if (model_at >= 0 || !in.ReadVarint32(&model_bytes)) return false;  // a second model merges: parsed
        model_at = in.CurrentPosition();
        if (!in.Skip(static_cast<int>(model_bytes))) return false;
      } else if (!WireFormatLite::SkipField(&in, tag, &out)) {
        return false;
      }
    }
  }
  if (static_cast<uint64_t>(in.CurrentPosition()) != total) return false;
  if (!task->mutable_train()->ParseFromString(fields)) return false;
  if (model_at >= 0) {
    *inline_model = SubBuffer(message, static_cast<uint64_t>(model_at), static_cast<uint64_t>(model_at) + model_bytes);
  }
  return true;
}

// The slice's reference to the shared model: released by gRPC through Unref.
void Unref(void* user_data) { delete static_cast<std::shared_ptr<const std::string>*>(user_data); }

}  // namespace

bool TaskWithInlineModel(const v1::Task& task, std::shared_ptr<const std::string> inline_model,
                         grpc::ByteBuffer* out) {
  if (!task.has_train() || task.train().has_inline_model() || !inline_model) return false;
  std::string train;
  if (!task.train().SerializeToString(&train)) return false;
  return TrainTaskWire(train, std::string(), std::move(inline_model), out);
}

bool TrainTaskWire(const std::string& shared, const std::string& own, std::shared_ptr<const std::string> inline_model,
                   grpc::ByteBuffer* out) {
  using google::protobuf::io::CodedOutputStream;
  const uint64_t model_bytes = inline_model ? inline_model->size() : 0;
  const uint64_t model_head = inline_model ? CodedOutputStream::VarintSize32(kInlineModelTag) +
                                                 CodedOutputStream::VarintSize64(model_bytes)
                                           : 0;
  const uint64_t train_bytes = shared.size() + own.size() + model_head + model_bytes;
  if (train_bytes > uint64_t{INT32_MAX}) return false;  // beyond protobuf's limit
  // The task's fields in one slice (the shared part is small: a job's spec and the round's
  // ids), then the model, lent.
  const size_t head = CodedOutputStream::VarintSize32(kTrainTag) + CodedOutputStream::VarintSize64(train_bytes);
  grpc_slice fields = grpc_slice_malloc(head + shared.size() + own.size() + model_head);
  uint8_t* at = GRPC_SLICE_START_PTR(fields);
  at = CodedOutputStream::WriteTagToArray(kTrainTag, at);
  at = CodedOutputStream::WriteVarint64ToArray(train_bytes, at);
  at = std::copy(shared.begin(), shared.end(), at);
  at = std::copy(own.begin(), own.end(), at);
  if (inline_model) {
    at = CodedOutputStream::WriteTagToArray(kInlineModelTag, at);
    at = CodedOutputStream::WriteVarint64ToArray(model_bytes, at);
  }
  grpc::Slice slices[2] = {grpc::Slice(fields, grpc::Slice::STEAL_REF), grpc::Slice()};
  size_t count = 1;
  if (inline_model && model_bytes > 0) {
    const std::string& model = *inline_model;
    auto* reference = new std::shared_ptr<const std::string>(std::move(inline_model));
    slices[count++] = grpc::Slice(grpc_slice_new_with_user_data(const_cast<char*>(model.data()), model.size(), Unref,
                                                                reference),
                                  grpc::Slice::STEAL_REF);
  }
  *out = grpc::ByteBuffer(slices, count);
  return true;
}

bool ReadTask(const grpc::ByteBuffer& message, v1::Task* task, grpc::ByteBuffer* inline_model) {
  task->Clear();
  inline_model->Clear();
  if (ReadTrainTaskInPlace(message, task, inline_model)) return true;
  task->Clear();
  inline_model->Clear();
  if (!FromByteBuffer(message, task)) return false;
  if (task->has_train() && task->train().has_inline_model()) {
    if (!ToByteBuffer(task->train().inline_model(), inline_model)) return false;
    task->mutable_train()->clear_inline_model();
  }
  return true;
}

grpc::ByteBuffer SessionUpdateMessage(const grpc::ByteBuffer& header_message,
                                      const std::vector<grpc::ByteBuffer>& chunk_messages) {
  uint64_t length = header_message.Length();
  for (const grpc::ByteBuffer& chunk : chunk_messages) length += chunk.Length();
  std::string prefix;
  {
    google::protobuf::io::StringOutputStream stream(&prefix);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(v1::TaskSessionMessage::kUpdateFieldNumber,
                                           WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(length);
  }
  std::vector<grpc::Slice> slices{grpc::Slice(prefix)};
  auto append = [&slices](const grpc::ByteBuffer& buffer) {
    std::vector<grpc::Slice> parts;
    if (buffer.Dump(&parts).ok()) slices.insert(slices.end(), parts.begin(), parts.end());
  };
  append(header_message);
  for (const grpc::ByteBuffer& chunk : chunk_messages) append(chunk);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

}  // namespace tessera::wire
