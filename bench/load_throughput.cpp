// How fast an HF checkpoint loads through hf_checkpoint, against a plain read() of the same bytes,
// and how much a tp-4 rank holds while it copies out only its slices (DESIGN §6: a rank reads only
// the byte ranges of its own slices).
//
//   bench_load_throughput [--mb N] [--shard-mb N] [--dir PATH] [--keep]   synthetic Llama-shaped bf16
//   bench_load_throughput --checkpoint DIR                                 an existing HF checkpoint
//
// Page cache: a freshly written file is in the page cache, and a second read of anything is. Each
// measurement runs "cold" (the files' pages dropped with posix_fadvise(DONTNEED) first; the table
// shows how much was still resident, measured with mincore) and then "warm" (run again at once).
// Dropping needs no privilege but only drops clean pages that no other process maps.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "megadsl/io/hf_checkpoint.hpp"

namespace fs = std::filesystem;
using namespace megadsl;

namespace {

constexpr double mib = 1024.0 * 1024.0;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// VmRSS / VmHWM of this process, in bytes.
std::uint64_t proc_status(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoull(line.substr(std::strlen(key) + 1)) * 1024;
  return 0;
}

// Restarts VmHWM from the current RSS (Linux >= 4.0); false when not allowed.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

std::vector<fs::path> checkpoint_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".safetensors") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::uint64_t total_size(const std::vector<fs::path>& files) {
  std::uint64_t n = 0;
  for (const auto& f : files) n += fs::file_size(f);
  return n;
}

// Bytes of the files that are in the page cache.
std::uint64_t resident_bytes(const std::vector<fs::path>& files) {
  const long page = ::sysconf(_SC_PAGESIZE);
  std::uint64_t resident = 0;
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    const std::size_t size = fs::file_size(f);
    if (fd < 0 || size == 0) continue;
    void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) continue;
    std::vector<unsigned char> vec((size + page - 1) / page);
    if (::mincore(p, size, vec.data()) == 0)
      for (unsigned char v : vec) resident += (v & 1) ? page : 0;
    ::munmap(p, size);
  }
  return resident;
}

// read_ahead_kb of the block device holding the temporary directory's file system, or "?".
std::string read_ahead_kb() {
  std::string best = "?";
  for (const auto& e : fs::directory_iterator("/sys/block", fs::directory_options::skip_permission_denied)) {
    std::ifstream in(e.path() / "queue" / "read_ahead_kb");
    std::string v;
    if (!(in >> v) || e.path().filename().string().rfind("loop", 0) == 0) continue;
    best = best == "?" ? v : best + "/" + v;
  }
  return best;
}

void drop_page_cache(const std::vector<fs::path>& files) {
  for (const auto& f : files) {
    const int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// How a tp rank splits an HF Llama tensor: column-parallel on dim 0, row-parallel (o_proj,
// down_proj) on dim 1, norms whole.
int split_dim(const std::string& name, const at::Tensor& t) {
  if (t.dim() < 2) return -1;
  if (name.find("o_proj") != std::string::npos || name.find("down_proj") != std::string::npos) return 1;
  return 0;
}

std::vector<std::pair<std::string, at::Tensor>> synthetic(std::int64_t target_mib, std::int64_t& layers) {
  // TinyLlama-1.1B's block: h 2048, 4 kv heads of 64, ffn 5632; bf16, 84 MiB a layer.
  const std::int64_t h = 2048, kv = 256, ffn = 5632;
  const double layer_mib = 2.0 * (2 * h * h + 2 * kv * h + 3 * ffn * h) / mib;
  layers = std::max<std::int64_t>(1, static_cast<std::int64_t>(target_mib / layer_mib + 0.5));
  std::vector<std::pair<std::string, at::Tensor>> ts;
  auto add = [&](const std::string& name, std::vector<std::int64_t> shape) {
    ts.emplace_back(name, at::randn(shape).to(at::kBFloat16));
  };
  for (std::int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {h, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "mlp.gate_proj.weight", {ffn, h});
    add(p + "mlp.up_proj.weight", {ffn, h});
    add(p + "mlp.down_proj.weight", {h, ffn});
  }
  add("model.norm.weight", {h});
  return ts;
}

struct row {
  std::string what, cache;
  double resident_before_pct, copied_mib, best_s, anon_mib, file_mib, peak_mib, read_mib;
};

void print(const std::vector<row>& rows, int reps) {
  std::printf("\n%-51s %-5s %8s %7s %8s %6s | %-20s %8s %10s\n", "", "", "resident", "copied", "best of", "MiB/s",
              "held at the end +MiB", "peak RSS", "page cache");
  std::printf("%-51s %-5s %8s %7s %6d s %6s | %9s %10s %8s %10s\n", "measurement", "cache", "before", "MiB", reps,
              "", "copies", "file pages", "+MiB", "+MiB read");
  for (const auto& r : rows)
    std::printf("%-51s %-5s %7.1f%% %7.1f %8.3f %6.0f | %9.1f %10.1f %8.1f %10.1f\n", r.what.c_str(),
                r.cache.c_str(), r.resident_before_pct, r.copied_mib, r.best_s, r.copied_mib / r.best_s, r.anon_mib,
                r.file_mib, r.peak_mib, r.read_mib);
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t target_mib = 512, shard_mib = 256;
  int reps = 3;
  fs::path dir;
  bool keep = false, existing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--mb") target_mib = std::stoll(value());
    else if (a == "--shard-mb") shard_mib = std::stoll(value());
    else if (a == "--dir") dir = value();
    else if (a == "--checkpoint") dir = value(), existing = true;
    else if (a == "--keep") keep = true;
    else if (a == "--reps") reps = std::max(1, std::stoi(value()));
    else {
      std::fprintf(stderr,
                   "usage: %s [--mb N (default 512)] [--shard-mb N (default 256)] [--reps N (default 3)]\n"
                   "          [--dir PATH] [--keep]\n"
                   "       %s --checkpoint HF_DIR [--reps N]\n",
                   argv[0], argv[0]);
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (dir.empty()) dir = fs::temp_directory_path() / ("megadsl-bench-load-" + std::to_string(::getpid()));

  // A fixed mmap threshold: every large tensor is its own mapping, returned to the system when
  // freed, so one run's copies do not stay resident in malloc's heap and hide the next run's.
  ::mallopt(M_MMAP_THRESHOLD, 1 << 20);
  std::printf("bench_load_throughput: %d ATen threads, page size %ld\n", at::get_num_threads(),
              ::sysconf(_SC_PAGESIZE));
  if (!existing) {
    std::int64_t layers = 0;
    auto tensors = synthetic(target_mib, layers);
    const auto t0 = std::chrono::steady_clock::now();
    write_hf_checkpoint(dir, tensors, static_cast<std::uint64_t>(shard_mib) << 20);
    const double s = seconds_since(t0);
    std::uint64_t bytes = 0;
    for (const auto& [n, t] : tensors) bytes += t.nbytes();
    std::printf("wrote a synthetic Llama-shaped bf16 checkpoint (%lld layer(s) of TinyLlama's block, %zu tensors, "
                "%.1f MiB) to %s in %.2f s (%.0f MiB/s, fsync included)\n",
                static_cast<long long>(layers), tensors.size(), bytes / mib, dir.c_str(), s, bytes / mib / s);
  }
  const auto files = checkpoint_files(dir);
  const double file_mib = total_size(files) / mib;
  std::printf("checkpoint: %zu file(s), %.1f MiB; %s\n", files.size(), file_mib,
              existing ? "an existing checkpoint, cache state unknown until measured"
                       : "just written, so its pages start in the page cache");
  std::printf("resident in the page cache now: %.1f%%\n", 100.0 * resident_bytes(files) / total_size(files));

  // Each body copies what it loads into tensors it keeps, calls hold() while it still holds
  // them and its mapping, and returns the bytes it copied.
  double anon_now = 0, file_now = 0;
  auto hold = [&] {
    anon_now = static_cast<double>(proc_status("RssAnon:"));
    file_now = static_cast<double>(proc_status("RssFile:"));
  };
  std::vector<row> rows;
  auto measure = [&](const std::string& what, const std::function<double()>& body) {
    for (const char* cache : {"cold", "warm"}) {
      row r{what, cache, 0, 0, 1e30, 0, 0, 0, 0};
      for (int rep = 0; rep < reps; ++rep) {
        if (std::string(cache) == "cold") drop_page_cache(files);
        const double before = static_cast<double>(resident_bytes(files));
        const double rss0 = static_cast<double>(proc_status("VmRSS:"));
        const double anon0 = static_cast<double>(proc_status("RssAnon:"));
        const double file0 = static_cast<double>(proc_status("RssFile:"));
        const bool peak_ok = reset_peak_rss();
        const auto t0 = std::chrono::steady_clock::now();
        const double copied = body();
        const double s = seconds_since(t0);
        const double after = static_cast<double>(resident_bytes(files));
        r.resident_before_pct = 100.0 * before / total_size(files);
        r.copied_mib = copied / mib;
        r.best_s = std::min(r.best_s, s);
        r.anon_mib = (anon_now - anon0) / mib;
        r.file_mib = (file_now - file0) / mib;
        r.peak_mib = peak_ok ? (static_cast<double>(proc_status("VmHWM:")) - rss0) / mib : -1;
        r.read_mib = std::max(0.0, after - before) / mib;
      }
      rows.push_back(r);
    }
  };

  measure("(a) read() every file sequentially, 8 MiB buffer", [&] {
    std::vector<char> buf(8 << 20);
    double n = 0;
    for (const auto& f : files) {
      const int fd = ::open(f.c_str(), O_RDONLY);
      for (ssize_t r; (r = ::read(fd, buf.data(), buf.size())) > 0;) n += r;
      ::close(fd);
    }
    hold();
    return n;
  });
  // The slices first: the whole-copy would leave its pages mapped in the peak.
  auto slices = [&](bool megatron, bool hinted) {
    return [&, megatron, hinted] {
      const auto ckpt = hf_checkpoint::open(dir);
      std::vector<at::Tensor> mine;
      double n = 0;
      for (const auto& name : ckpt.names()) {
        const at::Tensor v = ckpt.view(name);
        const int d = megatron ? split_dim(name, v) : (v.dim() ? 0 : -1);
        const std::int64_t len = d < 0 ? 0 : v.size(d) / 4;  // tp rank 0 of 4
        if (d < 0) mine.push_back(ckpt.read(name, v.scalar_type()));
        else if (hinted) mine.push_back(ckpt.read_slice(name, d, 0, len, v.scalar_type()));
        else mine.push_back(v.narrow(d, 0, len).clone(at::MemoryFormat::Contiguous));
        n += static_cast<double>(mine.back().nbytes());
      }
      hold();
      return n;
    };
  };
  measure("(c) tp-4 rank, read_slice: column dim 0, row dim 1", slices(true, true));
  measure("(c') tp-4 rank, read_slice: dim-0 quarter of all", slices(false, true));
  measure("(c'') as (c'), view().narrow().clone(), no hint", slices(false, false));
  measure("(b) hf_checkpoint: open + copy every tensor out", [&] {
    const auto ckpt = hf_checkpoint::open(dir);
    std::vector<at::Tensor> all;
    double n = 0;
    for (const auto& name : ckpt.names()) {
      all.push_back(ckpt.read(name, ckpt.at(name).dtype));
      n += static_cast<double>(all.back().nbytes());
    }
    hold();
    return n;
  });
  print(rows, reps);
  std::printf(
      "\nresident before: the files' bytes in the page cache when a run starts (cold: just after\n"
      "  posix_fadvise(DONTNEED) of every file; warm: nothing dropped, so the previous run's pages stay).\n"
      "  Cold means not in this kernel's page cache; on a VM the host may still cache the disk.\n"
      "best of N: the fastest of N runs (this machine is shared; the slower runs are noise, not I/O).\n"
      "held at the end: what the process holds once it has copied everything, before it lets go:\n"
      "  copies = RssAnon growth (the tensors it keeps), file pages = RssFile growth (checkpoint pages\n"
      "  mapped in by the copy). The checkpoint is %.1f MiB: a tp-4 rank holds about a quarter of it.\n"
      "peak RSS: VmHWM minus VmRSS before the run (VmHWM reset through /proc/self/clear_refs).\n"
      "page cache +MiB read: how much of the files entered the page cache in the run: what was read\n"
      "  from disk, readahead included.\n"
      "(c) row-parallel weights (o_proj, down_proj) split on dim 1 are strided: every page of them is\n"
      "  read although a quarter is copied; norms are copied whole. (c') copies the contiguous dim-0\n"
      "  quarter of every tensor; (c'') copies the same bytes through a plain view: on a cold cache each\n"
      "  page fault also reads the kernel's read-around (read_ahead_kb, %s KiB here).\n",
      file_mib, read_ahead_kb().c_str());

  if (!existing && !keep) fs::remove_all(dir);
  return 0;
}
