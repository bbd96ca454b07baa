// A task channel message written with the model inside it (TrainTask.inline_model) without
// copying the model per worker: protobuf's encoding of a message is the concatenation of its
// fields' encodings, so the task is the worker's own fields followed by one model-sized
// slice that every task of the same model version shares.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "tessera/v1/worker_service.pb.h"

namespace tessera::wire {

// `task` (a TrainTask without inline_model) with `inline_model`, a serialized v1::InlineModel,
// as its TrainTask.inline_model: the bytes of the v1::Task that would carry it, in two
// slices, the second sharing `inline_model` (kept alive until gRPC releases the slice).
// False when the task is not a TrainTask, already carries a model, or does not serialize.
bool TaskWithInlineModel(const v1::Task& task, std::shared_ptr<const std::string> inline_model,
                         grpc::ByteBuffer* out);

// A TrainTask sent to many workers in a round, its shared part serialized once: the bytes of
// the v1::Task whose TrainTask is `shared` (a serialized TrainTask, the same for every worker)
// followed by `own` (a serialized TrainTask holding only this worker's fields: its party, its
// cohort; protobuf merges the two, the later field winning) and, when given, `inline_model`
// (a serialized v1::InlineModel) as its TrainTask.inline_model, in a slice of its own that
// shares it. `shared` must hold no inline model, nor any field `own` may leave at its default
// (a proto3 zero is not written, so it would not override it). False when the task would
// exceed protobuf's 2 GiB limit.
bool TrainTaskWire(const std::string& shared, const std::string& own, std::shared_ptr<const std::string> inline_model,
                   grpc::ByteBuffer* out);

// The reverse of TaskWithInlineModel, for a reader that does not need the model's bytes in
// a parsed message: `task` gets every field of `message` (a serialized v1::Task) but
// TrainTask.inline_model, and `inline_model` that field's bytes (a serialized v1::InlineModel)
// as slices of `message`, shared, not copied; left empty when the task carries no model.
// Whatever is not one TrainTask with at most one model is parsed whole instead, the model
// then serialized into `inline_model`. False when `message` is not a v1::Task.
bool ReadTask(const grpc::ByteBuffer& message, v1::Task* task, grpc::ByteBuffer* inline_model);

// An update sent inside a task session: the bytes of the v1::TaskSessionMessage whose
// `update` is `header_message` (a serialized UpdateChunkMessage carrying the header) followed
// by `chunk_messages` (serialized UpdateChunkMessages carrying chunks). Their field numbers are
// InlineUpdate's, so their concatenation is the InlineUpdate; a tag and a length make it the
// session's message. Their slices are shared, not copied.
grpc::ByteBuffer SessionUpdateMessage(const grpc::ByteBuffer& header_message,
                                      const std::vector<grpc::ByteBuffer>& chunk_messages);

}  // namespace tessera::wire
