# Helpers for tests/cli/cases/*.cmake. Each case runs as
#   cmake -DMEGADSL=<the built tool> -DDATA=<tests/data> -DWORK=<scratch dir> -P <case>.cmake
# and fails (FATAL_ERROR) at the first expectation that does not hold.
#
#   megadsl(<args>...)          run the tool: megadsl_rc, megadsl_out (stdout), megadsl_err (stderr)
#   expect_exit(<code>)         megadsl_rc is <code> (a crash is not a number, so it never matches)
#   expect_out(<regex>)         stdout matches; expect_err(<regex>): stderr matches
#   expect_no_out(<regex>)      stdout does not match; expect_no_err(<regex>) likewise
#   expect_equal(<a> <b> <what>)  two variables' values are equal
#   write_config(<dir> <json>)  writes <WORK>/<dir>/config.json
# run_*/convert_* cases (the runtime is built) also get FIXTURES (tests/fixtures) and COMPARE (the
# compare_tensors helper, tests/cli/compare_tensors.cpp):
#   compare_tensors(<args>...)  run the helper: compare_rc, compare_out (stdout and stderr)
#   expect_same(<a> <b> [--tol T] [--names n1,n2])  the helper's `compare` says equal (exit 0)
#   expect_differ(<a> <b> ...)  it says they differ (exit 1): the comparison can fail
foreach(var MEGADSL DATA WORK)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "cli_lib.cmake: run with -D${var}=...")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(megadsl)
  # A hang is a failure too: the timeout's message is not an exit code.
  execute_process(COMMAND ${MEGADSL} ${ARGN} TIMEOUT 600
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REPLACE ";" " " cmd "${ARGN}")
  message(STATUS "$ megadsl ${cmd}\n${out}${err}[exit ${rc}]")
  set(megadsl_cmd "megadsl ${cmd}" PARENT_SCOPE)
  set(megadsl_rc "${rc}" PARENT_SCOPE)
  set(megadsl_out "${out}" PARENT_SCOPE)
  set(megadsl_err "${err}" PARENT_SCOPE)
endfunction()

function(expect_exit code)
  if(NOT "${megadsl_rc}" STREQUAL "${code}")
    message(FATAL_ERROR "${megadsl_cmd}: exit status ${megadsl_rc}, expected ${code}")
  endif()
endfunction()

function(expect_out pattern)
  if(NOT megadsl_out MATCHES "${pattern}")
    message(FATAL_ERROR "${megadsl_cmd}: stdout does not match\n  ${pattern}\nstdout was:\n${megadsl_out}")
  endif()
endfunction()

function(expect_err pattern)
  if(NOT megadsl_err MATCHES "${pattern}")
    message(FATAL_ERROR "${megadsl_cmd}: stderr does not match\n  ${pattern}\nstderr was:\n${megadsl_err}")
  endif()
endfunction()

function(expect_no_out pattern)
  if(megadsl_out MATCHES "${pattern}")
    message(FATAL_ERROR "${megadsl_cmd}: stdout must not match\n  ${pattern}\nstdout was:\n${megadsl_out}")
  endif()
endfunction()

function(expect_no_err pattern)
  if(megadsl_err MATCHES "${pattern}")
    message(FATAL_ERROR "${megadsl_cmd}: stderr must not match\n  ${pattern}\nstderr was:\n${megadsl_err}")
  endif()
endfunction()

function(expect_equal a b what)
  if(NOT "${${a}}" STREQUAL "${${b}}")
    message(FATAL_ERROR "${what} differ:\n--- ${a}:\n${${a}}\n--- ${b}:\n${${b}}")
  endif()
endfunction()

function(write_config dir json)
  file(MAKE_DIRECTORY ${WORK}/${dir})
  file(WRITE ${WORK}/${dir}/config.json "${json}")
endfunction()

function(compare_tensors)
  execute_process(COMMAND ${COMPARE} ${ARGN} TIMEOUT 300 RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  string(REPLACE ";" " " cmd "${ARGN}")
  message(STATUS "$ compare_tensors ${cmd}\n${out}[exit ${rc}]")
  set(compare_rc "${rc}" PARENT_SCOPE)
  set(compare_out "${out}" PARENT_SCOPE)
endfunction()

function(expect_same a b)
  compare_tensors(compare ${a} ${b} ${ARGN})
  if(NOT "${compare_rc}" STREQUAL "0")
    message(FATAL_ERROR "${a} and ${b} differ:\n${compare_out}")
  endif()
endfunction()

function(expect_differ a b)
  compare_tensors(compare ${a} ${b} ${ARGN})
  if(NOT "${compare_rc}" STREQUAL "1")
    message(FATAL_ERROR "${a} and ${b} should differ (exit 1), got exit ${compare_rc}:\n${compare_out}")
  endif()
endfunction()
