// Fuzzes the job.toml reader (cli/job_spec.h) and what the coordinator does with the spec it
// produces (proto/job_mapping.h). Input: the TOML text.
//
// Checks two promises: a spec the reader accepts passes the coordinator's ValidateJobSpec (an
// operator never gets past the CLI with a spec the coordinator refuses), and
// ParseJobSpecString(JobSpecToToml(s)) gives s back.
#include <google/protobuf/util/message_differencer.h>

#include <string>
#include <string_view>

#include "cli/job_spec.h"
#include "fuzz_check.h"
#include "quiet_protobuf_log.h"
#include "proto/job_mapping.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<v1::JobSpec> spec = ParseJobSpecString(text, "fuzzed.toml");
  if (!spec.ok()) return 0;

  const Status valid = wire::ValidateJobSpec(*spec);
  FUZZ_CHECK(valid.ok(), "the coordinator refuses a spec the reader accepted: " + valid.ToString());
  (void)wire::ToModelConfig(*spec);
  (void)wire::ToPartitionConfig(*spec);
  (void)wire::ToTrainOptions(*spec, 3, 1);
  (void)wire::DatasetDirectory(*spec);

  const std::string toml = JobSpecToToml(*spec);
  Result<v1::JobSpec> again = ParseJobSpecString(toml, "written.toml");
  FUZZ_CHECK(again.ok(), "JobSpecToToml wrote TOML the reader refuses: " + again.status().ToString() + "\n" + toml);
  std::string differences;
  google::protobuf::util::MessageDifferencer differencer;
  differencer.ReportDifferencesToString(&differences);
  FUZZ_CHECK(differencer.Compare(*spec, *again), "the TOML round trip changes the spec: " + differences + "\n" + toml);
  return 0;
}
