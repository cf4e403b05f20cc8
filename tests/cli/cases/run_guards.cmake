# Issue 23's hostile cases for `megadsl run` and `plan`: nothing silently wrong, nothing of the
# user's overwritten, every refusal one line that names the file, the problem and the fix.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/llama-gqa)
set(T ${FIXTURES}/qwen2-tied-bias)
set(REF ${T}/reference.safetensors:left.)
compare_tensors(extract ${T}/reference.safetensors ${WORK}/left.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)

# 1. tie_word_embeddings with an lm_head.weight that differs from the embedding: refused, naming
# both tensors (transformers would use the stored head; a tied model the embedding). Reported
# from inside the load: the progress line must not say "done" first (item 15).
file(MAKE_DIRECTORY ${WORK}/untied)
file(COPY ${T}/config.json DESTINATION ${WORK}/untied)
compare_tensors(extract ${T}/model.safetensors ${WORK}/untied/model.safetensors --all
                model.embed_tokens.weight:lm_head.weight:2)
megadsl(run ${WORK}/untied --tp 2 --ranks 2 --input ${WORK}/left.safetensors --output ${WORK}/out.safetensors)
expect_exit(1)
expect_err("megadsl: ${WORK}/untied: tie_word_embeddings is true in ${WORK}/untied/config\\.json, but model\\.safetensors holds a lm_head\\.weight \\[[0-9]+, 64\\] that differs from model\\.embed_tokens\\.weight [^\n]*set tie_word_embeddings to false")
expect_no_err("done")
if(EXISTS ${WORK}/out.safetensors)
  message(FATAL_ERROR "a refused run wrote ${WORK}/out.safetensors")
endif()
# A stored copy equal to the embedding is the tie itself: accepted, the reference's numbers.
compare_tensors(extract ${T}/model.safetensors ${WORK}/untied/model.safetensors --all
                model.embed_tokens.weight:lm_head.weight)
megadsl(run ${WORK}/untied --tp 2 --ranks 2 --input ${WORK}/left.safetensors --output ${WORK}/out.safetensors)
expect_exit(0)
expect_same(${WORK}/out.safetensors ${REF} --names log_probs,entropy --tol 1e-4)

# 2. run never writes over what it reads: the input, or any file of the model directory (by path,
# through a symbolic link, or by inode).
file(COPY ${F}/ DESTINATION ${WORK}/model)
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 2, 3]]}")
megadsl(run ${WORK}/model --input ${WORK}/in.json --output ${WORK}/in.json)
expect_exit(2)
expect_err("^megadsl run: --output ${WORK}/in\\.json is the input file ${WORK}/in\\.json; writing it would replace the batch: choose another output file\n$")
megadsl(run ${WORK}/model --input ${WORK}/in.json --output ${WORK}/model/model.safetensors)
expect_exit(2)
expect_err("^megadsl run: --output ${WORK}/model/model\\.safetensors is inside the model directory ${WORK}/model; [^\n]*write the output elsewhere\n$")
megadsl(run ${WORK}/model --input ${WORK}/in.json --output ${WORK}/model/new.json)
expect_exit(2)
expect_err("is inside the model directory")
file(CREATE_LINK ${WORK}/model ${WORK}/model-link SYMBOLIC)
megadsl(run ${WORK}/model --input ${WORK}/in.json --output ${WORK}/model-link/config.json)
expect_exit(2)
expect_err("is inside the model directory")
file(CREATE_LINK ${WORK}/model/model.safetensors ${WORK}/hard.safetensors)
megadsl(run ${WORK}/model --input ${WORK}/in.json --output ${WORK}/hard.safetensors)
expect_exit(2)
expect_err("^megadsl run: --output ${WORK}/hard\\.safetensors is ${WORK}/model/model\\.safetensors of the model \\(the same file\\)")
expect_same(${WORK}/model ${F})
file(READ ${WORK}/in.json input)
expect_equal("${input}" "{\"input_ids\": [[1, 2, 3]]}" "the input after a refused run")

# 7. A .safetensors input with a tensor megadsl does not read is refused, as the same key in JSON is.
compare_tensors(extract ${T}/reference.safetensors ${WORK}/labels.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask left.input_ids:labels)
megadsl(run ${F} --input ${WORK}/labels.safetensors --output ${WORK}/out.json)
expect_exit(1)
expect_err("^megadsl run: ${WORK}/labels\\.safetensors: unknown tensor \"labels\"; the input has input_ids and, optionally, attention_mask\n$")

# 16. Numbers written as decimals are not "a number with a fraction"; --ranks that do not fit the
# machine are blamed, not config.json.
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 1.0]]}")
megadsl(run ${F} --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("input_ids\\[0\\]\\[1\\] must be an integer, got a number written with a decimal point or an exponent \\(write integers as digits only, e\\.g\\. 1\\) 1\\.0\n$")
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 1e+20]]}")
megadsl(run ${F} --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("input_ids\\[0\\]\\[1\\] must be an integer, got a number beyond the 64-bit integer range 1e\\+20\n$")
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 18446744073709551615]]}")
megadsl(run ${F} --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("got a number beyond the 64-bit integer range 18446744073709551615\n$")
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 2]]}")
megadsl(run ${F} --ranks 100000 --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("^megadsl: 100000 ranks on this machine \\(--ranks, or LOCAL_WORLD_SIZE under a launcher\\) would each hold [^\n]*; start at most [0-9]+ ranks here\n$")

# 8. plan: a sequence whose token count the formulas cannot hold is refused, not wrapped around.
megadsl(plan llama3-8b --seq 300000000000000)
expect_exit(2)
expect_err("^megadsl plan: --seq 300000000000000 x micro batch 1 is more than 2\\^40 \\(1099511627776\\) tokens, beyond what the memory and FLOPs formulas count exactly; plan a shorter sequence\n$")
megadsl(plan llama3-8b --seq 1000000000000)
expect_exit(0)
expect_out("Megatron, causal \\(s/2h\\) +[0-9]")
