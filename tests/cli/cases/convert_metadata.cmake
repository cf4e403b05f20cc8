# HF -> distributed -> HF keeps what an HF -> HF conversion keeps (issue 23, item 4): config.json's
# other fields (token ids, router_aux_loss_coef, initializer_range, dtype), generation_config.json
# and the tokenizer files travel in the distributed checkpoint's hf/ folder; and a finished write
# leaves neither its staging directory nor its lock file behind (item 13).
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/qwen2-tied-bias)

file(COPY ${F}/ DESTINATION ${WORK}/src)
file(READ ${F}/config.json config)
string(REPLACE "\"pad_token_id\": 0," "\"pad_token_id\": 0,\n  \"router_aux_loss_coef\": 0.001," config "${config}")
file(WRITE ${WORK}/src/config.json "${config}")
file(WRITE ${WORK}/src/generation_config.json "{\"bos_token_id\": 1, \"eos_token_id\": 2, \"temperature\": 0.7}\n")
file(WRITE ${WORK}/src/tokenizer.json "{\"version\": \"1.0\", \"model\": {\"type\": \"BPE\"}}\n")
file(WRITE ${WORK}/src/tokenizer_config.json "{\"model_max_length\": 128}\n")

megadsl(convert --from ${WORK}/src --to ${WORK}/dist --tp 2 --ranks 2)
expect_exit(0)
megadsl(convert --from ${WORK}/dist --to ${WORK}/dist2 --to-format dist --pp 2 --ranks 2)
expect_exit(0)
megadsl(convert --from ${WORK}/dist2 --to ${WORK}/hf)
expect_exit(0)
expect_same(${WORK}/src ${WORK}/hf)
foreach(file generation_config.json tokenizer.json tokenizer_config.json)
  file(READ ${WORK}/src/${file} a)
  file(READ ${WORK}/hf/${file} b)
  expect_equal("${a}" "${b}" "${file} after HF -> dist -> dist -> HF")
endforeach()
file(READ ${WORK}/hf/config.json out)
foreach(field "\"bos_token_id\": 1" "\"eos_token_id\": 2" "\"router_aux_loss_coef\": 0.001"
              "\"initializer_range\": 0.02" "\"dtype\": \"float32\"" "\"pad_token_id\": 0")
  string(FIND "${out}" "${field}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "config.json after HF -> dist -> HF lost ${field}:\n${out}")
  endif()
endforeach()

# Nothing left beside the targets: no <target>.tmp-*, no <target>.lock.
file(GLOB left ${WORK}/*.tmp-* ${WORK}/*.lock)
if(left)
  message(FATAL_ERROR "writes left behind: ${left}")
endif()

# A write that fails after its progress line started never reports "done" (item 15): a target
# that holds other files is refused inside save_hf.
file(MAKE_DIRECTORY ${WORK}/occupied)
file(WRITE ${WORK}/occupied/notes.txt "mine\n")
megadsl(convert --from ${WORK}/src --to ${WORK}/occupied --to-format hf)
expect_exit(1)
expect_err("megadsl: cannot save an HF checkpoint to ${WORK}/occupied: it holds files but no config\\.json")
expect_no_err("writing[^\n]*done")
file(READ ${WORK}/occupied/notes.txt notes)
expect_equal("${notes}" "mine\n" "a file of the refused target")
