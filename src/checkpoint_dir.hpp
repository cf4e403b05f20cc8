// How megadsl replaces a checkpoint directory, for both formats (HF and distributed): every
// writer writes into one fresh sibling directory `<target>.tmp-<token>`, which then takes the
// target's place in one rename (RENAME_EXCHANGE): a reader sees the old checkpoint or the new one,
// never a mix, and nothing of another layout survives. One writer at a time: a lock file beside
// the target (flock, released by the kernel when its holder dies). Internal to megadsl.
#pragma once

#include <filesystem>
#include <functional>
#include <string>

namespace megadsl {

class comm_group;

void fsync_dir(const std::filesystem::path& dir);

// `staging` takes the place of `dir` (created when absent); the old checkpoint is removed.
void move_into_place(const std::filesystem::path& staging, const std::filesystem::path& dir);

// `<target>.tmp-<16 hex digits>`, the same on every rank of `group` (its rank 0 draws the token).
std::filesystem::path staging_name(const comm_group& group, const std::filesystem::path& target);

// Removes staging directories of `target` left by writers that were killed (call it holding the lock).
void remove_stale_staging(const std::filesystem::path& target);

// Held while a checkpoint is written to `target`: `<target>.lock`, flock'ed. Throws
// checkpoint_error naming the target when another process holds it.
class target_lock {
 public:
  explicit target_lock(const std::filesystem::path& target);
  ~target_lock();
  target_lock(const target_lock&) = delete;
  target_lock& operator=(const target_lock&) = delete;

 private:
  int fd_ = -1;
};

// Collective over `group`: returns when no rank has an error; otherwise every rank throws
// checkpoint_error, with its own message when it has one, else with that of the first rank that
// failed (naming it).
void agree(const comm_group& group, const std::string& error);

// One step of a save: `f` on this rank, then agree() over `group`. When any rank failed, the
// group's rank 0 removes `staging` and every rank throws.
void save_step(const comm_group& group, const std::filesystem::path& staging, const std::function<void()>& f);

}  // namespace megadsl
