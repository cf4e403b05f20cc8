// The batch `megadsl run` reads: a .json {"input_ids": [[...]], "attention_mask": [[...]]} or a
// .safetensors file with those tensors. Every problem is an input_error naming the file and the
// first problem in one line (the parsers are bounded: JSON depth and size, safetensors headers).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace megadsl::cli {

struct run_input {
  at::Tensor ids, mask;  // (b, s) int64
};

// Reads and checks `file` (by its extension) against a vocabulary of `vocab` ids.
run_input read_input(const std::string& file, std::int64_t vocab);

// The JSON form from its text (`file` names it in errors), unchecked: check_input() checks it.
run_input parse_json_input(std::string_view text, const std::string& file);

// Ids inside the vocabulary, a 0/1 mask of the ids' shape with one run of tokens per row (a
// missing mask becomes all ones).
void check_input(run_input& r, const std::string& file, std::int64_t vocab);

}  // namespace megadsl::cli
