# megadsl convert: HF -> distributed (tp 2) -> HF (pp 2) is bit-identical to the source, for the
# actor and the critic; dist -> dist reshards; dtype changes; the converted checkpoint runs.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
set(F ${FIXTURES}/llama-gqa)

# Actor: HF -> dist at (tp 2, pp 1) -> HF at (tp 1, pp 2).
megadsl(convert --from ${F} --to ${WORK}/dist --tp 2 --ranks 2)
expect_exit(0)
expect_out("wrote distributed checkpoint ${WORK}/dist \\(fp32, actor\\) from HF checkpoint ${F}, through the layout tp=2 pp=1")
foreach(file metadata.json rank_0.safetensors rank_1.safetensors)
  if(NOT EXISTS ${WORK}/dist/${file})
    message(FATAL_ERROR "the distributed checkpoint has no ${file}")
  endif()
endforeach()
megadsl(convert --from ${WORK}/dist --to ${WORK}/hf --pp 2 --ranks 2)
expect_exit(0)
expect_out("wrote HF checkpoint ${WORK}/hf \\(fp32, actor\\) from distributed checkpoint")
expect_same(${F} ${WORK}/hf)
megadsl(check ${WORK}/hf --tp 2)
expect_exit(0)

# dist -> dist: resharded to (tp 2, pp 2, SP) on 4 ranks, then back to HF on one rank.
megadsl(convert --from ${WORK}/dist --to ${WORK}/dist4 --to-format dist --tp 2 --pp 2 --sp)
expect_exit(0)
megadsl(convert --from ${WORK}/dist4 --to ${WORK}/hf4)
expect_exit(0)
expect_same(${F} ${WORK}/hf4)

# The converted checkpoint runs and gives the reference's log-probs.
compare_tensors(extract ${F}/reference.safetensors ${WORK}/left.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)
megadsl(run ${WORK}/hf4 --tp 2 --input ${WORK}/left.safetensors --output ${WORK}/out.safetensors)
expect_exit(0)
expect_same(${WORK}/out.safetensors ${F}/reference.safetensors:left. --names log_probs --tol 1e-4)

# Critic: HF -> dist at tp 2 (SP, remove-padding) -> HF at pp 2.
megadsl(convert --from ${F}/critic --critic --to ${WORK}/cdist --tp 2 --sp --rmpad)
expect_exit(0)
expect_err("note: value head loaded from score\\.\\*")
expect_no_err("not converted")
megadsl(convert --from ${WORK}/cdist --to ${WORK}/chf --pp 2)
expect_exit(0)
expect_out("\\(fp32, critic\\)")
expect_same(${F}/critic ${WORK}/chf)

# HF -> HF in bf16: not the source bit for bit (the comparison can fail), close to it, and
# bf16 -> dist -> HF keeps it exactly.
megadsl(convert --from ${F} --to ${WORK}/bf16 --to-format hf --dtype bf16 --tp 2)
expect_exit(0)
expect_out("wrote HF checkpoint ${WORK}/bf16 \\(bf16, actor\\)")
expect_differ(${F} ${WORK}/bf16)
expect_same(${F} ${WORK}/bf16 --tol 1e-2)
megadsl(convert --from ${WORK}/bf16 --to ${WORK}/bf16-dist --tp 2 --pp 2)
expect_exit(0)
megadsl(convert --from ${WORK}/bf16-dist --to ${WORK}/bf16-hf)
expect_exit(0)
expect_same(${WORK}/bf16 ${WORK}/bf16-hf)

# A family with a sliding window on alternate layers and config keys its blocks read themselves
# (gpt-oss: swiglu_limit, swiglu_alpha): dist -> HF writes the window and the keys back as the
# source had them (the window is not in the distributed checkpoint's model: it comes from the HF
# config.json the checkpoint carries), and the converted checkpoint gives the reference's log-probs.
set(G ${FIXTURES}/gpt-oss-tf5)
megadsl(convert --from ${G} --to ${WORK}/gdist --tp 2 --ranks 2)
expect_exit(0)
megadsl(convert --from ${WORK}/gdist --to ${WORK}/ghf)
expect_exit(0)
expect_same(${G} ${WORK}/ghf)
file(READ ${WORK}/ghf/config.json written)
foreach(kv "\"sliding_window\": 5" "\"sliding_attention\"" "\"swiglu_limit\": 1.0" "\"swiglu_alpha\": 1.702")
  string(FIND "${written}" "${kv}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "dist -> HF of gpt-oss: config.json lacks ${kv}:\n${written}")
  endif()
endforeach()
compare_tensors(extract ${G}/reference.safetensors ${WORK}/gleft.safetensors
                left.input_ids:input_ids left.attention_mask:attention_mask)
megadsl(run ${WORK}/ghf --input ${WORK}/gleft.safetensors --output ${WORK}/gout.safetensors)
expect_exit(0)
expect_same(${WORK}/gout.safetensors ${G}/reference.safetensors:left. --names log_probs --tol 1e-4)

# Mistakes: one line each.
megadsl(convert --from ${WORK} --to ${WORK}/x)
expect_exit(1)
expect_err("^megadsl convert: ${WORK} is neither an HF model directory \\(config\\.json and safetensors\\) nor a megadsl distributed checkpoint \\(metadata\\.json\\)\n$")
megadsl(convert --from ${WORK}/dist --to ${WORK}/dist)
expect_exit(2)
expect_err("is the source itself")
megadsl(convert --from ${WORK}/dist --critic --to ${WORK}/x)
expect_exit(2)
expect_err("holds an actor \\(an LM head\\); drop --critic")
megadsl(convert --from ${F})
expect_exit(2)
expect_err("needs --from PATH")
megadsl(convert ${F} --to ${WORK}/x)
expect_exit(2)
expect_err("takes no MODEL argument")
megadsl(convert --from ${F} --to ${WORK}/x --tp 3)
expect_exit(1)
expect_err("^heads_divisible_by_tp: ")
