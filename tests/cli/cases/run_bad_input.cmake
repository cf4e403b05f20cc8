# megadsl run refuses unusable inputs before any rank starts: one line naming the file and the
# problem, exit 1 (2 for the command line), and no output file.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/llama-gqa)

# run_fails(<exit> <stderr regex> <input text> [flags...]): writes <input text> to in.json, runs
# `megadsl run` at tp 2 on 2 ranks, and checks the exit status, the single line and that nothing
# was written.
function(run_fails code pattern text)
  file(WRITE ${WORK}/in.json "${text}")
  file(REMOVE ${WORK}/out.json)
  if(NOT DEFINED MODEL)
    set(MODEL ${F})
  endif()
  megadsl(run ${MODEL} --tp 2 --ranks 2 --input ${WORK}/in.json --output ${WORK}/out.json ${ARGN})
  expect_exit(${code})
  expect_err("^${pattern}\n$")
  if(EXISTS ${WORK}/out.json)
    message(FATAL_ERROR "${megadsl_cmd} failed but wrote out.json")
  endif()
endfunction()

set(IN "megadsl run: ${WORK}/in\\.json: ")
run_fails(1 "${IN}not valid JSON: parse error at line 2, column 1: [^\n]*" "{\"input_ids\": [[1, 2, 3], [4, 5,\n")
run_fails(1 "${IN}expected a JSON object [^\n]*, got a list" "[[1, 2, 3]]")
# Hostile JSON: 100000 levels of nesting, a number no double holds.
string(REPEAT "[" 100000 deep)
run_fails(1 "${IN}nested deeper than 64 levels of JSON, megadsl.s limit for any file it reads" "{\"input_ids\": ${deep}")
run_fails(1 "${IN}not valid JSON: number overflow parsing '1e999' \\(a number outside the range of a double or a 64-bit integer\\)"
          "{\"input_ids\": [[1e999]]}")
run_fails(1 "${IN}input_ids: missing [^\n]*" "{\"attention_mask\": [[1, 1]]}")
run_fails(1 "${IN}unknown key \"labels\"[^\n]*" "{\"input_ids\": [[1, 2]], \"labels\": [[1, 2]]}")
run_fails(1 "${IN}rows of input_ids differ in length: input_ids\\[0\\] has 3, input_ids\\[1\\] has 2; [^\n]*"
          "{\"input_ids\": [[1, 2, 3], [4, 5]]}")
run_fails(1 "${IN}input_ids\\[1\\]\\[0\\] = 300 is outside the vocabulary \\(0 to 299\\)"
          "{\"input_ids\": [[1, 2], [300, 5]]}")
run_fails(1 "${IN}input_ids\\[0\\]\\[1\\] = -1 is outside the vocabulary \\(0 to 299\\)" "{\"input_ids\": [[1, -1]]}")
run_fails(1 "${IN}input_ids\\[0\\]\\[1\\] must be an integer, got a number with a fraction 2\\.5"
          "{\"input_ids\": [[1, 2.5]]}")
run_fails(1 "${IN}attention_mask is 2 x 2 but input_ids is 2 x 3; they must have the same shape"
          "{\"input_ids\": [[1, 2, 3], [4, 5, 6]], \"attention_mask\": [[1, 1], [1, 1]]}")
run_fails(1 "${IN}attention_mask\\[0\\]\\[0\\] = 2; the mask holds 1 \\(token\\) or 0 \\(padding\\)"
          "{\"input_ids\": [[1, 2]], \"attention_mask\": [[2, 1]]}")
run_fails(1 "${IN}attention_mask row 0 has padding between its tokens \\(column 1\\); pad on the left or on the right"
          "{\"input_ids\": [[1, 2, 3]], \"attention_mask\": [[1, 0, 1]]}")
run_fails(1 "${IN}attention_mask row 1 has no tokens; every row needs one"
          "{\"input_ids\": [[1, 2], [3, 4]], \"attention_mask\": [[1, 1], [0, 0]]}")

# A .safetensors input without input_ids names what it has.
megadsl(run ${F} --input ${F}/reference.safetensors --output ${WORK}/out.json)
expect_exit(1)
expect_err("^megadsl run: ${F}/reference\\.safetensors: has no tensor input_ids \\(it has: left\\.attention_mask, ")

# Files that are not there, outputs that cannot be written.
set(GOOD "{\"input_ids\": [[1, 2, 3]]}")
run_fails(1 "megadsl run: ${WORK}/nothing\\.json: no such file" "${GOOD}" --input ${WORK}/nothing.json)
run_fails(1 "megadsl run: ${WORK}/no/out\\.json: cannot write it, directory ${WORK}/no does not exist" "${GOOD}"
          --output ${WORK}/no/out.json)
run_fails(2 "megadsl run: --output ${WORK}/out\\.txt: the output is \\.json or \\.safetensors \\(by the extension\\)"
          "${GOOD}" --output ${WORK}/out.txt)

# The model: a preset has no weights; a directory without safetensors; an invalid layout (the rule).
megadsl(run llama3-8b --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(2)
expect_err("^megadsl run: 'llama3-8b' is a preset, which has no weights; pass an HF model directory")
file(MAKE_DIRECTORY ${WORK}/no_weights)
configure_file(${F}/config.json ${WORK}/no_weights/config.json COPYONLY)
megadsl(run ${WORK}/no_weights --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("^megadsl: ${WORK}/no_weights[^\n]*\n$")
run_fails(1 "heads_divisible_by_tp: num_heads = 4 is not divisible by tp = 3; valid tp: 1, 2, 4\n.*" "${GOOD}" --tp 3)
run_fails(1 "world_fits_layout: world size 3 is not divisible by tp \\* pp \\* cp = 2[^\n]*" "${GOOD}" --ranks 3)

# The command line.
run_fails(2 "megadsl run: --logits goes with the actor; a critic has values" "${GOOD}" --critic --logits)
run_fails(2 "megadsl run: --temperature expects a positive number, got '0'" "${GOOD}" --temperature 0)
megadsl(run ${F} --input ${WORK}/in.json)
expect_exit(2)
expect_err("needs --input FILE \\(\\.json or \\.safetensors\\) and --output FILE")

# A FIFO where a file is expected is refused before it is opened (an open would block forever),
# as the input and as a model's config.json and weights.
execute_process(COMMAND mkfifo ${WORK}/fifo.json)
megadsl(run ${F} --tp 2 --ranks 2 --input ${WORK}/fifo.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("megadsl run: ${WORK}/fifo\\.json: is not a regular file \\(a FIFO, a device or a directory\\)")
file(MAKE_DIRECTORY ${WORK}/fifo-model)
execute_process(COMMAND mkfifo ${WORK}/fifo-model/config.json)
megadsl(run ${WORK}/fifo-model --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(2)
expect_err("fifo-model/config\\.json: is not a regular file")
file(MAKE_DIRECTORY ${WORK}/fifo-weights)
file(COPY ${F}/config.json DESTINATION ${WORK}/fifo-weights)
execute_process(COMMAND mkfifo ${WORK}/fifo-weights/model.safetensors)
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 2, 3]]}")
megadsl(run ${WORK}/fifo-weights --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(1)
expect_err("fifo-weights/model\\.safetensors.*is not a regular file")

# config.json sizes that do not describe the weights, or that no machine holds, are refused from
# the safetensors headers before anything is allocated.
file(MAKE_DIRECTORY ${WORK}/huge)
file(COPY ${F}/model.safetensors DESTINATION ${WORK}/huge)
file(READ ${F}/config.json cfg)
string(REPLACE "\"intermediate_size\": 176" "\"intermediate_size\": 1000000000000" huge_cfg "${cfg}")
file(WRITE ${WORK}/huge/config.json "${huge_cfg}")
set(MODEL ${WORK}/huge)
run_fails(1 "megadsl: ${WORK}/huge/config\\.json: its sizes \\(hidden_size, heads, head_dim, kv heads, intermediate_size, vocab_size, experts\\) give model\\.layers\\.0\\.mlp\\.gate_proj\\.weight the shape \\[1000000000000, 64\\], but model\\.safetensors holds \\[176, 64\\]; this config\\.json does not describe these weights \\(use the checkpoint's own config\\.json\\)"
          "${GOOD}")
# Weights that say nothing about the sizes (no model.* tensor): the memory check still stands.
file(MAKE_DIRECTORY ${WORK}/vast)
file(COPY ${F}/reference.safetensors DESTINATION ${WORK}/vast)
file(RENAME ${WORK}/vast/reference.safetensors ${WORK}/vast/model.safetensors)
string(REPLACE "\"vocab_size\": 300" "\"vocab_size\": 1000000000000" vast_cfg "${cfg}")
file(WRITE ${WORK}/vast/config.json "${vast_cfg}")
set(MODEL ${WORK}/vast)
run_fails(1 "megadsl: ${WORK}/vast/config\\.json: the model it describes has 128000\\.0 B parameters; the 2 rank\\(s\\) on this machine would hold [0-9.]+ GiB of them \\(tp 2 x pp 1, 4\\.0 bytes each\\), more than the [0-9.]+ GiB available; check hidden_size, num_hidden_layers, intermediate_size and vocab_size, or spread the model over more machines \\(tp, pp\\)"
          "${GOOD}")

# A sliding window (5 tokens on every layer) is applied: sequences longer than it run.
set(MODEL ${FIXTURES}/mistral-window-tf5)
file(WRITE ${WORK}/in.json "{\"input_ids\": [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]}")
megadsl(run ${MODEL} --tp 2 --ranks 2 --input ${WORK}/in.json --output ${WORK}/out.json)
expect_exit(0)
unset(MODEL)

# Names from files are escaped before they are printed: no terminal escape reaches the user.
run_fails(1 "${IN}unknown key \"x\\\\x1b\\[2J\"; the input has input_ids and, optionally, attention_mask"
          "{\"input_ids\": [[1, 2]], \"x\\u001b[2J\": 1}")
