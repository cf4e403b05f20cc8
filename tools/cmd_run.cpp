// `megadsl run MODEL_DIR [layout] --input FILE --output FILE`: the actor's log-probs and entropy
// (and logits on request) or the critic's values for one batch, under any layout, on local ranks
// started here or under torchrun/srun. Also the pieces run and convert share: the job (launch or
// be a rank), error reporting, the progress line.
//
// Every check that needs no model (the command line, config.json, the layout, the input file, the
// output's directory) runs before any rank starts, so a bad input is one line and exit 1 from the
// parent; under torchrun every rank runs the same checks on the same files and fails alike, and
// only rank 0 prints.
#include <numeric>
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <ATen/Parallel.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "../src/spec/json_bounded.hpp"
#include "cli.hpp"
#include "run_input.hpp"
#include "megadsl/hf_config.hpp"
#include "megadsl/io/atomic_file.hpp"
#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/models/checkpoint_model.hpp"
#include "megadsl/models/registry.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/runtime/hf_io.hpp"
#include "megadsl/runtime/lora_io.hpp"
#include "megadsl/runtime/parallel_model.hpp"

namespace megadsl::cli {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Set by the parent before it starts its ranks, so they know the checks were reported already.
constexpr const char* child_marker = "MEGADSL_CLI_CHILD";

}  // namespace

// ---- job, errors, progress ----------------------------------------------------------------------

job job_of(const options& o) {
  job j;
  // The fewest ranks the layout runs on: tp * cp * pp for the decoder's grid, etp * ep * pp for the
  // experts' (both are one dp replica's).
  const std::int64_t layout_ranks = std::lcm(o.l.tp.get() * o.l.cp.get() * o.l.pp.get(),
                                             expert_tp(o.l) * o.l.ep.get() * o.l.pp.get());
  if (auto e = dist_env::from_environment()) {
    j.launched = true;
    j.rank = e->rank;
    j.world = e->world;
    j.own_child = std::getenv(child_marker) != nullptr;
    if (o.ranks != 0 && o.ranks != j.world && !j.own_child)
      throw usage_error("megadsl " + o.command + ": --ranks " + std::to_string(o.ranks) + " but the launcher started " +
                        std::to_string(j.world) + " ranks (WORLD_SIZE); drop --ranks under torchrun/srun");
  } else {
    j.world = o.ranks != 0 ? o.ranks : layout_ranks;
  }
  return j;
}

int report_errors(std::ostream& err, bool print, const std::function<int()>& f) {
  auto say = [&](const char* what) {
    if (print) err << what << '\n' << std::flush;
  };
  try {
    return f();
  } catch (const usage_error& e) {
    say(e.what());
    return exit_usage;
  } catch (const config_error& e) {
    say(e.what());
    return exit_usage;
  } catch (const std::exception& e) {
    say(e.what());
    return exit_invalid;
  }
}

int run_job(const job& j, const std::vector<std::string>& argv, std::ostream& err,
            const std::function<int(distributed&)>& body) {
  if (!j.launched) {
    ::setenv(child_marker, "1", 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    // run_ranks re-reads --ranks from argv; it is j.world here (or the layout's fewest when absent).
    return run_ranks(static_cast<int>(argv.size()), args.data(), static_cast<int>(j.world),
                     [](distributed&) { return 0; });
  }
  // A rank: rank 0 speaks for the job; another rank adds its own line only for an error that is
  // not the same on every rank (checkpoint and input errors are: every rank reads the same files).
  const auto env = dist_env::from_environment();
  if (auto t = std::getenv("MEGADSL_THREADS")) at::set_num_threads(std::max(1, std::atoi(t)));
  else if (auto local = std::getenv("LOCAL_WORLD_SIZE"))
    at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / std::max(1, std::atoi(local))));
  try {
    distributed d(*env);
    return body(d);
  } catch (const std::exception& e) {
    if (j.rank == 0) err << e.what() << '\n';
    else if (dynamic_cast<const checkpoint_error*>(&e) == nullptr && dynamic_cast<const input_error*>(&e) == nullptr)
      err << "[rank " << j.rank << "] " << e.what() << '\n';
    err << std::flush;
    return exit_invalid;
  }
}

namespace {

// Bytes of `files` resident in memory (the page cache): how far a read of them has got.
std::pair<std::uint64_t, std::uint64_t> resident_bytes(const std::vector<fs::path>& files) {
  std::uint64_t resident = 0, total = 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  for (const fs::path& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && st.st_size > 0) {
      const auto size = static_cast<std::size_t>(st.st_size);
      void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
      if (p != MAP_FAILED) {
        std::vector<unsigned char> in((size + page - 1) / page);
        if (::mincore(p, size, in.data()) == 0) {
          for (unsigned char c : in) resident += (c & 1) ? static_cast<std::uint64_t>(page) : 0;
          total += size;
        }
        ::munmap(p, size);
      }
    }
    ::close(fd);
  }
  return {std::min(resident, total), total};
}

// A number as it was written, to 6 significant digits: 1e-45, not 0.000000.
std::string number_text(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%g", v);
  return b;
}

std::string seconds(double s) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f s", s);
  return b;
}

}  // namespace

struct progress::state {
  state(std::ostream& e, bool on) : err(e), enabled(on), tty(on && ::isatty(2) == 1) {}
  std::ostream& err;
  bool enabled, tty;
  std::string what;
  std::vector<fs::path> reading;
  std::chrono::steady_clock::time_point t0;
  std::mutex m;
  std::condition_variable cv;
  bool running = false;
  std::thread ticker;
  std::size_t last_width = 0;

  void draw(bool final, bool done = true) {  // under m
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::string line = what + " ... ";
    if (final) {
      line += (done ? "done (" : "failed (") + seconds(s) + ")";
    } else {
      line += seconds(s);
      if (!reading.empty()) {
        const auto [in, total] = resident_bytes(reading);
        if (total > 0) line += ", " + std::to_string(in * 100 / total) + "% of the files in memory";
      }
    }
    const std::size_t width = line.size();
    if (width < last_width) line += std::string(last_width - width, ' ');
    last_width = width;
    err << '\r' << line << (final ? "\n" : "") << std::flush;
  }
};

progress::progress(std::ostream& err, bool enabled)
    : s_(std::make_unique<state>(err, enabled)) {}

progress::~progress() { stop(false); }

void progress::start(std::string what, std::vector<fs::path> reading) {
  finish();
  if (!s_->enabled) return;
  s_->what = std::move(what);
  s_->reading = std::move(reading);
  s_->t0 = std::chrono::steady_clock::now();
  s_->running = true;
  if (!s_->tty) return;  // one plain line when it is done
  s_->last_width = 0;
  s_->ticker = std::thread([st = s_.get()] {
    std::unique_lock lock(st->m);
    while (st->running) {
      st->draw(false);
      st->cv.wait_for(lock, std::chrono::milliseconds(250));
    }
  });
}

void progress::finish() { stop(true); }

void progress::stop(bool done) {
  if (!s_->enabled || !s_->running) return;
  {
    std::lock_guard lock(s_->m);
    s_->running = false;
  }
  s_->cv.notify_all();
  if (s_->ticker.joinable()) s_->ticker.join();
  if (s_->tty) {
    std::lock_guard lock(s_->m);
    s_->draw(true, done);
  } else if (done) {
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - s_->t0).count();
    s_->err << s_->what << ": done (" << seconds(t) << ")" << std::endl;
  }
}

// ---- run -----------------------------------------------------------------------------------------

namespace {


// The output is a new file or replaces one that is neither the input nor inside the model's
// directory (its weights, config.json, tokenizer): a run never overwrites what it reads.
void check_output(const std::string& file, const std::string& input, const fs::path& model_dir) {
  const fs::path p(file);
  const std::string ext = p.extension().string();
  if (ext != ".json" && ext != ".safetensors")
    throw usage_error("megadsl run: --output " + file + ": the output is .json or .safetensors (by the extension)");
  const fs::path parent = p.has_parent_path() ? p.parent_path() : fs::path(".");
  std::error_code ec;
  if (!fs::is_directory(parent, ec))
    throw input_error("megadsl run: " + file + ": cannot write it, directory " + parent.string() + " does not exist");
  if (fs::is_directory(p, ec)) throw input_error("megadsl run: " + file + ": cannot write it, it is a directory");
  if (fs::exists(p, ec) && fs::exists(input, ec) && fs::equivalent(p, input, ec))
    throw usage_error("megadsl run: --output " + file + " is the input file " + input +
                      "; writing it would replace the batch: choose another output file");
  // The directory holding the output, resolved (symbolic links, ..) and compared with the model's
  // and its subdirectories; then, by inode, every file of the model directory (hard links).
  const fs::path where = fs::weakly_canonical(fs::absolute(parent, ec), ec);
  const fs::path model = fs::weakly_canonical(fs::absolute(model_dir, ec), ec);
  for (fs::path d = where; !d.empty(); d = d.parent_path()) {
    if (d == model)
      throw usage_error("megadsl run: --output " + file + " is inside the model directory " + model_dir.string() +
                        "; writing there could replace its weights or configuration: write the output elsewhere");
    if (d == d.parent_path()) break;
  }
  if (fs::exists(p, ec))
    for (const auto& e : fs::directory_iterator(model_dir, ec))
      if (e.is_regular_file(ec) && fs::equivalent(e.path(), p, ec))
        throw usage_error("megadsl run: --output " + file + " is " + e.path().string() +
                          " of the model (the same file); write the output elsewhere");
}

// Floats with 9 significant digits (every fp32 value reads back exactly); NaN and infinities as null.
void put_float(std::string& out, float v) {
  if (!std::isfinite(v)) {
    out += "null";
    return;
  }
  if (v == 0) {  // not "-0"
    out += "0";
    return;
  }
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", static_cast<double>(v));
  out += b;
}

// A (b, s) or (b, s, v) tensor as nested lists; rows of the outer dim on their own lines.
void put_tensor(std::string& out, const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const bool boolean = c.scalar_type() == at::kBool;
  const at::Tensor f = boolean ? c : c.to(at::kFloat);
  const std::int64_t b = c.size(0), s = c.size(1), v = c.dim() == 3 ? c.size(2) : 1;
  const float* fp = boolean ? nullptr : f.data_ptr<float>();
  const bool* bp = boolean ? c.data_ptr<bool>() : nullptr;
  out += "[";
  for (std::int64_t i = 0; i < b; ++i) {
    out += i ? ",\n  [" : "\n  [";
    for (std::int64_t j = 0; j < s; ++j) {
      if (j) out += ", ";
      if (c.dim() == 3) out += "[";
      for (std::int64_t k = 0; k < v; ++k) {
        if (k) out += ", ";
        const std::int64_t at = (i * s + j) * v + k;
        if (boolean) out += bp[at] ? "true" : "false";
        else put_float(out, fp[at]);
      }
      if (c.dim() == 3) out += "]";
    }
    out += "]";
  }
  out += "\n]";
}

void write_output(const std::string& file, const std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  if (fs::path(file).extension() == ".safetensors") {
    std::vector<std::pair<std::string, at::Tensor>> cpu;
    for (const auto& [n, t] : tensors) cpu.emplace_back(n, t.detach().cpu().contiguous());
    write_safetensors(file, cpu, {{"producer", "megadsl run"}});
    return;
  }
  std::string out = "{";
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    out += i ? ",\n\"" : "\n\"";
    out += tensors[i].first + "\": ";
    put_tensor(out, tensors[i].second.detach().cpu());
  }
  out += "\n}\n";
  write_file_atomically(file, out);
}

template <class Spec>
std::vector<std::pair<std::string, at::Tensor>> run_model(parallel_groups& groups, const shape& s, const options& o,
                                                        const fs::path& dir, const run_input& in, bool speak,
                                                        std::ostream& err) {
  progress bar(err, speak);
  model_options mo;
  mo.device = local_device(o.device == "cuda");
  if (o.compute == "bf16") mo.compute_dtype = at::kBFloat16;
  const hf_config cfg = read_hf_config(dir);
  mo.attention_window = cfg.attention_window;  // applied on its layers
  mo.dropout = cfg.dropout;                    // (forward passes apply none)
  parallel_model<Spec> model(groups, mo, s, o.l);
  bar.start("megadsl run: loading " + dir.string(), {});
  const hf_load_report report = load_hf(model, groups, dir);
  if (!o.lora_adapter.empty())  // this rank's shards of the adapter, applied in the forward
    model.attach_lora(load_peft_adapter(o.lora_adapter, model.config(), groups.me.tp, model.parameters(), report.names));
  bar.finish();
  if (speak)
    for (const std::string& n : report.notes) err << "note: " << n << '\n';
  // Data parallelism: each replica computes ceil(B / dp) rows (the batch padded with copies of its
  // last row to dp times that), and the outputs are gathered over the dp group.
  const std::int64_t rows = in.ids.size(0), dp = groups.dp->size(), dp_rank = groups.dp->rank();
  const std::int64_t per_replica = (rows + dp - 1) / dp;
  auto my_rows = [&](const at::Tensor& t) {
    at::Tensor all = t;
    if (per_replica * dp > rows)
      all = at::cat({t, t.narrow(0, rows - 1, 1).expand({per_replica * dp - rows, t.size(1)})}, 0);
    return all.narrow(0, dp_rank * per_replica, per_replica).contiguous();
  };
  bar.start("megadsl run: forward of " + std::to_string(per_replica) + " x " + std::to_string(in.ids.size(1)) +
            " tokens" + (dp > 1 ? " on each of " + std::to_string(dp) + " replicas" : ""));
  c10::NoGradGuard no_grad;
  model_output out = model.forward({.input_ids = my_rows(in.ids), .attention_mask = my_rows(in.mask)},
                                   {.temperature = o.temperature, .entropy = true, .return_logits = o.logits});
  for (at::Tensor* t : {&out.log_probs, &out.entropy, &out.logits, &out.values, &out.valid}) {
    if (!t->defined() || dp == 1) continue;
    const auto type = t->scalar_type();
    *t = groups.dp->all_gather(t->to(type == at::kBool ? at::kByte : type), 0).narrow(0, 0, rows).to(type);
  }
  bar.finish();
  // A non-finite output is an error, never a null in the file.
  for (const auto& [what, t] : {std::pair<const char*, at::Tensor>{"log_probs", out.log_probs}, {"entropy", out.entropy},
                                {"values", out.values}}) {
    if (!t.defined()) continue;
    const at::Tensor bad = at::isfinite(t.detach()).logical_not() & out.valid.to(at::kBool);
    if (!bad.any().item<bool>()) continue;
    const at::Tensor first = bad.nonzero()[0].cpu();
    throw std::runtime_error("megadsl run: " + std::string(what) + " is NaN or Inf at " +
                             std::to_string(bad.sum().item<std::int64_t>()) + " position(s), first (row " +
                             std::to_string(first[0].item<std::int64_t>()) + ", position " +
                             std::to_string(first[1].item<std::int64_t>()) + ")" +
                             (o.temperature < 1e-3 ? "; --temperature " + number_text(o.temperature) +
                                                         " overflows the logits: use a larger one"
                                                   : "; the weights or the input overflow fp32"));
  }
  if (o.head.actor) {
    std::vector<std::pair<std::string, at::Tensor>> r{{"log_probs", out.log_probs}, {"entropy", out.entropy}};
    if (o.logits) r.emplace_back("logits", out.logits);
    r.emplace_back("valid", out.valid.to(at::kBool));
    return r;
  }
  return {{"values", out.values}, {"valid", out.valid.to(at::kBool)}};
}

struct rules_violated {};  // printed already: exit 1

struct run_plan {
  shape s;
  fs::path dir;
  run_input input;
};

run_plan prepare(const options& o, const job& j, std::ostream& err) {
  if (find_preset(o.model) != nullptr && !fs::exists(o.model))
    throw usage_error("megadsl run: '" + o.model + "' is a preset, which has no weights; pass an HF model directory "
                      "(config.json and model.safetensors)");
  options checked = o;
  checked.facts.world = j.world;
  const model_arg m = load_model(checked);
  std::ostringstream said;  // notes on config.json, violated rules: once per job
  const bool ok = validate(m, checked, said);
  if (j.speaks()) err << said.str() << std::flush;
  if (!ok) throw rules_violated{};
  run_plan p;
  p.s = m.s;
  p.dir = fs::is_directory(o.model) ? fs::path(o.model) : fs::path(o.model).parent_path();
  // Weights present and readable, config.json's sizes describing them and fitting in this machine's
  // memory (every rank of a local launch is here), before any rank starts or allocates.
  const std::int64_t local_ranks = std::getenv("LOCAL_WORLD_SIZE") != nullptr ? local_world_size() : j.world;
  check_before_load(p.dir, m.s, o.l, o.head, 4, local_ranks);
  check_output(o.output, o.input, p.dir);
  p.input = read_input(o.input, m.s.vocab.get());
  return p;
}

}  // namespace

int cmd_run(const options& o, const std::vector<std::string>& argv, std::ostream& out, std::ostream& err) {
  job j;
  run_plan plan;
  if (int rc = report_errors(err, true, [&] {
        j = job_of(o);
        return 0;
      }))
    return rc;
  if (int rc = report_errors(err, j.speaks() || (!j.launched), [&] {
        try {
          plan = prepare(o, j, err);
        } catch (const rules_violated&) {
          return exit_invalid;
        }
        return 0;
      }))
    return rc;
  return run_job(j, argv, err, [&](distributed& d) {
    auto groups = parallel_groups::build(d, o.l);
    const bool speak = d.rank() == 0;
    std::vector<std::pair<std::string, at::Tensor>> result;
    result = with_checkpoint_model(o.head, [&](auto spec) {
      return run_model<typename decltype(spec)::type>(groups, plan.s, o, plan.dir, plan.input, speak, err);
    });
    if (d.rank() == 0) {
      write_output(o.output, result);
      std::string names;
      for (const auto& r : result) names += (names.empty() ? "" : ", ") + r.first;
      out << "megadsl run: wrote " << names << " to " << o.output << '\n' << std::flush;
    }
    return 0;
  });
}

}  // namespace megadsl::cli
