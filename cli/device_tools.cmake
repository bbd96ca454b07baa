# The device operator tools behind `tessera devices` and `tessera align` (cli/devices_command.h).
# Included from cli/CMakeLists.txt and bench/device.cmake; defined once.
if(NOT TARGET tessera_device_tools)
  add_library(tessera_device_tools ${CMAKE_CURRENT_LIST_DIR}/devices_command.cc)
  target_link_libraries(tessera_device_tools PUBLIC tessera_core tessera_device tessera_wire PRIVATE tessera_job_spec)
  tessera_warnings(tessera_device_tools)
endif()
