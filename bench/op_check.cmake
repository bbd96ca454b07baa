# tessera_op_check: runs an op on a device under test and on the CPU backend and compares,
# with guard zones around every buffer (op_check.h). bench_gpu and tests/bench use it; it
# needs no GPU.
add_library(tessera_op_check STATIC ${CMAKE_CURRENT_LIST_DIR}/op_check.cc)
target_link_libraries(tessera_op_check PUBLIC tessera_device tessera_includes)
tessera_warnings(tessera_op_check)
