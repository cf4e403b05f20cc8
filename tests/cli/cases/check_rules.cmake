# The other rules, each named in its line, through the command line.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(check llama3-8b --sp)
expect_exit(1)
expect_err("^sp_needs_tp: sequence parallelism needs tp > 1 \\(got tp = 1\\); set tp >= 2 or sp = false\n$")

megadsl(check llama3-8b --vpp 2)
expect_exit(1)
expect_err("^vpp_needs_pp: vpp = 2 virtual chunks need pp > 1 \\(got pp = 1\\); set pp >= 2 or vpp = 1\n")

megadsl(check llama3-8b --first-stage-layers 4)
expect_exit(1)
expect_err("(^|\n)stage_counts_need_pp: ")

megadsl(check llama3-8b --tp 8 --pp 2 --world 24)
expect_exit(1)
expect_err("^world_fits_layout: world size 24 is not divisible by tp \\* pp \\* cp = 16; ")

megadsl(check llama3-8b --tp 8 --world 32 --global-batch 30 --micro-batch 2)
expect_exit(1)
expect_err("^global_batch_divisible: global batch 30 is not divisible by micro batch 2 \\* dp 4 = 8; use a global batch of 24 or 32\n$")

megadsl(check llama3-8b --pp 4 --vpp 2 --microbatches 6)
expect_exit(1)
expect_err("^interleaved_microbatches: number of microbatches 6 is not divisible by pp = 4 with the interleaved schedule; use 4 or 8 microbatches\n$")

megadsl(check llama3-8b --tp 0)
expect_exit(1)
expect_err("^positive_sizes: tp = 0 must be positive\n$")

# Qwen2.5-0.5B: 14 query heads, 2 kv heads.
megadsl(check qwen2.5-0.5b --tp 4)
expect_exit(1)
expect_err("^heads_divisible_by_tp: num_heads = 14 is not divisible by tp = 4; valid tp: 1, 2, 7, 14\n")

# Context parallelism: each cp rank takes an equal share of a tp rank's query heads.
megadsl(check llama3-8b --tp 8 --cp 8)
expect_exit(1)
expect_err("^cp_splits_heads: a tp rank's 4 query heads in 1 kv group\\(s\\) [^\n]*valid cp: 1, 2, 4; or cp_comm ring[^\n]*\n")
# The ring keeps every head on every cp rank; the blocks that cannot ring say so.
megadsl(check llama3-8b --tp 8 --cp 8 --cp-comm ring)
expect_exit(0)
megadsl(check qwen3-next-80b-a3b --cp 2 --cp-comm p2p)
expect_exit(1)
expect_err("cp_ring_supported: the gated DeltaNet [^\n]*use cp_comm a2a")
megadsl(check deepseek-v3 --cp 2 --cp-comm p2p)
expect_exit(0)
# Hierarchical cp: the head rule over the all-to-all groups only; their size must fit.
megadsl(check llama3-8b --tp 8 --cp 8 --cp-comm a2a+p2p --cp-a2a 4)
expect_exit(0)
megadsl(check llama3-8b --cp 8 --cp-comm a2a+ring --cp-a2a 3)
expect_exit(1)
expect_err("^cp_a2a_fits: cp_comm a2a\\+ring with cp = 8 and cp_a2a = 3: [^\n]*valid cp_a2a: 2, 4; [^\n]*\n")
megadsl(check llama3-8b --cp 2 --cp-comm ulysses)
expect_exit(2)
expect_err("--cp-comm takes a2a \\(Ulysses\\), ring \\(p2p\\) or a2a\\+ring [^\n]*got 'ulysses'")
megadsl(check llama3-70b --tp 8 --cp 4 --sp --rmpad)
expect_exit(0)
