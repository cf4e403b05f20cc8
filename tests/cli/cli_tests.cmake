# Tests of the `megadsl` tool: every tests/cli/cases/*.cmake is one CTest test `cli.<name>`, a
# CMake script that runs the built tool and checks its exit status and output (cli_lib.cmake).
# Cases named run_* and convert_* need the LibTorch runtime (and the compare_tensors helper): they
# are registered only with MEGADSL_BUILD_RUNTIME; no_runtime_* cases only without it.
# Included by tests/cli/CMakeLists.txt.
file(GLOB megadsl_cli_cases CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cases/*.cmake)
foreach(case ${megadsl_cli_cases})
  get_filename_component(name ${case} NAME_WE)
  set(extra)
  if(name MATCHES "^(run|convert)_")
    if(NOT MEGADSL_BUILD_RUNTIME)
      continue()
    endif()
    set(extra -DCOMPARE=$<TARGET_FILE:compare_tensors>)
  elseif(name MATCHES "^no_runtime_" AND MEGADSL_BUILD_RUNTIME)
    continue()
  endif()
  add_test(NAME cli.${name}
    COMMAND ${CMAKE_COMMAND}
      -DMEGADSL=$<TARGET_FILE:megadsl_tool>
      -DDATA=${PROJECT_SOURCE_DIR}/tests/data
      -DFIXTURES=${PROJECT_SOURCE_DIR}/tests/fixtures
      -DWORK=${PROJECT_BINARY_DIR}/tests/cli/${name}
      ${extra}
      -P ${case})
endforeach()
