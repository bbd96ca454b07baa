# The CUDA backend, included from device/CMakeLists.txt. factory.cc is always built into
# tessera_device (without CUDA it says so as its viability). With TESSERA_HAVE_CUDA the device
# and its kernels are the module libtessera_cuda.so, the only thing that links the CUDA
# runtime and cuBLAS; factory.cc loads it on first use (module.h, base/backend_module.h).
target_sources(tessera_device PRIVATE ${CMAKE_CURRENT_LIST_DIR}/factory.cc)
if(TESSERA_HAVE_CUDA)
  # The kernels are a library of their own: nvcc takes none of the C++ warning flags. C++17:
  # CMake 3.25 knows no C++20 flag for nvcc, and the headers they include need only C++17.
  add_library(tessera_cuda_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_kernels.cu)
  set_target_properties(tessera_cuda_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                        POSITION_INDEPENDENT_CODE ON)
  target_compile_options(tessera_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  target_link_libraries(tessera_cuda_kernels PUBLIC tessera_includes CUDA::cudart)
  tessera_backend_module(tessera_cuda LOADED_BY "tessera::CudaViability("
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/cuda_device.cc ${CMAKE_CURRENT_LIST_DIR}/module.cc
    LIBS tessera_cuda_kernels CUDA::cudart CUDA::cublas)
  tessera_loads_modules(tessera_device tessera_cuda)
endif()
