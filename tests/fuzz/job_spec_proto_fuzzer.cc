// Fuzzes the job spec as it reaches the coordinator from any client: a serialized v1::JobSpec,
// then ValidateJobSpec and the mappings onto core's configurations (proto/job_mapping.h), then
// JobSpecToToml ("tessera job show") on what was accepted. Input: the serialized message.
//
// Checks that a valid spec maps to a partition (unless it brings its own files) and that its
// TOML rendering reads back as well-formed TOML: strings of any bytes are escaped.
#include <toml++/toml.h>

#include <string>

#include "cli/job_spec.h"
#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "proto/job_mapping.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  v1::JobSpec spec;
  if (!spec.ParseFromArray(data, static_cast<int>(size))) return 0;
  if (!wire::ValidateJobSpec(spec).ok()) return 0;

  (void)wire::ToModelConfig(spec);
  Result<PartitionConfig> partition = wire::ToPartitionConfig(spec);
  if (spec.data().partition().kind() != v1::PARTITION_LOCAL_FILES) {
    FUZZ_CHECK(partition.ok(), "a valid spec has no partition: " + partition.status().ToString());
  }
  (void)wire::ToTrainOptions(spec, 1, 0);
  (void)wire::DatasetDirectory(spec);

  const std::string toml = JobSpecToToml(spec);
  try {
    (void)toml::parse(std::string_view(toml), std::string_view("shown.toml"));
  } catch (const toml::parse_error& error) {
    FUZZ_CHECK(false, "JobSpecToToml wrote malformed TOML: " + std::string(error.description()) + "\n" + toml);
  }
  (void)ParseJobSpecString(toml, "shown.toml");
  return 0;
}
