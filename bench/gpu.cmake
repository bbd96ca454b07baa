# bench_gpu: the CUDA backend on a real GPU (GEMM through the Device interface against raw
# cuBLAS, every op against the CPU backend, SimpleCNN training beside the CPU). Built only
# with CUDA; scripts/gpu-check.sh builds and runs it.
if(TESSERA_HAVE_CUDA)
  add_executable(bench_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_link_libraries(bench_gpu PRIVATE tessera_core tessera_device CUDA::cudart CUDA::cublas)
  tessera_warnings(bench_gpu)
endif()
