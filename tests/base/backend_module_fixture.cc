// A stand-in backend module for backend_module_test.cc: its entry builds a Status with a
// function it leaves for the loading executable to provide, as the real modules do with
// Device, MemoryPool and Communicator. Built a second time needing a symbol that nothing
// defines, which the loader must refuse at load time.
#include "base/status.h"

#ifdef TESSERA_FIXTURE_NEEDS_A_MISSING_SYMBOL
extern "C" int tessera_fixture_symbol_nobody_defines();
#endif

extern "C" __attribute__((visibility("default"))) tessera::Status* tessera_fixture_module_v1() {
  static tessera::Status made = tessera::InvalidArgumentError("made in the fixture module");
#ifdef TESSERA_FIXTURE_NEEDS_A_MISSING_SYMBOL
  (void)tessera_fixture_symbol_nobody_defines();
#endif
  return &made;
}
