# Unusable config.json files: exit 2 with one line that names the file, the field and the fix.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
file(READ ${DATA}/llama3-8b/config.json good)

# Not JSON at all (truncated).
write_config(truncated "{\n  \"model_type\": \"llama\",\n  \"hidden_size\": 4096,\n")
megadsl(check ${WORK}/truncated)
expect_exit(2)
expect_err("^megadsl: ${WORK}/truncated/config\\.json: not valid JSON: .*line 4")

# A number written as a string.
string(REPLACE "\"num_attention_heads\": 32" "\"num_attention_heads\": \"32\"" text "${good}")
write_config(string_heads "${text}")
megadsl(check ${WORK}/string_heads --tp 8)
expect_exit(2)
expect_err("^megadsl: ${WORK}/string_heads/config\\.json: num_attention_heads: expected an integer, got \"32\" \\(a string\\); write it as a plain JSON integer\n$")

# A required size missing.
string(REPLACE "\"hidden_size\": 4096," "" text "${good}")
write_config(no_hidden "${text}")
megadsl(describe ${WORK}/no_hidden/config.json)
expect_exit(2)
expect_err("^megadsl: ${WORK}/no_hidden/config\\.json: hidden_size: missing \\(the model width\\)")

# Not a family megadsl composes.
string(REPLACE "\"model_type\": \"llama\"" "\"model_type\": \"gpt2\"" text "${good}")
write_config(gpt2 "${text}")
megadsl(check ${WORK}/gpt2)
expect_exit(2)
expect_err("model_type: \"gpt2\" is not a family megadsl composes; megadsl reads model_type \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma\", \"gemma2\", \"olmo2\", \"phi3\", \"starcoder2\", \"gpt_neox\", \"mixtral\", \"qwen2_moe\", \"qwen3_moe\", \"seed_oss\", \"smollm3\", \"olmoe\", \"glm4_moe\", \"deepseek_v3\", \"gemma3_text\", \"olmo3\", \"exaone4\", \"ernie4_5\", \"ernie4_5_moe\", \"glm4\", \"kimi_k2\", \"hunyuan_v1_dense\", \"granite\", \"cohere2\", \"hunyuan_v1_moe\", \"cohere\", \"apertus\", \"gpt_oss\", \"llama4_text\", \"qwen3_next\", \"qwen3_5_text\" or \"qwen3_5_moe_text\"")

# A rope scaling megadsl does not implement.
string(REPLACE "\"rope_scaling\": null" "\"rope_scaling\": {\"rope_type\": \"longrope\", \"factor\": 4.0}" text "${good}")
write_config(longrope "${text}")
megadsl(check ${WORK}/longrope)
expect_exit(2)
expect_err("rope_scaling\\.rope_type: \"longrope\" is not supported; megadsl implements rope scaling \"linear\", \"dynamic\", \"llama3\" and \"yarn\"")

# llama3 rope scaling without one of its parameters.
string(REPLACE "\"rope_scaling\": null" "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0}" text "${good}")
write_config(llama3_rope "${text}")
megadsl(check ${WORK}/llama3_rope)
expect_exit(2)
expect_err("rope_scaling\\.original_max_position_embeddings: missing \\(needed by rope type \"llama3\"\\)")

# The top level is not an object.
write_config(array "[1, 2, 3]")
megadsl(check ${WORK}/array)
expect_exit(2)
expect_err("config\\.json: expected a JSON object, got \\[1,2,3\\] \\(an array\\)")

# A directory without config.json, and a name that is neither a preset nor a path.
file(MAKE_DIRECTORY ${WORK}/empty)
megadsl(check ${WORK}/empty)
expect_exit(2)
expect_err("^megadsl: ${WORK}/empty has no config\\.json; pass an HF model directory")
megadsl(check llama3-8)
expect_exit(2)
expect_err("^megadsl: 'llama3-8' is neither a preset nor an existing file or directory; did you mean llama3-8b\\?")
