// Included by exactly one source file of each fuzzer that parses protobuf messages: fuzzed
// bytes make protobuf log every invalid UTF-8 string it meets, which would bury the findings.
#pragma once

#include <google/protobuf/stubs/logging.h>

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}
