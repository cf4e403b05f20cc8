#include "checkpoint_dir.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

#include "megadsl/io/checkpoint_error.hpp"
#include "megadsl/parallel/comm.hpp"

namespace megadsl {

namespace fs = std::filesystem;

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

// `staging` takes the place of `dir`; the old checkpoint (if any) is removed afterwards.
void move_into_place(const fs::path& staging, const fs::path& dir) {
  auto fail = [&](const std::string& what, int err) {
    throw checkpoint_error("megadsl: cannot move the new checkpoint " + staging.string() + " to " + dir.string() +
                           ": " + what + ": " + std::strerror(err));
  };
  if (!fs::exists(dir)) {
    if (std::rename(staging.c_str(), dir.c_str()) != 0) fail("rename", errno);
  } else if (::renameat2(AT_FDCWD, staging.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    std::error_code ec;
    fs::remove_all(staging, ec);  // the old checkpoint, now under the staging name
  } else if (errno == EINVAL || errno == ENOSYS || errno == ENOTSUP) {
    fs::path old = staging;
    old += ".old";
    if (std::rename(dir.c_str(), old.c_str()) != 0) fail("rename of the old checkpoint", errno);
    if (std::rename(staging.c_str(), dir.c_str()) != 0) {
      const int err = errno;
      std::rename(old.c_str(), dir.c_str());
      fail("rename", err);
    }
    std::error_code ec;
    fs::remove_all(old, ec);
  } else {
    fail("renameat2 (exchange)", errno);
  }
  fsync_dir(dir.parent_path());
}

fs::path staging_name(const comm_group& group, const fs::path& target) {
  at::Tensor token = at::zeros({1}, at::kLong);
  if (group.rank() == 0) {
    std::random_device rd;
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    token[0] = static_cast<std::int64_t>(
        ((static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^ now ^ static_cast<std::uint64_t>(::getpid())) >> 1);
  }
  group.broadcast(token, 0);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(token.item<std::int64_t>()));
  fs::path staging = target;
  staging += std::string(".tmp-") + hex;
  return staging;
}

void remove_stale_staging(const fs::path& target) {
  std::error_code ec;
  const std::string prefix = target.filename().string() + ".tmp-";
  for (const auto& e : fs::directory_iterator(target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0 && e.is_directory(ec)) fs::remove_all(e.path(), ec);
}

target_lock::target_lock(const fs::path& target) {
  fs::path path = target;
  path += ".lock";
  std::error_code ec;
  fs::create_directories(target.parent_path().empty() ? fs::path(".") : target.parent_path(), ec);
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw checkpoint_error("megadsl: cannot write " + target.string() + ": cannot create its lock file " + path.string() +
                           ": " + std::strerror(errno));
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw checkpoint_error("megadsl: cannot write " + target.string() +
                           (err == EWOULDBLOCK ? ": another process is writing it (it holds " + path.string() +
                                                     "); wait for it to finish, or write elsewhere"
                                               : ": cannot lock " + path.string() + ": " + std::strerror(err)));
  }
}

target_lock::~target_lock() {
  if (fd_ >= 0) ::close(fd_);  // releases the flock
}

// Collective: returns when no rank has an error; otherwise every rank throws checkpoint_error, with
// its own message when it has one, else with that of the first rank that failed.
void agree(const comm_group& world, const std::string& error) {
  at::Tensor flag = at::full({1}, error.empty() ? 0 : 1, at::kLong);
  const at::Tensor flags = world.all_gather(flag, 0);  // (world)
  const auto failed = flags.nonzero();
  if (failed.numel() == 0) return;
  const int first = static_cast<int>(failed[0][0].item<std::int64_t>());
  at::Tensor length = at::full({1}, static_cast<std::int64_t>(error.size()), at::kLong);
  world.broadcast(length, first);
  at::Tensor text = at::zeros({std::max<std::int64_t>(1, length.item<std::int64_t>())}, at::kByte);
  if (world.rank() == first) std::memcpy(text.data_ptr(), error.data(), error.size());
  world.broadcast(text, first);
  if (!error.empty()) throw checkpoint_error(error);
  const std::string theirs(static_cast<const char*>(text.data_ptr()), static_cast<std::size_t>(length.item<std::int64_t>()));
  throw checkpoint_error(theirs + " [reported by rank " + std::to_string(world.ranks()[static_cast<std::size_t>(first)]) + "]");
}

void save_step(const comm_group& group, const fs::path& staging, const std::function<void()>& f) {
  std::string error;
  try {
    f();
  } catch (const std::exception& e) {
    error = e.what();
    std::replace(error.begin(), error.end(), '\n', ' ');
  }
  try {
    agree(group, error);
  } catch (...) {
    std::error_code ec;
    if (group.rank() == 0) fs::remove_all(staging, ec);
    throw;
  }
}

}  // namespace megadsl
