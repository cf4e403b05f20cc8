# Tests of the `megadsl` tool: every tests/cli/cases/*.cmake is one CTest test `cli.<name>`, a
# CMake script that runs the built tool and checks its exit status and output (cli_lib.cmake).
# Included by tests/cli/CMakeLists.txt.
file(GLOB megadsl_cli_cases CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/cases/*.cmake)
foreach(case ${megadsl_cli_cases})
  get_filename_component(name ${case} NAME_WE)
  add_test(NAME cli.${name}
    COMMAND ${CMAKE_COMMAND}
      -DMEGADSL=$<TARGET_FILE:megadsl_tool>
      -DDATA=${PROJECT_SOURCE_DIR}/tests/data
      -DWORK=${PROJECT_BINARY_DIR}/tests/cli/${name}
      -P ${case})
endforeach()
