// How megadsl replaces a checkpoint directory, for both formats (HF and distributed): every
// writer writes into one fresh sibling directory `<target>.tmp-<token>`, which then takes the
// target's place in one rename (RENAME_EXCHANGE): a reader sees the old checkpoint or the new one,
// never a mix, and nothing of another layout survives. One writer at a time: a lock file beside
// the target (flock, released by the kernel when its holder dies). Internal to megadsl.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>

#include "megadsl/runtime/hf_io.hpp"  // refuse_target_over_source

namespace megadsl {

class comm_group;

void fsync_dir(const std::filesystem::path& dir);

// `staging` takes the place of `dir` (created when absent); the old checkpoint is removed.
void move_into_place(const std::filesystem::path& staging, const std::filesystem::path& dir);

// `<target>.tmp-<16 hex digits>`, the same on every rank of `group` (its rank 0 draws the token).
std::filesystem::path staging_name(const comm_group& group, const std::filesystem::path& target);

// Removes staging directories left by writers that were killed (call it holding `target`'s lock):
// `target`'s own, and those of any other target beside it whose lock no process holds (with that
// lock file).
void remove_stale_staging(const std::filesystem::path& target);

// While alive, a SIGTERM, SIGINT or SIGHUP removes `path` (a staging directory, recursively, or a
// lock file) before the signal takes its previous course (the default: the process ends by it).
// Every rank that writes into a staging directory holds one for it.
class cleanup_on_signal {
 public:
  cleanup_on_signal(const std::filesystem::path& path, bool directory);
  ~cleanup_on_signal();
  cleanup_on_signal(const cleanup_on_signal&) = delete;
  cleanup_on_signal& operator=(const cleanup_on_signal&) = delete;

 private:
  int slot_ = -1;
};

// Held while a checkpoint is written to `target`: `<target>.lock`, flock'ed, and removed when the
// write ends (or a stop signal arrives). Throws checkpoint_error naming the target when another
// process holds it.
class target_lock {
 public:
  explicit target_lock(const std::filesystem::path& target);
  ~target_lock();
  target_lock(const target_lock&) = delete;
  target_lock& operator=(const target_lock&) = delete;

 private:
  int fd_ = -1;
  std::filesystem::path path_;
  std::unique_ptr<cleanup_on_signal> cleanup_;
};

// Collective over `group`: returns when no rank has an error; otherwise every rank throws
// checkpoint_error, with its own message when it has one, else with that of the first rank that
// failed (naming it).
void agree(const comm_group& group, const std::string& error);

// One step of a save: `f` on this rank, then agree() over `group`. When any rank failed, the
// group's rank 0 removes `staging` and every rank throws.
void save_step(const comm_group& group, const std::filesystem::path& staging, const std::function<void()>& f);

}  // namespace megadsl
