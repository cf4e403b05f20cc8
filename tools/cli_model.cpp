// Command-line parsing, the model argument (preset or config.json) and validation for `megadsl`.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <ostream>
#include <sstream>

#include "cli.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/models/registry.hpp"

namespace megadsl::cli {
namespace {

// Levenshtein distance, for "did you mean" suggestions.
std::size_t distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

template <class Range>
std::string closest(std::string_view word, const Range& candidates) {
  std::string best;
  std::size_t best_d = 3;  // suggest only near misses
  for (std::string_view c : candidates) {
    const std::size_t d = distance(word, c);
    if (d < best_d) {
      best_d = d;
      best = std::string(c);
    }
  }
  return best;
}

constexpr std::string_view layout_flags[] = {
    "--tp", "--pp", "--vpp", "--first-stage-layers", "--last-stage-layers", "--sp", "--rmpad", "--invariant", "--cp", "--ep", "--etp",
    "--recompute", "--cp-comm", "--cp-a2a", "--vocab-pad-multiple", "--world", "--global-batch", "--micro-batch", "--microbatches",
    "--critic", "--no-value-bias", "--config", "--seq", "--input", "--output", "--ranks", "--temperature",
    "--logits", "--from", "--to", "--to-format", "--dtype", "--device", "--compute", "--merge-lora",
    "--lora-adapter"};

// Flags of one command only, and which.
struct command_flag {
  std::string_view flag, command;
};
constexpr command_flag command_flags[] = {
    {"--seq", "plan"},           {"--input", "run"},   {"--output", "run"}, {"--temperature", "run"},
    {"--logits", "run"},         {"--from", "convert"}, {"--to", "convert"}, {"--to-format", "convert"},
    {"--dtype", "convert"},      {"--device", "run"},  {"--compute", "run"}, {"--merge-lora", "convert"},
    {"--lora-adapter", "run"}};

std::int64_t parse_int(std::string_view flag, std::string_view text) {
  std::int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc{} || p != end)
    throw usage_error("megadsl: " + std::string(flag) + " expects an integer, got '" + std::string(text) + "'");
  return v;
}

}  // namespace

options parse_args(std::string_view command, const std::vector<std::string_view>& args) {
  options o;
  o.command = std::string(command);
  bool no_value_bias = false;
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view a = args[i];
    if (!a.starts_with("--")) {
      if (!o.model.empty())
        throw usage_error("megadsl " + o.command + ": one MODEL only, got '" + o.model + "' and '" +
                          std::string(a) + "'");
      o.model = std::string(a);
      continue;
    }
    std::string_view flag = a, inline_value;
    bool has_inline = false;
    if (auto eq = a.find('='); eq != std::string_view::npos) {
      flag = a.substr(0, eq);
      inline_value = a.substr(eq + 1);
      has_inline = true;
    }
    auto value = [&]() -> std::string_view {
      if (has_inline) return inline_value;
      if (i + 1 >= args.size())
        throw usage_error("megadsl: " + std::string(flag) + " needs a value, e.g. " + std::string(flag) + " 4");
      return args[++i];
    };
    auto number = [&]() { return parse_int(flag, value()); };
    // Run facts have no positive_sizes rule (an unknown fact is simply not checked), so a
    // non-positive one is refused here rather than silently skipped.
    auto count = [&]() {
      const std::int64_t v = number();
      if (v <= 0) throw usage_error("megadsl: " + std::string(flag) + " must be positive, got " + std::to_string(v));
      return v;
    };
    auto switch_on = [&]() {
      if (has_inline) throw usage_error("megadsl: " + std::string(flag) + " takes no value");
      return true;
    };
    if (flag == "--tp") o.l.tp = number();
    else if (flag == "--pp") o.l.pp = number();
    else if (flag == "--vpp") o.l.vpp = number();
    else if (flag == "--cp") o.l.cp = number();
    else if (flag == "--cp-a2a") o.l.cp_a2a = number();
    else if (flag == "--ep") o.l.ep = number();
    else if (flag == "--etp") o.l.etp = number();
    else if (flag == "--first-stage-layers") o.l.first_stage_layers = number();
    else if (flag == "--last-stage-layers") o.l.last_stage_layers = number();
    else if (flag == "--sp") o.l.sp = switch_on();
    else if (flag == "--rmpad") o.l.rmpad = switch_on();
    else if (flag == "--invariant") o.l.invariant = switch_on();
    else if (flag == "--cp-comm") {
      const std::string_view v = value();
      cp_comm_kind k{};
      if (!cp_comm_from_name(v, k))
        throw usage_error("megadsl: --cp-comm takes a2a (Ulysses), ring (p2p) or a2a+ring (a2a+p2p, with --cp-a2a), got '" +
                          std::string(v) + "'");
      o.l.cp_comm = k;
    }
    else if (flag == "--recompute") {
      const std::string_view v = value();
      recompute_kind r{};
      if (!recompute_from_name(v, r))
        throw usage_error("megadsl: --recompute takes none, selective or full, got '" + std::string(v) + "'");
      o.l.recompute = r;
    }
    else if (flag == "--vocab-pad-multiple") o.l.vocab_pad_multiple = number();
    else if (flag == "--world") o.facts.world = count();
    else if (flag == "--global-batch") o.facts.global_batch = count();
    else if (flag == "--micro-batch") o.facts.micro_batch = count();
    else if (flag == "--microbatches") o.facts.microbatches = count();
    else if (flag == "--critic") o.head.actor = !switch_on(), o.critic_given = true;
    else if (flag == "--no-value-bias") no_value_bias = switch_on();
    else if (flag == "--config") o.config = std::string(value());
    else if (flag == "--seq" && o.command == "plan") o.seq = count();
    else if (flag == "--ranks" && (o.command == "run" || o.command == "convert")) o.ranks = count();
    else if (flag == "--input" && o.command == "run") o.input = std::string(value());
    else if (flag == "--output" && o.command == "run") o.output = std::string(value());
    else if (flag == "--logits" && o.command == "run") o.logits = switch_on();
    else if (flag == "--temperature" && o.command == "run") {
      const std::string text(value());
      char* end = nullptr;
      const double t = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !(t > 0) || t == HUGE_VAL)
        throw usage_error("megadsl run: --temperature expects a positive number, got '" + text + "'");
      o.temperature = t;
    } else if (flag == "--device" && o.command == "run") {
      o.device = std::string(value());
      if (o.device != "cpu" && o.device != "cuda")
        throw usage_error("megadsl run: --device is cpu or cuda, got '" + o.device + "'");
    } else if (flag == "--compute" && o.command == "run") {
      o.compute = std::string(value());
      if (o.compute != "fp32" && o.compute != "bf16")
        throw usage_error("megadsl run: --compute is fp32 or bf16, got '" + o.compute + "'");
    } else if (flag == "--from" && o.command == "convert") o.from = std::string(value());
    else if (flag == "--to" && o.command == "convert") o.to = std::string(value());
    else if (flag == "--merge-lora" && o.command == "convert") o.merge_lora = std::string(value());
    else if (flag == "--lora-adapter" && o.command == "run") o.lora_adapter = std::string(value());
    else if (flag == "--to-format" && o.command == "convert") {
      o.to_format = std::string(value());
      if (o.to_format != "hf" && o.to_format != "dist")
        throw usage_error("megadsl convert: --to-format is hf or dist, got '" + o.to_format + "'");
    } else if (flag == "--dtype" && o.command == "convert") {
      o.dtype = std::string(value());
      if (o.dtype != "fp32" && o.dtype != "bf16" && o.dtype != "fp16")
        throw usage_error("megadsl convert: --dtype is fp32, bf16 or fp16, got '" + o.dtype + "'");
    } else {
      std::string m = "megadsl " + o.command + ": unknown option '" + std::string(flag) + "'";
      const command_flag* owner = nullptr;
      for (const command_flag& c : command_flags)
        if (c.flag == flag) owner = &c;
      if (flag == "--ranks") m += " (--ranks belongs to megadsl run and convert)";
      else if (owner != nullptr) m += " (" + std::string(flag) + " belongs to megadsl " + std::string(owner->command) + ")";
      else if (std::string s = closest(flag, layout_flags); !s.empty()) m += "; did you mean " + s + "?";
      throw usage_error(m + "; see megadsl help");
    }
  }
  if (no_value_bias) {
    if (o.head.actor) throw usage_error("megadsl: --no-value-bias goes with --critic (the value head's bias)");
    o.head.value_bias = false;
  }
  if (o.command == "convert") {
    if (!o.model.empty())
      throw usage_error("megadsl convert: takes no MODEL argument ('" + o.model +
                        "'); name the source with --from PATH and the target with --to PATH");
    if (o.from.empty() || o.to.empty())
      throw usage_error("megadsl convert: needs --from PATH (an HF model directory or a distributed checkpoint) "
                        "and --to PATH");
    o.model = o.from;
    return o;
  }
  if (o.model.empty())
    throw usage_error("megadsl " + o.command +
                      ": missing MODEL: a preset name (megadsl presets) or an HF model directory / config.json");
  if (o.command == "run" && (o.input.empty() || o.output.empty()))
    throw usage_error("megadsl run: needs --input FILE (.json or .safetensors) and --output FILE (.json or "
                      ".safetensors)");
  if (o.logits && !o.head.actor) throw usage_error("megadsl run: --logits goes with the actor; a critic has values");
  return o;
}

model_arg load_model(const options& o) {
  model_arg m;
  m.name = o.model;
  if (const preset_entry* p = find_preset(o.model)) {
    m.name = std::string(p->name);
    m.s = p->s;
    m.published_params = p->published_params;
    m.origin = "preset, " + std::string(p->source);
    if (!o.config.empty()) {
      const hf_config cfg = read_hf_config(o.config);
      const std::vector<std::string> bad = mismatches(p->s, cfg.s, "config.json");
      if (!bad.empty()) {
        std::string msg = "megadsl: preset " + std::string(p->name) + " does not match " + cfg.file.string() + ":";
        for (const std::string& b : bad) msg += "\n  " + b;
        throw mismatch_error(msg + "\nfix: use the preset of this checkpoint (megadsl presets), or pass the "
                                   "checkpoint itself as MODEL without --config");
      }
      m.s = resolve(p->s, cfg.s, cfg.file.string(), p->name);
      m.notes = cfg.notes;
      m.origin += ", matches " + cfg.file.string();
    }
    return m;
  }
  std::error_code ec;
  if (std::filesystem::exists(o.model, ec)) {
    if (!o.config.empty())
      throw usage_error("megadsl: --config checks a preset against a config.json; '" + o.model +
                        "' is already a path, so give a preset name (megadsl presets) or drop --config");
    hf_config cfg = read_hf_config(o.model);
    m.s = cfg.s;
    m.notes = std::move(cfg.notes);
    m.origin = cfg.file.string() + ", model_type " + cfg.model_type;
    for (const preset_entry& p : presets)
      if (mismatches(p.s, m.s).empty()) {
        m.origin += ", the shape of preset " + std::string(p.name);
        break;
      }
    return m;
  }
  std::vector<std::string_view> names;
  for (const preset_entry& p : presets) names.push_back(p.name);
  std::string msg = "megadsl: '" + o.model + "' is neither a preset nor an existing file or directory";
  if (std::string s = closest(o.model, names); !s.empty()) msg += "; did you mean " + s + "?";
  msg += " Presets: ";
  for (std::size_t i = 0; i < names.size(); ++i) msg += (i ? ", " : "") + std::string(names[i]);
  throw usage_error(msg + "; or pass an HF model directory / config.json");
}

std::string layout_summary(const options& o) {
  const layout& l = o.l;
  std::ostringstream s;
  s << "tp=" << l.tp.get() << " pp=" << l.pp.get() << " vpp=" << l.vpp.get()
    << " sp=" << (l.sp.get() ? "on" : "off") << " rmpad=" << (l.rmpad.get() ? "on" : "off");
  if (l.cp.get() != 1) s << " cp=" << l.cp.get();
  if (l.cp_comm.get() != cp_comm_kind::a2a) s << " cp_comm=" << name_of(l.cp_comm.get());
  if (l.cp_a2a.get() != 1) s << " cp_a2a=" << l.cp_a2a.get();
  if (l.ep.get() != 1) s << " ep=" << l.ep.get();
  if (l.etp.get() != 0) s << " etp=" << l.etp.get();
  if (l.recompute.get() != recompute_kind::none) s << " recompute=" << name_of(l.recompute.get());
  if (l.invariant.get()) s << " invariant=on";
  if (l.first_stage_layers.get() != 0) s << " first_stage_layers=" << l.first_stage_layers.get();
  if (l.last_stage_layers.get() != 0) s << " last_stage_layers=" << l.last_stage_layers.get();
  if (l.vocab_pad_multiple.get() != 128) s << " vocab_pad_multiple=" << l.vocab_pad_multiple.get();
  const run_facts& f = o.facts;
  if (f.world.is_static()) s << " world=" << f.world.get();
  if (f.global_batch.is_static()) s << " global_batch=" << f.global_batch.get();
  if (f.micro_batch.is_static()) s << " micro_batch=" << f.micro_batch.get();
  if (f.microbatches.is_static()) s << " microbatches=" << f.microbatches.get();
  if (!o.head.actor) s << (o.head.value_bias ? " critic" : " critic(no value bias)");
  return s.str();
}

bool validate(const model_arg& m, const options& o, std::ostream& err) {
  for (const std::string& n : m.notes) err << "note: " << n << '\n';
  const violations v = check(m.s, o.l, o.facts);
  for (int i = 0; i < v.count; ++i) err << v.items[static_cast<std::size_t>(i)].message.view() << '\n';
  return v.ok();
}

std::string to_string(const dims& d) {
  if (d.rank == 1) return "(" + std::to_string(d.rows) + ")";
  return "(" + std::to_string(d.rows) + ", " + std::to_string(d.cols) + ")";
}

std::string grouped(std::int64_t v) {
  std::string digits = std::to_string(v < 0 ? -v : v), out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string short_count(std::int64_t v) {
  const char* unit = "";
  double x = static_cast<double>(v);
  if (v >= 1'000'000'000) x /= 1e9, unit = "B";
  else if (v >= 1'000'000) x /= 1e6, unit = "M";
  else if (v >= 1'000) x /= 1e3, unit = "K";
  std::ostringstream s;
  s.setf(std::ios::fixed);
  s.precision(x >= 100 ? 0 : x >= 10 ? 1 : 2);
  s << x << unit;
  return s.str();
}

void table::print(std::ostream& out, std::string_view indent) const {
  auto lines_of = [](const std::string& cell) {
    std::vector<std::string> lines;
    std::istringstream in(cell);
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    if (lines.empty()) lines.emplace_back();
    return lines;
  };
  std::vector<std::size_t> width;
  for (const auto& row : rows_)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (width.size() <= c) width.resize(c + 1, 0);
      for (const auto& line : lines_of(row[c])) width[c] = std::max(width[c], line.size());
    }
  for (const auto& row : rows_) {
    std::vector<std::vector<std::string>> cells;
    std::size_t height = 1;
    for (const auto& cell : row) {
      cells.push_back(lines_of(cell));
      height = std::max(height, cells.back().size());
    }
    for (std::size_t h = 0; h < height; ++h) {
      std::string line(indent);
      for (std::size_t c = 0; c < cells.size(); ++c) {
        const std::string text = h < cells[c].size() ? cells[c][h] : "";
        line += text;
        if (c + 1 < cells.size()) line += std::string(width[c] - text.size() + 2, ' ');
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      out << line << '\n';
    }
  }
}

}  // namespace megadsl::cli
