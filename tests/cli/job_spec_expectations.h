// What the job-spec tests share: the smallest spec the reader accepts, and expectations on
// the reader's and the wire checks' refusals.
#pragma once

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "cli/job_spec.h"
#include "proto/job_mapping.h"

namespace tessera::testing {

// The smallest spec the reader accepts; tests append or replace lines.
inline constexpr char kMinimal[] = R"(name = "t"
rounds = 5

[model]
name = "simplecnn"

[data.partition]
parties = 4
)";

// Parses `text` and expects an InvalidArgument whose message contains each of `parts`.
inline void ExpectError(const std::string& text, std::initializer_list<std::string> parts) {
  Result<v1::JobSpec> spec = ParseJobSpecString(text, "job.toml");
  ASSERT_FALSE(spec.ok()) << "accepted:\n" << text;
  EXPECT_EQ(spec.status().code(), StatusCode::kInvalidArgument);
  for (const std::string& part : parts) {
    EXPECT_NE(spec.status().message().find(part), std::string::npos)
        << "message lacks '" << part << "': " << spec.status().message();
  }
}

// A spec as it arrives over the wire, valid; tests change one field.
inline v1::JobSpec WireSpec() {
  Result<v1::JobSpec> spec = ParseJobSpecString(kMinimal, "job.toml");
  EXPECT_TRUE(spec.ok()) << spec.status().ToString();
  return *spec;
}

// Expects ValidateJobSpec to refuse `spec` with a message naming `field` and saying what was
// expected, without echoing more than `max_length` bytes.
inline void ExpectRefused(const v1::JobSpec& spec, const std::string& field, const std::string& expected,
                   size_t max_length = 400) {
  Status s = wire::ValidateJobSpec(spec);
  ASSERT_FALSE(s.ok()) << "accepted a spec with a bad " << field;
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("spec." + field + ": expected"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(expected), std::string::npos) << s.message();
  EXPECT_LE(s.message().size(), max_length) << s.message();
}

}  // namespace tessera::testing
