# llama3-8b at tp 3: heads, kv heads and ffn all refuse it, each on its own line with the valid tp.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(check llama3-8b --tp 3)
expect_exit(1)
expect_err("(^|\n)heads_divisible_by_tp: num_heads = 32 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32\n")
expect_err("(^|\n)kv_heads_fit_tp: num_key_value_heads = 8 is neither a multiple nor a divisor of tp = 3; valid tp: 1, 2, 4, 8, 16, 32\n")
expect_err("(^|\n)ffn_divisible_by_tp: ffn = 14336 is not divisible by tp = 3; valid tp: 1, 2, 4, 8, 16, 32\n")
expect_no_out("ok:")
