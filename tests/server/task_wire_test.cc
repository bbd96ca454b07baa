// A task written with its model inside (proto/task_wire.h): the bytes are those of the task
// with TrainTask.inline_model set, and the model's bytes are shared, not copied.
#include "proto/task_wire.h"

#include <gtest/gtest.h>

#include <vector>

#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"

namespace tessera::wire {
namespace {

v1::InlineModel SomeModel(size_t floats) {
  TensorSet tensors;
  tensors.push_back(NamedTensor{"w", {static_cast<int64_t>(floats)}, std::vector<float>(floats)});
  for (size_t i = 0; i < floats; ++i) tensors[0].values[i] = static_cast<float>(i) * 0.5f;
  v1::InlineModel model;
  *model.mutable_manifest() = BuildManifest(tensors, 1024);
  EXPECT_TRUE(ForEachChunk(tensors, 1024, 0, [&](const v1::TensorChunk& chunk) {
                *model.add_chunks() = chunk;
                return Status::Ok();
              }).ok());
  return model;
}

v1::Task SomeTask() {
  v1::Task task;
  v1::TrainTask& train = *task.mutable_train();
  train.set_job_id("job-1");
  train.set_round(3);
  train.set_attempt(2);
  train.set_model_version(2);
  train.mutable_spec()->set_name("a job");
  train.add_model_sets("server_control");
  return task;
}

TEST(TaskWireTest, AModelInsideATaskReadsAsTheFieldAndIsShared) {
  for (size_t floats : {size_t{0}, size_t{3}, size_t{40}, size_t{5000}}) {
    SCOPED_TRACE(floats);
    const v1::InlineModel model = SomeModel(floats);
    auto bytes = std::make_shared<const std::string>(model.SerializeAsString());
    grpc::ByteBuffer wire;
    ASSERT_TRUE(TaskWithInlineModel(SomeTask(), bytes, &wire));
    v1::Task read;
    ASSERT_TRUE(FromByteBuffer(wire, &read));
    v1::Task expected = SomeTask();
    *expected.mutable_train()->mutable_inline_model() = model;
    EXPECT_EQ(read.SerializeAsString(), expected.SerializeAsString());
    EXPECT_EQ(wire.Length(), expected.ByteSizeLong());
    // Two slices: the task's own fields, then the model's bytes where they already were.
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(wire.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    EXPECT_EQ(static_cast<const void*>(slices[1].begin()), static_cast<const void*>(bytes->data()));
    EXPECT_EQ(slices[1].size(), bytes->size());
    // The slice holds the bytes alive once everything else lets go of them.
    const std::string copy = *bytes;
    bytes.reset();
    slices.clear();
    v1::Task again;
    ASSERT_TRUE(FromByteBuffer(wire, &again));
    EXPECT_EQ(again.train().inline_model().SerializeAsString(), copy);
  }
}

TEST(TaskWireTest, OnlyATrainTaskWithoutAModelTakesOne) {
  auto bytes = std::make_shared<const std::string>(SomeModel(4).SerializeAsString());
  grpc::ByteBuffer wire;
  v1::Task cancel;
  cancel.mutable_cancel()->set_job_id("job-1");
  EXPECT_FALSE(TaskWithInlineModel(cancel, bytes, &wire));
  v1::Task carrying = SomeTask();
  *carrying.mutable_train()->mutable_inline_model() = SomeModel(2);
  EXPECT_FALSE(TaskWithInlineModel(carrying, bytes, &wire));
  EXPECT_FALSE(TaskWithInlineModel(SomeTask(), nullptr, &wire));
}

// An update inside a task session, built from the header's and the chunks' messages as the
// load generator holds them: the bytes protobuf gives the same TaskSessionMessage.
TEST(TaskWireTest, AnUpdateInsideASessionReadsAsTheMessage) {
  const v1::InlineModel model = SomeModel(1000);  // a manifest and chunks to carry
  v1::TaskSessionMessage expected;
  v1::InlineUpdate& update = *expected.mutable_update();
  update.mutable_header()->set_job_id("job-1");
  update.mutable_header()->set_round(3);
  *update.mutable_header()->mutable_manifest() = model.manifest();
  v1::UpdateChunkMessage header;
  *header.mutable_header() = update.header();
  grpc::ByteBuffer header_message;
  ASSERT_TRUE(ToByteBuffer(header, &header_message));
  std::vector<grpc::ByteBuffer> chunk_messages;
  for (const v1::TensorChunk& chunk : model.chunks()) {
    *update.add_chunks() = chunk;
    v1::UpdateChunkMessage message;
    *message.mutable_chunk() = chunk;
    ASSERT_TRUE(ToByteBuffer(message, &chunk_messages.emplace_back()));
  }
  ASSERT_GT(chunk_messages.size(), 1u);
  v1::TaskSessionMessage read;
  ASSERT_TRUE(FromByteBuffer(SessionUpdateMessage(header_message, chunk_messages), &read));
  EXPECT_EQ(read.SerializeAsString(), expected.SerializeAsString());
  // A header alone (a failure report).
  expected.mutable_update()->clear_chunks();
  ASSERT_TRUE(FromByteBuffer(SessionUpdateMessage(header_message, {}), &read));
  EXPECT_EQ(read.SerializeAsString(), expected.SerializeAsString());
}

}  // namespace
}  // namespace tessera::wire
