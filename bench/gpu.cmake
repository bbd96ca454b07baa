# bench_gpu: the CUDA backend on a real GPU (GEMM through the Device interface against raw
# cuBLAS, every op against the CPU backend, SimpleCNN training beside the CPU), with pass/fail
# thresholds; gpu_preflight: what a GPU machine offers (driver, runtime, devices, cuBLAS,
# NCCL) and whether one kernel, one GEMM and one NCCL allreduce run there. Built only with
# CUDA; scripts/gpu-check.sh packs and runs both.
if(TESSERA_HAVE_CUDA)
  add_executable(bench_gpu ${CMAKE_CURRENT_LIST_DIR}/gpu_bench.cc)
  target_link_libraries(bench_gpu PRIVATE tessera_op_check tessera_core tessera_device CUDA::cudart CUDA::cublas)
  tessera_warnings(bench_gpu)

  add_executable(gpu_preflight ${CMAKE_CURRENT_LIST_DIR}/gpu_preflight.cc)
  target_link_libraries(gpu_preflight PRIVATE tessera_device tessera_collectives CUDA::cudart CUDA::cublas)
  string(REPLACE ";" "," _tessera_cuda_architectures "${CMAKE_CUDA_ARCHITECTURES}")
  target_compile_definitions(gpu_preflight PRIVATE TESSERA_CUDA_ARCHITECTURES="${_tessera_cuda_architectures}")
  tessera_warnings(gpu_preflight)
endif()
