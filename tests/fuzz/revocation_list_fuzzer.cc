// Fuzzes the certificate revocation list reader the coordinator applies under mutual TLS
// (proto/revocation.h, ParseRevocationList): the input is two records (fuzz_records.h), the
// client CA's certificates (PEM) and the list (PEM), so that mutations reach both the CA and
// the list. The file is an operator's, read at start and again whenever it changes.
//
// Checks that an accepted list names its serials as SerialHex writes them: hex digits in whole
// bytes, a '-' before a negative one.
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "fuzz_records.h"
#include "proto/revocation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tessera::fuzz::RecordReader records(data, size);
  std::string_view ca;
  std::string_view list;
  if (!records.Next(&ca) || !records.Next(&list)) return 0;
  auto parsed = tessera::wire::ParseRevocationList(std::string(list), std::string(ca), "fuzzed-crl.pem");
  if (!parsed.ok()) return 0;
  for (const std::string& serial : parsed->serials) {
    const std::string_view digits = serial.size() > 0 && serial[0] == '-' ? std::string_view(serial).substr(1) : serial;
    FUZZ_CHECK(!digits.empty() && digits.size() % 2 == 0, "a serial of whole bytes: " + serial);
    FUZZ_CHECK(digits.find_first_not_of("0123456789ABCDEF") == std::string_view::npos, "a serial in hex: " + serial);
  }
  return 0;
}
