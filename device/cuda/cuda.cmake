# The CUDA backend, included from device/CMakeLists.txt. factory.cc is always built (without
# CUDA it says so as its viability); the device and its kernels only when TESSERA_HAVE_CUDA.
target_sources(tessera_device PRIVATE ${CMAKE_CURRENT_LIST_DIR}/factory.cc)
if(TESSERA_HAVE_CUDA)
  # The kernels are a library of their own: nvcc takes none of the C++ warning flags. C++17:
  # CMake 3.25 knows no C++20 flag for nvcc, and the headers they include need only C++17.
  add_library(tessera_cuda_kernels STATIC ${CMAKE_CURRENT_LIST_DIR}/cuda_kernels.cu)
  set_target_properties(tessera_cuda_kernels PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                                                        POSITION_INDEPENDENT_CODE ON)
  target_compile_options(tessera_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall>)
  target_link_libraries(tessera_cuda_kernels PUBLIC tessera_includes CUDA::cudart)
  target_sources(tessera_device PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_device.cc)
  target_link_libraries(tessera_device PRIVATE tessera_cuda_kernels CUDA::cudart CUDA::cublas)
endif()
