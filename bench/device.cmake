# bench_device: the CPU backend's GEMM against raw OpenBLAS, an emulated (unpaced) SimpleCNN
# training step against the CPU step, and the `tessera devices --model simplecnn` report.
include(${PROJECT_SOURCE_DIR}/cli/device_tools.cmake)
add_executable(bench_device ${CMAKE_CURRENT_LIST_DIR}/device.cc)
target_link_libraries(bench_device PRIVATE tessera_device_tools tessera_core PkgConfig::OPENBLAS)
tessera_warnings(bench_device)
