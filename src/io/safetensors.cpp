// safetensors reader and writer, and the atomic file they write through.
//
// The reader trusts nothing in the file: every size and offset is checked (with overflow-checked
// arithmetic) against the mapping before a tensor can point into it, and every defect is reported
// as one line naming the file, the tensor and what was expected.
#include "megadsl/io/safetensors.hpp"

#include "megadsl/io/printable.hpp"

#include <ATen/ATen.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <system_error>

#include "megadsl/io/atomic_file.hpp"

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian and is mapped as is; a big-endian host needs a byte swap");

namespace megadsl {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace detail {
struct file_mapping {
  const std::byte* data = nullptr;
  std::size_t size = 0;
  file_mapping(const std::byte* d, std::size_t n) : data(d), size(n) {}
  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;
  ~file_mapping() { ::munmap(const_cast<std::byte*>(data), size); }
};
}  // namespace detail

namespace {

constexpr std::uint64_t max_header_bytes = 100'000'000;  // the reference implementation's limit

struct dtype_row {
  std::string_view name;
  at::ScalarType type;
  std::uint64_t size;
};
constexpr dtype_row dtype_table[] = {
    {"F64", at::kDouble, 8}, {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2},  {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},   {"I32", at::kInt, 4},   {"I16", at::kShort, 2}, {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},    {"BOOL", at::kBool, 1},
};
constexpr std::string_view accepted_dtypes = "F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL";

std::uint64_t element_size(at::ScalarType t) {
  for (const auto& row : dtype_table)
    if (row.type == t) return row.size;
  return 0;
}

std::string errno_text(int err) { return std::system_category().message(err); }

// A name as JSON spells it: quoted, control characters escaped, so a message stays one line.
std::string quote(std::string_view s) {
  return json(std::string(s)).dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
}

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

// A bounded rendering of a JSON value for messages: scalars as written, arrays to one level and
// eight elements (never recursive, so a hostile nesting depth costs nothing).
std::string render(const json& v) {
  auto scalar = [](const json& x) -> std::string {
    if (x.is_array()) return "[...]";
    if (x.is_object()) return "{...}";
    std::string s = x.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
    return s.size() > 40 ? s.substr(0, 37) + "..." : s;
  };
  if (!v.is_array()) return scalar(v);
  std::string out = "[";
  std::size_t i = 0;
  for (const auto& x : v) {
    if (i) out += ", ";
    if (i++ == 8) {
      out += "...";
      break;
    }
    out += scalar(x);
  }
  return out + "]";
}

std::string kind(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::object: return "an object";
    case json::value_t::array: return "an array";
    case json::value_t::string: return "a string";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
    case json::value_t::number_float: return "a number";
    default: return "not a JSON value";
  }
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw checkpoint_error(one_line("megadsl: " + file.string() + ": " + what));
}
[[noreturn]] void fail(const fs::path& file, std::string_view tensor, const std::string& what) {
  fail(file, "tensor " + quote(tensor) + ": " + what);
}

struct fd_guard {
  int fd;
  ~fd_guard() {
    if (fd >= 0) ::close(fd);
  }
};

// A non-negative integer that fits `limit`, or the reason it is not one.
bool as_count(const json& v, std::uint64_t limit, std::uint64_t& out, std::string& why) {
  if (v.is_number_unsigned()) {
    out = v.get<std::uint64_t>();
    if (out <= limit) return true;
    why = "is too large";
    return false;
  }
  if (v.is_number_integer()) {  // signed in nlohmann only when negative
    why = "is negative";
    return false;
  }
  why = "is " + kind(v) + (v.is_number_float() ? " with a fraction or exponent" : "") + ", not an integer";
  return false;
}

tensor_info parse_entry(const fs::path& file, const std::string& name, const json& e,
                        std::uint64_t data_bytes) {
  const std::string expected_entry = R"(expected {"dtype": ..., "shape": [...], "data_offsets": [begin, end]})";
  if (!e.is_object()) fail(file, name, "entry is " + kind(e) + "; " + expected_entry);
  auto field = [&](const char* key) -> const json& {
    auto it = e.find(key);
    if (it == e.end()) fail(file, name, std::string("entry has no \"") + key + "\"; " + expected_entry);
    return *it;
  };
  tensor_info t;
  t.name = name;

  const json& dtype = field("dtype");
  if (!dtype.is_string()) fail(file, name, "dtype is " + kind(dtype) + "; expected one of " + std::string(accepted_dtypes));
  const auto parsed = parse_safetensors_dtype(dtype.get_ref<const std::string&>());
  if (!parsed) fail(file, name, "unknown dtype " + render(dtype) + "; expected one of " + std::string(accepted_dtypes));
  t.dtype = *parsed;
  const std::uint64_t esize = element_size(t.dtype);

  const json& shape = field("shape");
  if (!shape.is_array()) fail(file, name, "shape is " + kind(shape) + "; expected an array of non-negative integers");
  // Elements counted in order with a sticky overflow, then bytes: exactly the shapes ATen accepts
  // (it rejects [2^32, 2^32, 0] although that holds nothing, and accepts [0, 2^32, 2^32]).
  std::uint64_t numel = 1, bytes = 0;  // a 0-d tensor holds one element
  bool overflow = false;
  for (const json& d : shape) {
    std::uint64_t n = 0;
    std::string why;
    if (!as_count(d, static_cast<std::uint64_t>(INT64_MAX), n, why))
      fail(file, name, "shape " + render(shape) + ": entry " + render(d) + " " + why + "; expected non-negative integers");
    t.shape.push_back(static_cast<std::int64_t>(n));
    overflow = __builtin_mul_overflow(numel, n, &numel) || overflow;
  }
  overflow = __builtin_mul_overflow(numel, esize, &bytes) || overflow || bytes > static_cast<std::uint64_t>(INT64_MAX);
  if (overflow)
    fail(file, name, "shape " + shape_text(t.shape) + " of " + std::string(safetensors_dtype_name(t.dtype)) +
                         " overflows 64 bits (elements or bytes); expected a shape whose bytes fit the file");

  const json& off = field("data_offsets");
  if (!off.is_array() || off.size() != 2)
    fail(file, name, "data_offsets " + render(off) + " is not a pair; expected [begin, end]");
  std::string why;
  if (!as_count(off[0], UINT64_MAX, t.begin, why) || !as_count(off[1], UINT64_MAX, t.end, why))
    fail(file, name, "data_offsets " + render(off) + ": an offset " + why + "; expected non-negative integers");
  if (t.begin > t.end)
    fail(file, name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] has begin > end; expected begin <= end");
  if (t.end > data_bytes)
    fail(file, name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                         "] end beyond the data section of " + std::to_string(data_bytes) +
                         " bytes; the file is truncated or the offsets are wrong");
  if (t.end - t.begin != bytes)
    fail(file, name, "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] hold " +
                         std::to_string(t.end - t.begin) + " bytes but shape " + shape_text(t.shape) + " of " +
                         std::string(safetensors_dtype_name(t.dtype)) + " needs " + std::to_string(bytes));
  return t;
}

void check_disjoint(const fs::path& file, std::vector<tensor_info>& ts) {
  std::sort(ts.begin(), ts.end(), [](const tensor_info& a, const tensor_info& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const tensor_info* reach = nullptr;  // the non-empty tensor reaching furthest so far
  for (const auto& t : ts) {
    if (t.begin == t.end) continue;  // empty tensors occupy no bytes
    if (reach && t.begin < reach->end)
      fail(file, "tensors " + quote(reach->name) + " [" + std::to_string(reach->begin) + ", " +
                     std::to_string(reach->end) + ") and " + quote(t.name) + " [" + std::to_string(t.begin) +
                     ", " + std::to_string(t.end) + ") overlap; expected disjoint byte ranges");
    if (!reach || t.end > reach->end) reach = &t;
  }
}

}  // namespace

std::string_view safetensors_dtype_name(at::ScalarType t) {
  for (const auto& row : dtype_table)
    if (row.type == t) return row.name;
  return {};
}

std::optional<at::ScalarType> parse_safetensors_dtype(std::string_view name) {
  for (const auto& row : dtype_table)
    if (row.name == name) return row.type;
  return std::nullopt;
}

// ---- reader ------------------------------------------------------------------------------------

safetensors_file safetensors_file::open(const fs::path& path) {
  // O_NONBLOCK: a FIFO named like a checkpoint must not block the open; S_ISREG refuses it below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno) + "; expected a readable safetensors file");
  fd_guard guard{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) fail(path, "is not a regular file; expected a safetensors file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size < 8)
    fail(path, "file is " + std::to_string(size) +
                   " bytes, too short for safetensors; expected at least 8 (the header length), the file is truncated");

  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  if (addr == MAP_FAILED) fail(path, "cannot map " + std::to_string(size) + " bytes: " + errno_text(errno));
  auto map = std::make_shared<const detail::file_mapping>(static_cast<const std::byte*>(addr), size);

  std::uint64_t n = 0;
  std::memcpy(&n, map->data, 8);  // little-endian, as the format (static_assert above)
  if (n > size - 8)
    fail(path, "header length " + std::to_string(n) + " goes beyond the end of the file (" + std::to_string(size - 8) +
                   " bytes follow the 8-byte length); the file is truncated" +
                   (n > max_header_bytes ? " or not safetensors" : ""));
  if (n > max_header_bytes)
    fail(path, "header length " + std::to_string(n) + " is above the limit of " + std::to_string(max_header_bytes) +
                   " bytes; the file is corrupt or not safetensors");

  safetensors_file f;
  f.path_ = path;
  f.data_start_ = 8 + n;
  f.data_bytes_ = size - 8 - n;

  const char* text = reinterpret_cast<const char*>(map->data + 8);
  std::string duplicate;
  std::set<std::string> seen;
  json header;
  try {
    header = json::parse(text, text + n, [&](int depth, json::parse_event_t ev, json& parsed) {
      if (ev == json::parse_event_t::key && depth == 1 && duplicate.empty() &&
          !seen.insert(parsed.get<std::string>()).second)
        duplicate = parsed.get<std::string>();
      return true;
    });
  } catch (const json::exception& e) {
    fail(path, std::string("header is not valid JSON (") + printable(e.what(), 400) + "); expected a JSON object");
  }
  if (!header.is_object())
    fail(path, "header is " + kind(header) + "; expected a JSON object mapping tensor names to "
                                             R"({"dtype", "shape", "data_offsets"})");
  if (!duplicate.empty()) fail(path, "header names " + quote(duplicate) + " twice; expected unique tensor names");

  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (value.is_null()) continue;
      if (!value.is_object()) fail(path, "__metadata__ is " + kind(value) + "; expected a string->string map");
      for (const auto& [k, v] : value.items()) {
        if (!v.is_string())
          fail(path, "__metadata__ entry " + quote(k) + " is " + kind(v) + "; expected a string->string map");
        f.metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    f.tensors_.push_back(parse_entry(path, key, value, f.data_bytes_));
  }
  check_disjoint(path, f.tensors_);
  for (std::size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  f.map_ = std::move(map);
  return f;
}

const tensor_info* safetensors_file::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void safetensors_file::missing(std::string_view name) const {
  std::string some;
  for (std::size_t i = 0; i < tensors_.size() && i < 3; ++i) some += (i ? ", " : "") + quote(tensors_[i].name);
  fail(path_, name, "not in this file; it holds " + std::to_string(tensors_.size()) + " tensors" +
                        (tensors_.empty() ? "" : " (" + some + (tensors_.size() > 3 ? ", ...)" : ")")));
}

const tensor_info& safetensors_file::at(std::string_view name) const {
  const tensor_info* t = find(name);
  if (!t) missing(name);
  return *t;
}

std::uint64_t safetensors_file::file_bytes() const { return map_ ? map_->size : 0; }

at::Tensor safetensors_file::view(std::string_view name) const {
  const tensor_info& t = at(name);
  const auto options = at::TensorOptions().dtype(t.dtype).device(at::kCPU);
  // No elements: unit strides, since contiguous ones may overflow (shape [0, 2^32, 2^32]).
  if (t.bytes() == 0) return at::empty_strided(t.shape, std::vector<std::int64_t>(t.shape.size(), 1), options);
  const std::byte* p = map_->data + data_start_ + t.begin;
  if (t.dtype == at::kBool) {  // any byte but 0 and 1 would be undefined behaviour as a bool
    for (std::uint64_t i = 0; i < t.bytes(); ++i)
      if (static_cast<unsigned char>(p[i]) > 1)
        fail(path_, t.name, "BOOL element " + std::to_string(i) + " is byte " +
                                std::to_string(static_cast<unsigned>(p[i])) + "; expected 0 or 1");
  }
  if (reinterpret_cast<std::uintptr_t>(p) % element_size(t.dtype) != 0) {
    at::Tensor copy = at::empty(t.shape, options);
    std::memcpy(copy.data_ptr(), p, t.bytes());
    return copy;
  }
  // The deleter owns a reference to the mapping: the view keeps the file mapped.
  return at::from_blob(const_cast<std::byte*>(p), t.shape, [keep = map_](void*) {}, options);
}

void safetensors_file::advise(std::uint64_t begin, std::uint64_t end) const {
  if (begin >= end) return;
  static const std::uint64_t page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  const std::uint64_t first = (data_start_ + begin) / page * page, last = data_start_ + end;
  ::madvise(const_cast<std::byte*>(map_->data) + first, last - first, MADV_WILLNEED);
}

void safetensors_file::prefetch(std::string_view name) const {
  const tensor_info& t = at(name);
  advise(t.begin, t.end);
}

at::Tensor safetensors_file::read(std::string_view name, at::ScalarType to) const {
  prefetch(name);
  return view(name).to(to, /*non_blocking=*/false, /*copy=*/true);
}

at::Tensor safetensors_file::read(std::string_view name) const { return read(name, at(name).dtype); }

at::Tensor safetensors_file::read_slice(std::string_view name, std::int64_t dim, std::int64_t start,
                                        std::int64_t length, at::ScalarType to) const {
  const tensor_info& t = at(name);
  const auto rank = static_cast<std::int64_t>(t.shape.size());
  if (dim < 0 || dim >= rank || start < 0 || length < 0 || start > t.shape[dim] - length)
    throw std::out_of_range(one_line("megadsl: " + path_.string() + ": tensor " + quote(t.name) + " of shape " +
                                     shape_text(t.shape) + ": cannot take [" + std::to_string(start) + ", " +
                                     std::to_string(start) + " + " + std::to_string(length) + ") of dim " +
                                     std::to_string(dim)));
  // Row-major: the slice spans from its first element in the first outer block to its last
  // element in the last one. Sizes fit: they were checked against the file at open.
  std::uint64_t inner = element_size(t.dtype), outer = 1;
  for (std::int64_t d = dim + 1; d < rank; ++d) inner *= static_cast<std::uint64_t>(t.shape[d]);
  for (std::int64_t d = 0; d < dim; ++d) outer *= static_cast<std::uint64_t>(t.shape[d]);
  const auto size = static_cast<std::uint64_t>(t.shape[dim]);
  if (length > 0 && outer > 0 && inner > 0)
    advise(t.begin + static_cast<std::uint64_t>(start) * inner,
           t.begin + ((outer - 1) * size + static_cast<std::uint64_t>(start + length)) * inner);
  return view(name).narrow(dim, start, length).to(to, /*non_blocking=*/false, /*copy=*/true,
                                                  at::MemoryFormat::Contiguous);
}

at::Tensor safetensors_file::read_slice(std::string_view name, std::int64_t dim, std::int64_t start,
                                        std::int64_t length) const {
  return read_slice(name, dim, start, length, at(name).dtype);
}

// ---- writer ------------------------------------------------------------------------------------

void write_safetensors(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  auto bad_write = [&](const std::string& what) {
    throw checkpoint_error(one_line("megadsl: cannot write " + path.string() + ": " + what));
  };
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (const auto& [tensor_name, t] : tensors) {
    const std::string& name = tensor_name;  // a plain reference: clang 14 cannot capture a structured binding
    auto bad = [&](const std::string& what) { bad_write("tensor " + quote(name) + ": " + what); };
    if (name == "__metadata__") bad("the name is reserved for the metadata map");
    if (!names.insert(name).second) bad("appears twice; expected unique names");
    if (!t.defined()) bad("is an undefined tensor");
    if (t.layout() != at::kStrided) bad("is not a dense (strided) tensor");
    const std::uint64_t esize = element_size(t.scalar_type());
    if (esize == 0)
      bad("dtype " + std::string(c10::toString(t.scalar_type())) + " has no safetensors spelling; expected one of " +
          std::string(accepted_dtypes));
    const std::uint64_t bytes = static_cast<std::uint64_t>(t.numel()) * esize;
    header[name] = {{"dtype", std::string(safetensors_dtype_name(t.scalar_type()))},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {
    bad_write("a tensor name or metadata entry is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data section starts 8-byte aligned
  const std::uint64_t n = text.size();

  atomic_file out(path);
  out.write(&n, 8);
  out.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    if (t.numel() == 0) continue;
    at::Tensor c;
    try {
      c = t.detach().to(at::kCPU).contiguous();
    } catch (const c10::Error& e) {
      bad_write("tensor " + quote(name) + ": cannot bring it to the CPU (" + e.what_without_backtrace() + ")");
    }
    out.write(c.data_ptr(), static_cast<std::size_t>(c.numel()) * c.element_size());
  }
  out.commit();
}

// ---- atomic file -------------------------------------------------------------------------------

atomic_file::atomic_file(const fs::path& path) : path_(path), tmp_(path) {
  tmp_ += ".tmp." + std::to_string(::getpid());
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)  // nothing was created, so nothing to remove
    throw checkpoint_error(one_line("megadsl: cannot write " + path_.string() + ": cannot create " + tmp_.string() +
                                    ": " + errno_text(errno)));
}

atomic_file::~atomic_file() { discard(); }

void atomic_file::discard() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!committed_) ::unlink(tmp_.c_str());
  committed_ = true;  // nothing left to discard
}

void atomic_file::fail(std::string_view what, int err) {
  discard();
  throw checkpoint_error(one_line("megadsl: cannot write " + path_.string() + ": " + std::string(what) + ": " +
                                  errno_text(err)));
}

void atomic_file::write(const void* data, std::size_t bytes) {
  if (fd_ < 0) throw checkpoint_error("megadsl: cannot write " + path_.string() + ": the file is already closed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = ::write(fd_, p, std::min<std::size_t>(bytes, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) fail("writing " + tmp_.string(), errno);
    if (w == 0) fail("writing " + tmp_.string(), EIO);
    p += w;
    bytes -= static_cast<std::size_t>(w);
  }
}

void atomic_file::commit() {
  if (fd_ < 0) throw checkpoint_error("megadsl: cannot write " + path_.string() + ": the file is already closed");
  if (::fsync(fd_) != 0) fail("fsync of " + tmp_.string(), errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("closing " + tmp_.string(), errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) fail("renaming " + tmp_.string() + " over it", errno);
  committed_ = true;
  // Make the rename itself durable; file systems that cannot sync a directory lose nothing else.
  const fs::path dir = path_.has_parent_path() ? path_.parent_path() : fs::path(".");
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomically(const fs::path& path, std::string_view contents) {
  atomic_file f(path);
  f.write(contents.data(), contents.size());
  f.commit();
}

}  // namespace megadsl
