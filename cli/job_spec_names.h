// Names in job.toml (partition kinds, the adaptive strategies), shared by the reader (cli/job_spec.cc,
// cli/job_spec_tables.cc) and the writer (cli/job_spec_writer.cc).
#pragma once

#include <algorithm>
#include <span>
#include <string>
#include <string_view>

#include "tessera/v1/job.pb.h"

namespace tessera::job_spec_names {

struct KindName {
  std::string_view name;
  v1::PartitionKind kind;
};
inline constexpr KindName kPartitionKinds[] = {
    {"iid", v1::PARTITION_IID},
    {"dirichlet", v1::PARTITION_DIRICHLET},
    {"label-quantity", v1::PARTITION_LABEL_QUANTITY},
    {"quantity", v1::PARTITION_QUANTITY},
    {"local-files", v1::PARTITION_LOCAL_FILES},
};

// [compression] encoding.
struct EncodingName {
  std::string_view name;
  v1::Encoding encoding;
};
inline constexpr EncodingName kEncodings[] = {
    {"float32", v1::ENCODING_FLOAT32}, {"float16", v1::ENCODING_FLOAT16}, {"bfloat16", v1::ENCODING_BFLOAT16},
    {"int8", v1::ENCODING_INT8},       {"topk", v1::ENCODING_TOPK},
};

inline constexpr std::string_view kAdaptiveStrategies[] = {"fedadam", "fedyogi", "fedadagrad"};

inline bool IsOneOf(const std::string& value, std::span<const std::string_view> names) {
  return std::find(names.begin(), names.end(), value) != names.end();
}

}  // namespace tessera::job_spec_names
