// Loading a backend that lives in a shared module of its own.
//
// Backends whose libraries are large (CUDA with cuBLAS, NCCL, Gloo with ibverbs, XRT, Open
// MPI) are built as shared modules (libtessera_cuda.so, libtessera_nccl.so,
// libtessera_gloo.so, libtessera_xrt.so, libtessera_mpi.so) that their always-built factory
// loads on first use, so a process that never asks for them never maps those libraries: a CPU
// worker maps neither cuBLAS (about 150 MB resident once loaded) nor NCCL nor XRT nor,
// outside a cohort, Gloo or MPI.
//
// What a module is. A shared object built from the same tree as the executable that loads it.
// It leaves Tessera's own symbols (Device, MemoryPool, Status, Communicator, ...) undefined
// and they are resolved against the executable, which exports them (every executable that
// links a library loading modules is linked with --export-dynamic: tessera_loads_modules() in
// cmake/TesseraModules.cmake), so the process holds one copy of every class, registry and
// typeinfo. Its one entry point is an extern "C" function, named with its ABI version in the
// backend's module.h, returning a table of function pointers that begins with that version. A
// module from another build of Tessera is not supported (the version guards only the table).
//
// Where a module is looked for; the first directory that holds the file is used:
//   1. $TESSERA_MODULE_DIR when it is set (and then only there);
//   2. the executable's own directory;
//   3. <the executable's directory>/../lib/tessera (the install layout, and the GPU check's
//      pack; the exact relative path comes from the install directories configured);
//   4. the build tree's module directory (<build>/lib/tessera), for binaries run where they
//      were built.
//
// Thread safety: every function may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace tessera {

// The directories searched for a module, in order (see above).
std::vector<std::string> BackendModuleDirectories();

// Loads the module `file_name` ("libtessera_cuda.so") from the first of
// BackendModuleDirectories() that holds it and returns the address of its function `entry`.
// Every symbol is bound now (RTLD_NOW), so a module whose libraries are missing or which does
// not fit this executable fails here, with the dynamic linker's reason, not in mid-call.
// Modules are never unloaded: their code backs objects handed out (devices, communicators).
// Errors: NotFound naming every directory looked in; Unavailable with the dynamic linker's
// message (at most 512 bytes: a missing library, an undefined symbol) when the file exists
// but cannot be loaded, or when it lacks `entry`.
// kGlobal loads the module and the libraries it needs with RTLD_GLOBAL, for a library whose
// own plugins resolve its symbols at run time (Open MPI's components need libmpi's).
enum class ModuleSymbols { kLocal, kGlobal };
Result<void*> LoadBackendModule(std::string_view file_name, const char* entry,
                                ModuleSymbols symbols = ModuleSymbols::kLocal);

// Loads a system library by its soname ("libcuda.so.1") where the dynamic linker finds it,
// and keeps it loaded. Unavailable with the dynamic linker's message (bounded as above) when
// it cannot.
Status LoadSystemLibrary(const char* soname);

// Loads module `file_name` (LoadBackendModule), calls its entry point and checks the table it
// returns: a Table (the backend's module.h) that begins with uint32_t abi_version and
// table_bytes, which must be `abi_version` and sizeof(Table). FailedPrecondition naming
// `backend` ("cannot load the gloo backend: ...", "cannot use the gloo backend: ... has ABI
// version 2, expected 1 ...") otherwise.
template <typename Table>
Result<const Table*> LoadModuleTable(std::string_view backend, const char* file_name, const char* entry,
                                     uint32_t abi_version, ModuleSymbols symbols = ModuleSymbols::kLocal) {
  auto address = LoadBackendModule(file_name, entry, symbols);
  if (!address.ok()) {
    return FailedPreconditionError("cannot load the " + std::string(backend) + " backend: " +
                                   address.status().message());
  }
  const Table* table = reinterpret_cast<const Table* (*)()>(*address)();
  if (table == nullptr || table->abi_version != abi_version || table->table_bytes != sizeof(Table)) {
    return FailedPreconditionError("cannot use the " + std::string(backend) + " backend: " + file_name +
                                   " has ABI version " +
                                   (table == nullptr ? "none" : std::to_string(table->abi_version)) +
                                   ", expected " + std::to_string(abi_version) +
                                   " (a module from another build of Tessera)");
  }
  return table;
}

}  // namespace tessera
