# Warnings for Tessera's own targets (not for generated protobuf code).
function(tessera_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter)
endfunction()
