# A valid layout: exit 0, one line on stdout, nothing on stderr.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(check llama3-8b --tp 8 --pp 4 --sp)
expect_exit(0)
expect_out("^ok: llama3-8b at tp=8 pp=4 vpp=1 sp=on rmpad=off is valid\n$")
expect_no_err(".")

megadsl(check llama3-8b --tp=8 --pp=2 --vpp=2 --rmpad --world 64 --global-batch 256 --micro-batch 2 --microbatches 8)
expect_exit(0)
expect_out("^ok: llama3-8b at tp=8 pp=2 vpp=2 sp=off rmpad=on world=64 global_batch=256 micro_batch=2 microbatches=8 is valid\n$")

megadsl(check qwen2.5-0.5b --tp 2 --critic --no-value-bias)
expect_exit(0)
expect_out("critic\\(no value bias\\) is valid")
