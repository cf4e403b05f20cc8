# Built with -DMEGADSL_BUILD_RUNTIME=OFF: run and convert say they need the runtime (exit 2);
# the torch-free commands still work.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(run ${FIXTURES}/llama-gqa --input in.json --output out.json)
expect_exit(2)
expect_err("^megadsl run needs the LibTorch runtime; this megadsl was built with -DMEGADSL_BUILD_RUNTIME=OFF\n$")
megadsl(convert --from ${FIXTURES}/llama-gqa --to ${WORK}/x)
expect_exit(2)
expect_err("^megadsl convert needs the LibTorch runtime")
megadsl(check ${FIXTURES}/llama-gqa --tp 2)
expect_exit(0)
