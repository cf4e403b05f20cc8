# megadsl run on the transformers fixture (actor): log-probs, entropy and logits equal the
# reference outputs transformers wrote (tests/fixtures/llama-gqa/reference.safetensors, left-padded
# batch), from a .safetensors and from a .json input, under tp 2 and under tp 2 x pp 2 with SP and
# remove-padding.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/llama-gqa)
set(REF ${F}/reference.safetensors:left.)

# The reference's left-padded batch as a .safetensors input.
compare_tensors(extract ${F}/reference.safetensors ${WORK}/left.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)
megadsl(run ${F} --tp 2 --ranks 2 --input ${WORK}/left.safetensors --output ${WORK}/out.safetensors)
expect_exit(0)
expect_out("wrote log_probs, entropy, valid to .*out\\.safetensors")
expect_same(${WORK}/out.safetensors ${REF} --names log_probs,entropy --tol 1e-4)

# The same batch as JSON; JSON out, with the logits, on 4 ranks (tp 2 x pp 2, SP, remove-padding).
file(WRITE ${WORK}/left.json [=[
{"input_ids": [[241, 174, 188, 97, 299, 299, 188, 110, 89, 70, 155, 11],
               [0, 0, 0, 0, 0, 72, 294, 212, 222, 174, 116, 117],
               [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 109],
               [0, 0, 0, 242, 157, 105, 15, 9, 198, 137, 287, 40]],
 "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                    [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
                    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                    [0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1]]}
]=])
megadsl(run ${F} --tp 2 --pp 2 --sp --rmpad --logits --input ${WORK}/left.json --output ${WORK}/out.json)
expect_exit(0)
expect_out("wrote log_probs, entropy, logits, valid to .*out\\.json")
file(READ ${WORK}/out.json json)
if(NOT json MATCHES "^{\n\"log_probs\": \\[\n  \\[-4\\.49885[0-9]*, ")
  message(FATAL_ERROR "out.json does not start with the log-probs:\n${json}")
endif()
expect_same(${WORK}/out.json ${REF} --names log_probs,entropy,logits --tol 1e-4)
# Both runs agree on where the outputs are defined.
expect_same(${WORK}/out.json ${WORK}/out.safetensors --names valid,log_probs --tol 1e-5)

# The comparison can fail: at temperature 2 the log-probs are not the reference's.
megadsl(run ${F} --tp 2 --temperature 2 --input ${WORK}/left.json --output ${WORK}/hot.safetensors)
expect_exit(0)
expect_differ(${WORK}/hot.safetensors ${REF} --names log_probs --tol 1e-4)

# A temperature so small that the logits overflow: an error naming the output and the flag, exit
# non-zero, and no file with nulls in it.
megadsl(run ${F} --temperature 1e-40 --input ${WORK}/left.json --output ${WORK}/cold.json)
expect_exit(1)
expect_err("megadsl run: log_probs is NaN or Inf at [0-9]+ position\\(s\\), first \\(row 0, position 0\\); --temperature 1e-40 overflows the logits")
if(EXISTS ${WORK}/cold.json)
  message(FATAL_ERROR "a run with non-finite outputs wrote ${WORK}/cold.json")
endif()

# Data parallelism: --ranks 3 at tp 1 is 3 replicas, each computing its ceil(4 / 3) = 2 rows (the
# last replica a copy of row 3 beside it), gathered on rank 0: the reference's numbers.
megadsl(run ${F} --ranks 3 --input ${WORK}/left.json --output ${WORK}/dp3.safetensors)
expect_exit(0)
expect_same(${WORK}/dp3.safetensors ${REF} --names log_probs,entropy --tol 1e-4)
expect_same(${WORK}/dp3.safetensors ${WORK}/out.safetensors --names valid --tol 0)

# Context parallelism without --ranks: the default count includes cp (tp 2 x cp 2: 4 ranks), as it
# includes ep; it used to be tp * pp alone, refused as "world size 2 is not divisible by tp * pp * cp".
megadsl(run ${F} --tp 2 --cp 2 --sp --rmpad --input ${WORK}/left.json --output ${WORK}/cp2.safetensors)
expect_exit(0)
expect_same(${WORK}/cp2.safetensors ${REF} --names log_probs,entropy --tol 1e-4)
