#include "base/backend_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "base/escape.h"

// Both come from cmake/TesseraModules.cmake, for this file only.
#ifndef TESSERA_MODULE_BUILD_DIR
#error "TESSERA_MODULE_BUILD_DIR (the build tree's module directory) must be defined"
#endif
#ifndef TESSERA_MODULE_DIR_FROM_BIN
#error "TESSERA_MODULE_DIR_FROM_BIN (the installed module directory, relative to bin) must be defined"
#endif

namespace tessera {
namespace {

constexpr size_t kMaxLinkerMessage = 512;
// A directory or a module's path as messages show it: it may come from TESSERA_MODULE_DIR.
constexpr size_t kShownPathChars = 256;

// dlerror()'s text, escaped and bounded: it names the module's path, and a chain of missing
// libraries or a long symbol can run on.
std::string LinkerMessage() {
  const char* said = dlerror();
  return said != nullptr ? EscapeUntrusted(said, kMaxLinkerMessage) : "no reason given by the dynamic linker";
}

std::filesystem::path ExecutableDirectory() {
  std::error_code error;
  const std::filesystem::path executable = std::filesystem::read_symlink("/proc/self/exe", error);
  return error ? std::filesystem::path() : executable.parent_path();
}

}  // namespace

std::vector<std::string> BackendModuleDirectories() {
  if (const char* chosen = std::getenv("TESSERA_MODULE_DIR"); chosen != nullptr && *chosen != '\0') {
    return {chosen};
  }
  std::vector<std::string> directories;
  auto add = [&](const std::filesystem::path& directory) {
    const std::string text = directory.lexically_normal().string();
    for (const std::string& known : directories) {
      if (known == text) return;
    }
    directories.push_back(text);
  };
  if (const std::filesystem::path executable = ExecutableDirectory(); !executable.empty()) {
    add(executable);
    add(executable / TESSERA_MODULE_DIR_FROM_BIN);
  }
  add(TESSERA_MODULE_BUILD_DIR);
  return directories;
}

Result<void*> LoadBackendModule(std::string_view file_name, const char* entry, ModuleSymbols symbols) {
  const std::vector<std::string> directories = BackendModuleDirectories();
  std::string looked_in;
  for (const std::string& directory : directories) {
    const std::filesystem::path path = std::filesystem::path(directory) / file_name;
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) {
      looked_in += (looked_in.empty() ? "" : ", ") + EscapeUntrusted(directory, kShownPathChars);
      continue;
    }
    void* module =
        dlopen(path.c_str(), RTLD_NOW | (symbols == ModuleSymbols::kGlobal ? RTLD_GLOBAL : RTLD_LOCAL));
    if (module == nullptr) return UnavailableError(LinkerMessage());
    dlerror();
    void* function = dlsym(module, entry);
    if (function == nullptr) {
      return UnavailableError(EscapeUntrusted(path.string(), kShownPathChars) + " has no entry point " + entry +
                              " (a module from another build?): " +
                              LinkerMessage());
    }
    return function;
  }
  return NotFoundError(std::string(file_name) + " is in none of " + looked_in +
                       (std::getenv("TESSERA_MODULE_DIR") != nullptr ? " (TESSERA_MODULE_DIR)"
                                                                     : " (set TESSERA_MODULE_DIR to choose)"));
}

Status LoadSystemLibrary(const char* soname) {
  if (dlopen(soname, RTLD_NOW | RTLD_LOCAL) == nullptr) return UnavailableError(LinkerMessage());
  return Status::Ok();
}

}  // namespace tessera
