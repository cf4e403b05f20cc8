# megadsl run --critic on the transformers fixture's critic (LlamaForTokenClassification): values
# equal the reference, at tp 2 with SP and remove-padding; a critic needs --critic.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/llama-gqa)
compare_tensors(extract ${F}/reference.safetensors ${WORK}/left.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)
megadsl(run ${F}/critic --critic --tp 2 --sp --rmpad --ranks 2 --input ${WORK}/left.safetensors
        --output ${WORK}/values.safetensors)
expect_exit(0)
expect_err("note: value head loaded from score\\.\\*")
expect_out("wrote values, valid to ")
expect_same(${WORK}/values.safetensors ${F}/reference.safetensors:left. --names values --tol 1e-4)
expect_differ(${WORK}/values.safetensors ${F}/reference.safetensors:right. --names values --tol 1e-4)

# The right-padded batch, JSON out, one rank.
compare_tensors(extract ${F}/reference.safetensors ${WORK}/right.safetensors
                right.input_ids:input_ids right.attention_mask:attention_mask)
megadsl(run ${F}/critic --critic --input ${WORK}/right.safetensors --output ${WORK}/values.json)
expect_exit(0)
expect_same(${WORK}/values.json ${F}/reference.safetensors:right. --names values --tol 1e-4)
