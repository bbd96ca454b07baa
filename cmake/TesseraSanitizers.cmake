# Sanitizer and fuzzing builds. Each goes into a build directory of its own
# (scripts/sanitize.sh: build-asan/, build-tsan/; scripts/fuzz.sh: build-fuzz/), so that the
# normal build (scripts/build.sh, build/) is never instrumented.
#
#   TESSERA_SANITIZE  "" (none), "address,undefined" or "thread": instruments every target this
#                     project compiles, generated protobuf code included. Third-party libraries
#                     (gRPC, protobuf, OpenBLAS, SQLite) stay as Debian ships them, uninstrumented.
#   TESSERA_FUZZ      builds the libFuzzer targets of tests/fuzz/ and their regression tests.
#                     Needs clang (libFuzzer ships with it); implies "address,undefined" and adds
#                     coverage instrumentation (-fsanitize=fuzzer-no-link) to every target.
set(TESSERA_SANITIZE "" CACHE STRING "Sanitizers for every Tessera target: empty, address,undefined or thread")
option(TESSERA_FUZZ "Build the libFuzzer targets in tests/fuzz (clang only)" OFF)

if(TESSERA_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang" OR NOT CMAKE_C_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "TESSERA_FUZZ=ON needs clang, which ships libFuzzer; the compilers are "
                        "${CMAKE_C_COMPILER_ID} (${CMAKE_C_COMPILER}) and ${CMAKE_CXX_COMPILER_ID} "
                        "(${CMAKE_CXX_COMPILER}). Configure a fresh build directory with "
                        "-DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++, or use scripts/fuzz.sh.")
  endif()
  if(TESSERA_SANITIZE STREQUAL "")
    set(TESSERA_SANITIZE "address,undefined" CACHE STRING "" FORCE)
  elseif(TESSERA_SANITIZE MATCHES "thread")
    message(FATAL_ERROR "TESSERA_FUZZ=ON runs under address,undefined; got TESSERA_SANITIZE=${TESSERA_SANITIZE}")
  endif()
  add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=fuzzer-no-link>)
endif()

if(TESSERA_SANITIZE)
  if(NOT TESSERA_SANITIZE MATCHES "^(address,undefined|address|undefined|thread)$")
    message(FATAL_ERROR "TESSERA_SANITIZE must be address,undefined, address, undefined or thread; "
                        "got '${TESSERA_SANITIZE}'")
  endif()
  # Undefined behaviour stops the program at the first finding, as a memory error does.
  # Host code only: nvcc (CUDA modules) takes no sanitizer flags.
  add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${TESSERA_SANITIZE};-fno-omit-frame-pointer>")
  add_link_options(-fsanitize=${TESSERA_SANITIZE})
  if(TESSERA_SANITIZE MATCHES "undefined")
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-fno-sanitize-recover=undefined>)
  endif()
  message(STATUS "Tessera sanitizers: ${TESSERA_SANITIZE}")
endif()
