# tessera_job_spec: job.toml -> v1::JobSpec (see job_spec.h). Included from cli/CMakeLists.txt.
add_library(tessera_job_spec ${CMAKE_CURRENT_LIST_DIR}/job_spec.cc ${CMAKE_CURRENT_LIST_DIR}/job_spec_tables.cc
            ${CMAKE_CURRENT_LIST_DIR}/job_spec_writer.cc)
target_link_libraries(tessera_job_spec PUBLIC tessera_base tessera_proto PRIVATE tessera_wire PkgConfig::TOMLPP)
tessera_warnings(tessera_job_spec)
