#include "cli/export_command.h"

#include <google/protobuf/struct.pb.h>

#include <ostream>

#include "base/escape.h"
#include "cli/onnx_export.h"
#include "core/data/numpy_format.h"
#include "core/model/model.h"
#include "device/cpu/factory.h"
#include "proto/job_mapping.h"
#include "proto/grpc_status.h"
#include "proto/json.h"
#include "proto/tensor_transfer.h"

namespace tessera::cli {
namespace {

// The largest model an export accepts: the job-spec bound on models (proto/job_mapping.cc)
// is far below it.
constexpr uint64_t kMaxExportBytes = uint64_t{4} << 30;

}  // namespace

Status CheckExportPath(const std::string& path) {
  if (path.ends_with(".onnx") || path.ends_with(".npz")) return Status::Ok();
  return InvalidArgumentError("-o " + QuoteUntrusted(path, 256) +
                              ": expected a file ending in .npz (a NumPy archive keyed by parameter names) or .onnx");
}

Status ExportCommand(v1::JobService::StubInterface& stub, const ExportOptions& options, std::ostream& out) {
  const bool onnx = options.path.ends_with(".onnx");
  RETURN_IF_ERROR(CheckExportPath(options.path));
  v1::ExportModelRequest request;
  request.set_job_id(options.job_id);
  if (options.round) request.set_round(*options.round);
  grpc::ClientContext ctx;
  auto reader = stub.ExportModel(&ctx, request);
  const std::string what = "model of job " + options.job_id +
                           (options.round ? " round " + std::to_string(*options.round) : std::string(" (newest round)"));
  wire::TensorAssembler assembler(what, kMaxExportBytes);
  v1::ModelChunkMessage message;
  bool started = false;
  uint64_t version = 0;
  std::string sha256;
  Status failed;
  while (reader->Read(&message)) {
    if (!failed.ok()) continue;  // drain, then report the first error
    if (!started) {
      if (!message.has_manifest()) {
        failed = DataLossError(what + ": the coordinator sent a chunk before the manifest");
        continue;
      }
      version = message.model_version();
      sha256 = message.model_sha256();
      failed = assembler.Start(message.manifest());
      started = true;
    } else if (message.has_chunk()) {
      failed = assembler.Add(message.chunk());
    } else {
      failed = DataLossError(what + ": a second manifest in one export");
    }
  }
  const grpc::Status end = reader->Finish();
  if (!end.ok()) return wire::FromGrpc(end);
  RETURN_IF_ERROR(failed);
  if (!started) return DataLossError(what + ": the coordinator sent nothing");
  ASSIGN_OR_RETURN(TensorSet tensors, assembler.Finish());
  // The coordinator names every model's digest: an export without one cannot be checked, and is
  // not written as if it had been.
  if (sha256.empty()) return DataLossError(what + ": the coordinator sent no SHA-256 for the model");
  if (TensorSetSha256(tensors) != sha256) {
    return DataLossError(what + ": the tensors do not hash to the model's SHA-256 " + QuoteUntrusted(sha256, 64));
  }
  // A file named for round R holds round R's model, whatever the coordinator sent.
  if (options.round && version != *options.round) {
    return DataLossError(what + ": the coordinator sent the model of round " + std::to_string(version));
  }
  const int64_t parameters = TotalElements(tensors);
  if (onnx) {
    // The graph comes from the job's model spec; the parameters from the export.
    v1::GetJobRequest get;
    get.set_job_id(options.job_id);
    v1::GetJobResponse job;
    grpc::ClientContext get_ctx;
    if (grpc::Status s = stub.GetJob(&get_ctx, get, &job); !s.ok()) return wire::FromGrpc(s);
    // The spec's model is built only once its size is the export's: a spec that declares
    // more (another job's, a coordinator's mistake) would otherwise be allocated, and filled
    // with initial weights, before the layouts were compared.
    const ModelConfig config = wire::ToModelConfig(job.job().spec());
    auto declared = CountParameters(config);
    if (!declared.ok()) return declared.status().WithContext(what + ": the job's model spec");
    if (*declared != parameters) {
      return DataLossError(what + ": the job's model spec (" + QuoteUntrusted(config.name, 64) + ") has " +
                           std::to_string(*declared) + " values; the exported model has " +
                           std::to_string(parameters));
    }
    auto device = CreateCpuDevice(CpuDeviceOptions{.num_threads = 1});
    auto model = CreateModelWithState(config, device.get(), tensors);
    if (!model.ok()) return model.status().WithContext(what);
    RETURN_IF_ERROR(WriteOnnx(**model, job.job().spec().name().empty() ? options.job_id : job.job().spec().name(),
                              options.path)
                        .WithContext(what));
  } else {
    RETURN_IF_ERROR(WriteNpz(options.path, ToNumpy(tensors)).WithContext(what));
  }
  if (options.json) {
    google::protobuf::Struct summary;
    auto& f = *summary.mutable_fields();
    f["job_id"].set_string_value(options.job_id);
    f["round"].set_number_value(static_cast<double>(version));
    f["file"].set_string_value(options.path);
    f["tensors"].set_number_value(static_cast<double>(tensors.size()));
    f["parameters"].set_number_value(static_cast<double>(parameters));
    f["model_sha256"].set_string_value(sha256);
    out << wire::ToJson(summary) << "\n";
  } else {
    out << "wrote " << QuoteUntrusted(options.path, 256) << ": job " << options.job_id << " round " << version << ", " << tensors.size()
        << " tensors, " << parameters << " parameters (model SHA-256 " << sha256.substr(0, 16) << "...)\n";
  }
  return Status::Ok();
}

}  // namespace tessera::cli
