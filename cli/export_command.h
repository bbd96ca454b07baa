// `tessera export`: a job's global model, fetched from the coordinator, written as a NumPy
// .npz archive keyed by the parameters' names, which are PyTorch's state_dict keys for the
// built-in models (core/model/model.h), so `model.load_state_dict({k: torch.from_numpy(v)
// for k, v in numpy.load(FILE).items()})` loads it; or, for a FILE.onnx, as an ONNX graph of
// the job's model (cli/onnx_export.h).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>

#include "base/status.h"
#include "tessera/v1/job_service.grpc.pb.h"

namespace tessera::cli {

struct ExportOptions {
  std::string job_id;
  std::optional<uint32_t> round;  // unset: the newest committed round
  std::string path;               // the .npz to write (replaced atomically)
  bool json = false;              // the summary line as a JSON object
};

// OK when `path` names a file ExportCommand writes (it ends in .npz or .onnx); otherwise
// InvalidArgument naming -o and the path, escaped, and the endings it takes.
Status CheckExportPath(const std::string& path);

// Downloads the model (its manifest's SHA-256 checked), writes it, and prints what was
// written. The file's extension must be .npz or .onnx.
Status ExportCommand(v1::JobService::StubInterface& stub, const ExportOptions& options, std::ostream& out);

}  // namespace tessera::cli
