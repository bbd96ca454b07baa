// A task written with its model inside (proto/task_wire.h): the bytes are those of the task
// with TrainTask.inline_model set, and the model's bytes are shared, not copied.
#include "proto/task_wire.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "proto/byte_buffers.h"
#include "proto/tensor_transfer.h"
#include "tests/server/message_bytes.h"

namespace tessera::wire {
namespace {

using testing::Flatten;

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

// A round's task serialized once, each worker's own fields after it: one merged TrainTask,
// with or without a model, and read in place as the load generator reads it.
TEST(TaskWireTest, ARoundsSharedTaskAndAWorkersOwnFieldsReadAsOneMergedTask) {
  const v1::TrainTask shared = SomeTask().train();
  v1::TrainTask own;
  own.set_party_index(7);
  own.set_cohort("c1");
  own.set_cohort_rank(1);
  own.set_cohort_size(2);
  own.set_collective_backend("gloo");
  own.set_rendezvous_prefix("rendezvous/job-1/3/2/c1/");
  const v1::InlineModel model = SomeModel(40);
  for (bool with_model : {false, true}) {
    SCOPED_TRACE(with_model);
    auto model_bytes = with_model ? std::make_shared<const std::string>(model.SerializeAsString()) : nullptr;
    grpc::ByteBuffer wire;
    ASSERT_TRUE(TrainTaskWire(shared.SerializeAsString(), own.SerializeAsString(), model_bytes, &wire));
    v1::Task expected;
    *expected.mutable_train() = shared;
    expected.mutable_train()->MergeFrom(own);
    if (with_model) *expected.mutable_train()->mutable_inline_model() = model;
    v1::Task read;
    ASSERT_TRUE(FromByteBuffer(wire, &read));
    EXPECT_EQ(read.SerializeAsString(), expected.SerializeAsString());
    EXPECT_EQ(read.train().party_index(), 7u);
    EXPECT_EQ(read.train().spec().name(), "a job");

    v1::Task in_place;
    grpc::ByteBuffer model_wire;
    ASSERT_TRUE(ReadTask(wire, &in_place, &model_wire));
    expected.mutable_train()->clear_inline_model();
    EXPECT_EQ(in_place.SerializeAsString(), expected.SerializeAsString());
    if (with_model) {
      EXPECT_EQ(Flatten(model_wire), *model_bytes);
      std::vector<grpc::Slice> slices;
      ASSERT_TRUE(model_wire.Dump(&slices).ok());
      ASSERT_EQ(slices.size(), 1u);  // the model's own bytes, not a copy
      EXPECT_EQ(static_cast<const void*>(slices[0].begin()), static_cast<const void*>(model_bytes->data()));
    } else {
      EXPECT_EQ(model_wire.Length(), 0u);
    }
  }
  // Nothing of this worker's own: the shared task alone.
  grpc::ByteBuffer wire;
  ASSERT_TRUE(TrainTaskWire(shared.SerializeAsString(), std::string(), nullptr, &wire));
  v1::Task read;
  ASSERT_TRUE(FromByteBuffer(wire, &read));
  EXPECT_EQ(read.train().SerializeAsString(), shared.SerializeAsString());
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

// `bytes` cut into `pieces` slices at uneven places, as the transport hands a message over.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t pieces) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t end = i + 1 == pieces ? bytes.size() : std::min(bytes.size(), at + bytes.size() / pieces + 7 * i);
    slices.emplace_back(bytes.data() + at, end - at);
    at = end;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(TaskWireTest, ATaskReadsWithItsModelLeftInTheMessage) {
  for (size_t floats : {size_t{0}, size_t{40}, size_t{5000}}) {
    for (size_t pieces : {size_t{1}, size_t{3}, size_t{17}}) {
      SCOPED_TRACE(std::to_string(floats) + " floats, " + std::to_string(pieces) + " slices");
      const v1::InlineModel model = SomeModel(floats);
      v1::Task full = SomeTask();
      *full.mutable_train()->mutable_inline_model() = model;
      const std::string bytes = full.SerializeAsString();
      const grpc::ByteBuffer wire = Sliced(bytes, pieces);
      v1::Task task;
      grpc::ByteBuffer inline_model;
      ASSERT_TRUE(ReadTask(wire, &task, &inline_model));
      EXPECT_EQ(task.SerializeAsString(), SomeTask().SerializeAsString());  // everything but the model
      EXPECT_FALSE(task.train().has_inline_model());
      ASSERT_TRUE(inline_model.Valid());
      EXPECT_EQ(Flatten(inline_model), model.SerializeAsString());
      // Shared with the message, not copied: the model's slices point into the message's.
      std::vector<grpc::Slice> parts;
      ASSERT_TRUE(inline_model.Dump(&parts).ok());
      if (!parts.empty() && parts[0].size() > 0) {
        const char* first = reinterpret_cast<const char*>(parts[0].begin());
        std::vector<grpc::Slice> whole;
        ASSERT_TRUE(wire.Dump(&whole).ok());
        bool inside = false;
        for (const grpc::Slice& slice : whole) {
          const char* begin = reinterpret_cast<const char*>(slice.begin());
          inside = inside || (first >= begin && first < begin + slice.size());
        }
        EXPECT_TRUE(inside);
      }
    }
  }
}

TEST(TaskWireTest, ATaskWithoutAModelOrInAnotherLayoutReadsAsParsed) {
  v1::Task task;
  grpc::ByteBuffer inline_model;
  // No model: the task alone, and no model bytes.
  ASSERT_TRUE(ReadTask(Sliced(SomeTask().SerializeAsString(), 2), &task, &inline_model));
  EXPECT_EQ(task.SerializeAsString(), SomeTask().SerializeAsString());
  EXPECT_FALSE(inline_model.Valid());
  // A cancel or a verdict: parsed.
  v1::Task cancel;
  cancel.mutable_cancel()->set_job_id("job-1");
  cancel.mutable_cancel()->set_attempt(2);
  ASSERT_TRUE(ReadTask(Sliced(cancel.SerializeAsString(), 1), &task, &inline_model));
  EXPECT_EQ(task.SerializeAsString(), cancel.SerializeAsString());
  EXPECT_FALSE(inline_model.Valid());
  // Two models in one TrainTask merge as protobuf merges them: parsed whole, the merged model
  // serialized.
  v1::Task first = SomeTask(), second;
  *first.mutable_train()->mutable_inline_model() = SomeModel(3);
  *second.mutable_train()->mutable_inline_model()->mutable_manifest() = SomeModel(5).manifest();
  const std::string twice = first.SerializeAsString() + second.SerializeAsString();
  v1::Task merged;
  ASSERT_TRUE(merged.ParseFromString(twice));
  ASSERT_TRUE(ReadTask(Sliced(twice, 4), &task, &inline_model));
  EXPECT_EQ(Flatten(inline_model), merged.train().inline_model().SerializeAsString());
  merged.mutable_train()->clear_inline_model();
  EXPECT_EQ(task.SerializeAsString(), merged.SerializeAsString());
  // Not a task at all.
  EXPECT_FALSE(ReadTask(Sliced(std::string("\x0a\xff\xff\xff\xff\x0f", 6), 1), &task, &inline_model));
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
