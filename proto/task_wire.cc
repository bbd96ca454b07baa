#include "proto/task_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpc/slice.h>
#include <grpcpp/support/slice.h>

namespace tessera::wire {
namespace {

using google::protobuf::internal::WireFormatLite;

constexpr int kTrainField = v1::Task::kTrainFieldNumber;
constexpr int kInlineModelField = v1::TrainTask::kInlineModelFieldNumber;

// The slice's reference to the shared model: released by gRPC through Unref.
void Unref(void* user_data) { delete static_cast<std::shared_ptr<const std::string>*>(user_data); }

}  // namespace

bool TaskWithInlineModel(const v1::Task& task, std::shared_ptr<const std::string> inline_model,
                         grpc::ByteBuffer* out) {
  if (!task.has_train() || task.train().has_inline_model() || !inline_model) return false;
  std::string train;
  if (!task.train().SerializeToString(&train)) return false;
  const uint64_t model_bytes = inline_model->size();
  const uint32_t model_tag = WireFormatLite::MakeTag(kInlineModelField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
  const uint64_t train_bytes = train.size() + google::protobuf::io::CodedOutputStream::VarintSize32(model_tag) +
                               google::protobuf::io::CodedOutputStream::VarintSize64(model_bytes) + model_bytes;
  if (train_bytes > uint64_t{INT32_MAX}) return false;  // beyond protobuf's limit
  std::string prefix;
  {
    google::protobuf::io::StringOutputStream stream(&prefix);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.WriteTag(WireFormatLite::MakeTag(kTrainField, WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
    coded.WriteVarint64(train_bytes);
    coded.WriteRaw(train.data(), static_cast<int>(train.size()));
    coded.WriteTag(model_tag);
    coded.WriteVarint64(model_bytes);
  }
  const std::string& model = *inline_model;
  auto* reference = new std::shared_ptr<const std::string>(std::move(inline_model));
  grpc::Slice slices[2] = {
      grpc::Slice(prefix),
      grpc::Slice(grpc_slice_new_with_user_data(const_cast<char*>(model.data()), model.size(), Unref, reference),
                  grpc::Slice::STEAL_REF)};
  *out = grpc::ByteBuffer(slices, 2);
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
