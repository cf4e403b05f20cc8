# A multimodal checkpoint as published (Qwen3.5's: text model under model.language_model.*, a
# vision tower, mtp.* tensors): megadsl runs its text model, and HF -> (tp 2) -> HF writes the very
# checkpoint back, vision tower included; so does a distributed checkpoint of it (its hf/ carries
# the tensors outside the text model), through another one too.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/qwen3-5-vl-tf5)

compare_tensors(extract ${F}/reference.safetensors ${WORK}/left.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)
megadsl(run ${F} --tp 2 --rmpad --input ${WORK}/left.safetensors --output ${WORK}/out.safetensors)
expect_exit(0)
expect_err("note: a multimodal checkpoint \\(Qwen3_5ForConditionalGeneration\\)")
expect_same(${WORK}/out.safetensors ${F}/reference.safetensors:left. --names log_probs --tol 1e-4)

megadsl(convert --from ${F} --to ${WORK}/hf --to-format hf --tp 2 --ranks 2)
expect_exit(0)
expect_err("note: 24 tensor\\(s\\) outside the text model \\(model\\.visual\\.\\*, mtp\\.\\*\\) not loaded")
expect_no_err("not converted")
expect_same(${F} ${WORK}/hf)

megadsl(convert --from ${F} --to ${WORK}/dist --tp 2 --ranks 2)
expect_exit(0)
if(NOT EXISTS ${WORK}/dist/hf/multimodal.safetensors)
  message(FATAL_ERROR "the distributed checkpoint of a multimodal source carries no hf/multimodal.safetensors")
endif()
megadsl(convert --from ${WORK}/dist --to ${WORK}/dist2 --pp 2 --ranks 2)
expect_exit(0)
megadsl(convert --from ${WORK}/dist2 --to ${WORK}/back --to-format hf)
expect_exit(0)
expect_same(${F} ${WORK}/back)
megadsl(describe ${WORK}/back)
expect_exit(0)
expect_err("note: a multimodal checkpoint \\(Qwen3_5ForConditionalGeneration\\)")

# A text checkpoint's distributed checkpoint carries no such part.
megadsl(convert --from ${FIXTURES}/qwen3-5-tf5 --to ${WORK}/textdist --ranks 1)
expect_exit(0)
if(EXISTS ${WORK}/textdist/hf/multimodal.safetensors)
  message(FATAL_ERROR "a text model's distributed checkpoint carries hf/multimodal.safetensors")
endif()
