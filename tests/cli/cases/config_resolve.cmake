# --config checks a checkpoint's config.json against a declared (static) preset, field by field.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)

# The published config of the same model: resolves, then the layout is checked as usual.
megadsl(check llama3-8b --config ${DATA}/llama3-8b --tp 8)
expect_exit(0)
expect_out("^ok: llama3-8b at tp=8 ")
megadsl(check llama3-8b --config ${DATA}/llama3-8b --tp 3)
expect_exit(1)
expect_err("(^|\n)heads_divisible_by_tp: ")

# A different model: every disagreeing field on its own line, exit 1.
megadsl(check llama3-8b --config ${DATA}/qwen2.5-0.5b)
expect_exit(1)
expect_err("^megadsl: preset llama3-8b does not match ${DATA}/qwen2\\.5-0\\.5b/config\\.json:\n")
expect_err("\n  hidden \\(hidden_size\\): declared 4096, config\\.json has 896\n")
expect_err("\n  kv_heads \\(num_key_value_heads\\): declared 8, config\\.json has 2\n")
expect_err("\n  rope_theta \\(rope_theta\\): declared 500000\\.0, config\\.json has 1000000\\.0\n")
expect_err("\n  tie_embeddings \\(tie_word_embeddings\\): declared false, config\\.json has true\n")
expect_err("\nfix: use the preset of this checkpoint")

# One field off (a pruned checkpoint): exactly that field.
file(READ ${DATA}/llama3-8b/config.json good)
string(REPLACE "\"num_hidden_layers\": 32" "\"num_hidden_layers\": 16" text "${good}")
write_config(pruned "${text}")
megadsl(describe llama3-8b --config ${WORK}/pruned)
expect_exit(1)
expect_err("^megadsl: preset llama3-8b does not match ${WORK}/pruned/config\\.json:\n  layers \\(num_hidden_layers\\): declared 32, config\\.json has 16\nfix: ")

# An explicit head_dim equal to hidden / heads is the same model as head_dim 0.
string(REPLACE "\"hidden_size\": 4096," "\"hidden_size\": 4096,\n  \"head_dim\": 128," text "${good}")
write_config(head_dim "${text}")
megadsl(check llama3-8b --config ${WORK}/head_dim)
expect_exit(0)
string(REPLACE "\"hidden_size\": 4096," "\"hidden_size\": 4096,\n  \"head_dim\": 64," text "${good}")
write_config(head_dim_64 "${text}")
megadsl(check llama3-8b --config ${WORK}/head_dim_64)
expect_exit(1)
expect_err("head_dim \\(head_dim\\): declared 0 \\(= hidden / heads = 128\\), config\\.json has 64")

# --config belongs to a preset.
megadsl(check ${DATA}/llama3-8b --config ${DATA}/llama3-8b)
expect_exit(2)
