// Writes a minimal, well-formed xclbin (the axlf container XRT loads) describing one kernel:
// the axlf header, an IP_LAYOUT with one compute unit, a MEM_TOPOLOGY with one DDR bank, the
// CONNECTIVITY of every buffer argument to that bank, and EMBEDDED_METADATA XML naming the
// kernel's arguments. It carries no bitstream, so a card cannot run it; XRT's no-op shim
// (XCL_EMULATION_MODE=noop) loads it and drives the whole host-side control path with it.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace tessera::xrt_backend {

struct XclbinKernelArgument {
  std::string name;
  bool is_buffer = false;    // a global memory pointer (else a 4-byte scalar)
  std::string type;          // "float*", "int", "float"
};

struct XclbinSpec {
  std::string kernel_name = "tessera_gemm";
  std::vector<XclbinKernelArgument> arguments;
  uint64_t memory_bytes = uint64_t{1} << 30;  // the DDR bank's size
};

// The kernel Tessera's XRT backend drives: c[m x n] = alpha * op(a) op(b) + beta * c with
// arguments (a, b, c, m, n, k, transpose_flags, alpha, beta).
XclbinSpec GemmKernelSpec(const std::string& kernel_name = "tessera_gemm");

std::vector<char> BuildXclbin(const XclbinSpec& spec);
// Writes BuildXclbin(spec) to `path`; Internal naming the path when it cannot be written.
Status WriteXclbin(const XclbinSpec& spec, const std::string& path);

}  // namespace tessera::xrt_backend
