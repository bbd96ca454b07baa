# Backends built as shared modules that their always-built factories load on first use
# (base/backend_module.h): libtessera_cuda.so (the CUDA device, the CUDA runtime, cuBLAS),
# libtessera_nccl.so (NCCL), libtessera_gloo.so (Gloo), libtessera_mpi.so (Open MPI) and
# libtessera_xrt.so (the XRT device, libxrt_coreutil). A process that never asks for them
# never maps those libraries.
#
# A module leaves Tessera's own symbols undefined; the executable that loads it provides them.
# tessera_loads_modules() makes every executable that links a loading library export its
# symbols (--export-dynamic) and builds the modules whenever that library is built;
# tessera_add_module_symbol_checks() adds a ctest per module proving that every executable
# which may load it exports everything it needs.
include(GNUInstallDirs)

# Where modules are written in the build tree and installed; base/backend_module.cc searches
# both (the installed one relative to the executable).
set(TESSERA_MODULE_BUILD_DIR ${PROJECT_BINARY_DIR}/lib/tessera)
set(TESSERA_MODULE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/tessera)
file(RELATIVE_PATH TESSERA_MODULE_DIR_FROM_BIN ${CMAKE_INSTALL_FULL_BINDIR}
     ${CMAKE_INSTALL_FULL_LIBDIR}/tessera)

# Built and installed, the RUNPATH is the directories of the external shared libraries
# linked (Tessera's own libraries are static), so CMake need not pad the build tree's RUNPATH
# for an install-time rewrite: a padded one ends in an empty entry, which the dynamic linker
# reads as the current directory.
function(_tessera_same_runpath_built_and_installed target)
  set_target_properties(${target} PROPERTIES BUILD_WITH_INSTALL_RPATH ON INSTALL_RPATH_USE_LINK_PATH ON)
endfunction()

# tessera_install_program(TARGET): an executable installed into <prefix>/bin, from where the
# modules are found in <prefix>/<libdir>/tessera.
function(tessera_install_program target)
  _tessera_same_runpath_built_and_installed(${target})
  install(TARGETS ${target} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endfunction()

# tessera_backend_module(TARGET LOADED_BY SIGNATURE SOURCES ... [LIBS ...] [INCLUDES ...]):
# a module lib<TARGET>.so built from SOURCES and linked with LIBS (its heavy dependencies;
# never Tessera's own libraries). LOADED_BY is the start of the demangled signature of a
# function of the factory that loads it ("tessera::CudaViability("): an executable holding
# that function may load the module, and the symbol check holds it to that.
function(tessera_backend_module target)
  cmake_parse_arguments(M "" "LOADED_BY" "SOURCES;LIBS;INCLUDES" ${ARGN})
  add_library(${target} MODULE ${M_SOURCES})
  target_link_libraries(${target} PRIVATE tessera_includes ${M_LIBS})
  if(M_INCLUDES)
    target_include_directories(${target} PRIVATE ${M_INCLUDES})
  endif()
  set_target_properties(${target} PROPERTIES
    LIBRARY_OUTPUT_DIRECTORY ${TESSERA_MODULE_BUILD_DIR}
    TESSERA_LOADED_BY "${M_LOADED_BY}")
  _tessera_same_runpath_built_and_installed(${target})
  tessera_warnings(${target})
  install(TARGETS ${target} LIBRARY DESTINATION ${TESSERA_MODULE_INSTALL_DIR})
  set_property(GLOBAL APPEND PROPERTY TESSERA_BACKEND_MODULES ${target})
endfunction()

# tessera_loads_modules(LIBRARY MODULE...): LIBRARY's factories load MODULEs at run time.
# Building LIBRARY builds them, and every executable linking LIBRARY (directly or through
# another library) exports its symbols for them.
function(tessera_loads_modules library)
  add_dependencies(${library} ${ARGN})
  target_link_options(${library} INTERFACE
    "$<$<STREQUAL:$<TARGET_PROPERTY:TYPE>,EXECUTABLE>:LINKER:--export-dynamic>")
endfunction()

# Every executable target defined in `directory` and below.
function(_tessera_executables directory out)
  set(found)
  get_property(targets DIRECTORY ${directory} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(target IN LISTS targets)
    get_target_property(type ${target} TYPE)
    if(type STREQUAL "EXECUTABLE")
      list(APPEND found ${target})
    endif()
  endforeach()
  get_property(subdirectories DIRECTORY ${directory} PROPERTY SUBDIRECTORIES)
  foreach(subdirectory IN LISTS subdirectories)
    _tessera_executables(${subdirectory} more)
    list(APPEND found ${more})
  endforeach()
  set(${out} ${found} PARENT_SCOPE)
endfunction()

# One ctest per module, BackendModuleSymbols.<module>: every executable of the project that
# holds the module's loader exports every symbol the module needs from it (scripts/
# check-module-symbols.sh). Call once, after every executable is defined.
function(tessera_add_module_symbol_checks)
  get_property(modules GLOBAL PROPERTY TESSERA_BACKEND_MODULES)
  if(NOT modules)
    return()
  endif()
  _tessera_executables(${PROJECT_SOURCE_DIR} executables)
  set(files)
  foreach(executable IN LISTS executables)
    list(APPEND files $<TARGET_FILE:${executable}>)
  endforeach()
  foreach(module IN LISTS modules)
    get_target_property(loaded_by ${module} TESSERA_LOADED_BY)
    add_test(NAME BackendModuleSymbols.${module}
             COMMAND ${PROJECT_SOURCE_DIR}/scripts/check-module-symbols.sh $<TARGET_FILE:${module}> "${loaded_by}"
                     ${files})
  endforeach()
endfunction()
