# 32 layers over pp 3: exactly one rule, with the pp values that divide 32.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(check llama3-8b --pp 3)
expect_exit(1)
expect_err("^layers_fit_stages: num_layers = 32 is not divisible by pp \\* vpp = 3 \\* 1 = 3; valid pp: 1, 2, 4, 8, 16, 32; or give first_stage_layers / last_stage_layers\n$")

# Explicit first/last stage counts that add up make pp 3 valid: 10 + 12 + 10.
megadsl(check llama3-8b --pp 3 --first-stage-layers 10 --last-stage-layers 10)
expect_exit(0)
# pp 4: 10 + 11 leave 11 layers, which do not split over the 2 middle stages.
megadsl(check llama3-8b --pp 4 --first-stage-layers 10 --last-stage-layers 11)
expect_exit(1)
expect_err("^layers_fit_stages: first_stage_layers = 10, last_stage_layers = 11")
