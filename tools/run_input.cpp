// The batch `megadsl run` reads (tools/run_input.hpp).
#include "run_input.hpp"

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "../src/spec/json_bounded.hpp"
#include "cli.hpp"
#include "megadsl/io/printable.hpp"
#include "megadsl/io/safetensors.hpp"

namespace megadsl::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

[[noreturn]] void bad_input(const std::string& file, const std::string& what) {
  throw input_error("megadsl run: " + file + ": " + what);
}

std::string json_kind(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "a list";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_float: {
      const double v = j.get<double>();
      if (v != std::floor(v) || !std::isfinite(v)) return "a number with a fraction";
      if (std::fabs(v) >= 9.2e18) return "a number beyond the 64-bit integer range";
      return "a number written with a decimal point or an exponent (write integers as digits only, e.g. 1)";
    }
    case json::value_t::number_unsigned:
      return j.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX) ? "a number beyond the 64-bit integer range"
                                                                           : "a number";
    default: return "a number";
  }
}

// `[[...], ...]` of integers (booleans too when `booleans`) -> (rows, cols) int64.
at::Tensor json_rows(const json& j, const std::string& file, const std::string& key, bool booleans) {
  if (!j.is_array() || j.empty())
    bad_input(file, key + " must be a non-empty list of rows (lists of integers), got " +
                        (j.is_array() ? std::string("an empty list") : json_kind(j)));
  const std::int64_t rows = static_cast<std::int64_t>(j.size());
  std::int64_t cols = -1;
  std::vector<std::int64_t> data;
  for (std::int64_t r = 0; r < rows; ++r) {
    const json& row = j[static_cast<std::size_t>(r)];
    const std::string where = key + "[" + std::to_string(r) + "]";
    if (!row.is_array()) bad_input(file, where + " must be a list of integers, got " + json_kind(row));
    if (row.empty()) bad_input(file, where + " is empty; every row needs at least one token");
    if (cols < 0) cols = static_cast<std::int64_t>(row.size());
    if (static_cast<std::int64_t>(row.size()) != cols)
      bad_input(file, "rows of " + key + " differ in length: " + key + "[0] has " + std::to_string(cols) + ", " + where +
                          " has " + std::to_string(row.size()) + "; pad every row to the same length (and mark the "
                          "padding 0 in attention_mask)");
    for (std::size_t c = 0; c < row.size(); ++c) {
      const json& v = row[c];
      if (v.is_number_integer() && !(v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX)))
        data.push_back(v.get<std::int64_t>());
      else if (booleans && v.is_boolean()) data.push_back(v.get<bool>() ? 1 : 0);
      else
        bad_input(file, where + "[" + std::to_string(c) + "] must be an integer, got " + json_kind(v) + " " + v.dump(-1, ' ', /*ensure_ascii=*/true));
    }
  }
  return at::tensor(data, at::kLong).view({rows, cols});
}

}  // namespace

run_input parse_json_input(std::string_view text, const std::string& file) {
  const json j = parse_json_bounded(text, std::size_t{1} << 30, [&](const std::string& problem) { bad_input(file, problem); });
  if (!j.is_object())
    bad_input(file, "expected a JSON object {\"input_ids\": [[...], ...], \"attention_mask\": [[...], ...]}, got " +
                        json_kind(j));
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "input_ids" && it.key() != "attention_mask")
      bad_input(file, "unknown key \"" + printable(it.key()) + "\"; the input has input_ids and, optionally, attention_mask");
  if (!j.contains("input_ids")) bad_input(file, "input_ids: missing (a list of rows of token ids)");
  run_input r;
  r.ids = json_rows(j["input_ids"], file, "input_ids", false);
  if (j.contains("attention_mask")) r.mask = json_rows(j["attention_mask"], file, "attention_mask", true);
  return r;
}

namespace {

run_input read_safetensors_input(const std::string& file) {
  const safetensors_file f = safetensors_file::open(file);
  auto get = [&](const std::string& name, bool required) -> at::Tensor {
    const tensor_info* t = f.find(name);
    if (t == nullptr) {
      if (!required) return {};
      std::string have;
      for (const tensor_info& i : f.tensors()) have += (have.empty() ? "" : ", ") + printable(i.name);
      bad_input(file, "has no tensor " + name + " (it has: " + (have.empty() ? "none" : have) + ")");
    }
    if (t->shape.size() != 2)
      bad_input(file, name + " must be 2-D (batch, seq), it has " + std::to_string(t->shape.size()) + " dimensions");
    if (t->shape[0] == 0 || t->shape[1] == 0) bad_input(file, name + " is empty");
    if (!at::isIntegralType(t->dtype, /*includeBool=*/name == "attention_mask"))
      bad_input(file, name + " must hold integers, it is " + std::string(safetensors_dtype_name(t->dtype)));
    return f.read(name, at::kLong);
  };
  run_input r;
  r.ids = get("input_ids", true);
  r.mask = get("attention_mask", false);
  // As in JSON: a field megadsl does not read (labels, ...) is refused, never silently ignored.
  for (const tensor_info& t : f.tensors())
    if (t.name != "input_ids" && t.name != "attention_mask")
      bad_input(file, "unknown tensor \"" + printable(t.name) + "\"; the input has input_ids and, optionally, attention_mask");
  return r;
}


std::string dims_text(const at::Tensor& t) {
  std::string s;
  for (std::int64_t d : t.sizes()) s += (s.empty() ? "" : " x ") + std::to_string(d);
  return s;
}

}  // namespace

run_input read_input(const std::string& file, std::int64_t vocab) {
  const std::string ext = fs::path(file).extension().string();
  if (ext != ".json" && ext != ".safetensors")
    throw usage_error("megadsl run: --input " + file + ": the input is .json or .safetensors");
  std::error_code ec;
  if (!fs::exists(file, ec)) bad_input(file, "no such file");
  if (!fs::is_regular_file(file, ec)) bad_input(file, "is not a regular file (a FIFO, a device or a directory); pass a .json or .safetensors file");
  run_input r;
  if (ext == ".json") {
    std::ifstream in(file);
    if (!in) bad_input(file, "cannot be read");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    r = parse_json_input(text, file);
  } else {
    r = read_safetensors_input(file);
  }
  check_input(r, file, vocab);
  return r;
}

void check_input(run_input& r, const std::string& file, std::int64_t vocab) {
  if (!r.mask.defined()) r.mask = at::ones_like(r.ids);
  if (!r.mask.sizes().equals(r.ids.sizes()))
    bad_input(file, "attention_mask is " + dims_text(r.mask) + " but input_ids is " + dims_text(r.ids) +
                        "; they must have the same shape");
  const std::int64_t b = r.ids.size(0), s = r.ids.size(1);
  const auto ids = r.ids.accessor<std::int64_t, 2>();
  const auto mask = r.mask.accessor<std::int64_t, 2>();
  for (std::int64_t i = 0; i < b; ++i) {
    std::int64_t first = -1, last = -1;
    for (std::int64_t t = 0; t < s; ++t) {
      const std::int64_t id = ids[i][t], m = mask[i][t];
      if (id < 0 || id >= vocab)
        bad_input(file, "input_ids[" + std::to_string(i) + "][" + std::to_string(t) + "] = " + std::to_string(id) +
                            " is outside the vocabulary (0 to " + std::to_string(vocab - 1) + ")");
      if (m != 0 && m != 1)
        bad_input(file, "attention_mask[" + std::to_string(i) + "][" + std::to_string(t) + "] = " + std::to_string(m) +
                            "; the mask holds 1 (token) or 0 (padding)");
      if (m == 1) {
        if (first < 0) first = t;
        else if (last != t - 1)
          bad_input(file, "attention_mask row " + std::to_string(i) + " has padding between its tokens (column " +
                              std::to_string(last + 1) + "); pad on the left or on the right");
        last = t;
      }
    }
    if (first < 0) bad_input(file, "attention_mask row " + std::to_string(i) + " has no tokens; every row needs one");
  }
}

}  // namespace megadsl::cli
