# CTest python.pip_install: `pip install --no-build-isolation --no-deps --target TARGET SOURCE` with
# MEGADSL_BUILD_DIR=BUILD (the module is already built there, so pip only copies it), then the
# installed copy, and only it, is imported and asked to check llama3-8b at tp 3.
#   cmake -DPYTHON=... -DSOURCE=<repo> -DBUILD=<cmake build dir> -DTARGET=<dir> -P pip_install_test.cmake
file(REMOVE_RECURSE ${TARGET})
set(ENV{MEGADSL_BUILD_DIR} ${BUILD})
execute_process(
  COMMAND ${PYTHON} -m pip install --no-build-isolation --no-deps --no-input --disable-pip-version-check
          --target ${TARGET} ${SOURCE}
  RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "pip install failed (exit ${rc})")
endif()

unset(ENV{PYTHONPATH})
set(script [=[
import sys
sys.path.insert(0, sys.argv[1])
import megadsl
assert megadsl.__file__.startswith(sys.argv[1]), megadsl.__file__
ok, message = megadsl.check("llama3-8b", tp=3)
print(message)
assert not ok, "llama3-8b at tp 3 passed the check"
assert "heads_divisible_by_tp" in message, message
ok, message = megadsl.check("llama3-8b", tp=8, pp=4, sp=True)
assert ok, message
print("installed megadsl from", megadsl.__file__, "works")
]=])
execute_process(COMMAND ${PYTHON} -c "${script}" ${TARGET} WORKING_DIRECTORY ${TARGET} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "the installed megadsl failed (exit ${rc})")
endif()
