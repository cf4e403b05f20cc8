// safetensors and HF checkpoint I/O: bit-exact round trips, sharding, atomic writes, and one test
// per defect of a hostile file, each checking the whole story of its message (file, tensor, what).
#include "../catch_torch.hpp"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "megadsl/io/atomic_file.hpp"
#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/io/safetensors.hpp"
#include "megadsl/models/registry.hpp"
#include "../../src/runtime/dist_metadata.hpp"

namespace fs = std::filesystem;
using namespace megadsl;
using tensor_list = std::vector<std::pair<std::string, at::Tensor>>;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("megadsl-io-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  fs::path operator/(const std::string& name) const { return path / name; }
};

// A file with a hand-written header: 8-byte little-endian length (the header's own unless given),
// then the header, then `data`.
void write_raw(const fs::path& p, const std::string& header, const std::string& data,
               std::uint64_t declared = UINT64_MAX) {
  const std::uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header << data;
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  const auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), static_cast<std::size_t>(ac.nbytes())) == 0;
}

std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// The exception is a checkpoint_error whose one-line message contains every piece.
struct mentions : Catch::MatcherBase<checkpoint_error> {
  std::vector<std::string> pieces;
  mentions(std::initializer_list<std::string> p) : pieces(p) {}
  bool match(const checkpoint_error& e) const override {
    const std::string m = e.what();
    if (m.find('\n') != std::string::npos) return false;
    for (const auto& p : pieces)
      if (m.find(p) == std::string::npos) return false;
    return true;
  }
  std::string describe() const override {
    std::string s = "is one line mentioning";
    for (const auto& p : pieces) s += " [" + p + "]";
    return s;
  }
};
#define CHECK_FAILS(expr, ...) CHECK_THROWS_MATCHES(expr, checkpoint_error, (mentions{__VA_ARGS__}))

tensor_list every_dtype() {
  at::manual_seed(7);
  auto f32 = at::randn({3, 5});
  f32[0][0] = std::numeric_limits<float>::quiet_NaN();
  f32[0][1] = -0.0f;
  f32[0][2] = std::numeric_limits<float>::infinity();
  return {
      {"f64", at::randn({2, 3}, at::kDouble)},
      {"f32", f32},
      {"f16", at::randn({7}).to(at::kHalf)},
      {"bf16", at::randn({4, 1, 3}).to(at::kBFloat16)},
      {"i64", at::randint(INT64_MIN, INT64_MAX, {5}, at::kLong)},
      {"i32", at::randint(INT32_MIN, INT32_MAX, {2, 2}, at::kInt)},
      {"i16", at::randint(-32768, 32767, {3}, at::kShort)},
      {"i8", at::randint(-128, 127, {9}, at::kChar)},
      {"u8", at::randint(0, 255, {2, 5}, at::kByte)},
      {"bool", at::randint(0, 2, {6}).to(at::kBool)},
  };
}

// A valid two-tensor file: "a" F32 (2,2) at [0,16), "b" F32 (2) at [16,24).
const std::string good_header =
    R"({"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";

}  // namespace

TEST_CASE("every dtype round-trips bit-exactly", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "all.safetensors";
  const tensor_list ts = every_dtype();
  write_safetensors(path, ts);
  const auto f = safetensors_file::open(path);
  REQUIRE(f.tensors().size() == ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    const auto& [name, t] = ts[i];
    INFO(name);
    CHECK(f.tensors()[i].name == name);  // written in the given order
    CHECK(f.tensors()[i].dtype == t.scalar_type());
    CHECK(f.tensors()[i].shape == t.sizes().vec());
    CHECK(bit_equal(f.view(name), t));
    CHECK(bit_equal(f.read(name), t));
  }
  CHECK(f.metadata().empty());
  CHECK(leftovers(dir.path).empty());
}

TEST_CASE("the file layout is the reference one", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "x.safetensors";
  write_safetensors(path, {{"w", at::arange(6, at::kFloat).reshape({2, 3})}, {"b", at::ones({2}, at::kHalf)}},
                    {{"format", "pt"}});
  const std::string bytes = read_all(path);
  std::uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  CHECK(n % 8 == 0);  // padded so the data section starts 8-byte aligned
  const std::string header = bytes.substr(8, n);
  CHECK(header.find_last_not_of(' ') + 1 >= n - 7);  // padding is spaces, fewer than 8
  CHECK(header.rfind(
            R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
            R"("b":{"dtype":"F16","shape":[2],"data_offsets":[24,28]}})",
            0) == 0);
  CHECK(bytes.size() == 8 + n + 28);
  float w[6];
  std::memcpy(w, bytes.data() + 8 + n, sizeof w);
  CHECK(w[5] == 5.0f);  // little-endian, row-major
}

TEST_CASE("empty tensors, 0-d scalars, metadata", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "edge.safetensors";
  const tensor_list ts = {{"empty", at::empty({0}, at::kFloat)},
                          {"empty2d", at::empty({3, 0}, at::kBFloat16)},
                          {"scalar", at::scalar_tensor(2.5, at::kDouble)},
                          {"int_scalar", at::scalar_tensor(-7, at::kLong)},
                          {"after", at::arange(4, at::kInt)}};
  const std::map<std::string, std::string> meta{{"format", "pt"}, {"note", "line\nbreak \"quoted\" ünïcode"}};
  write_safetensors(path, ts, meta);
  const auto f = safetensors_file::open(path);
  CHECK(f.metadata() == meta);
  CHECK(f.view("empty").sizes() == at::IntArrayRef{0});
  CHECK(f.view("empty2d").sizes() == at::IntArrayRef{3, 0});
  CHECK(f.view("empty2d").scalar_type() == at::kBFloat16);
  CHECK(f.view("scalar").dim() == 0);
  CHECK(f.view("scalar").item<double>() == 2.5);
  CHECK(f.view("int_scalar").item<std::int64_t>() == -7);
  CHECK(f.find("empty")->bytes() == 0);
  CHECK(bit_equal(f.view("after"), ts[4].second));
  CHECK(f.data_bytes() == 8 + 8 + 16);

  write_safetensors(dir / "none.safetensors", {});
  const auto none = safetensors_file::open(dir / "none.safetensors");
  CHECK(none.tensors().empty());
  CHECK(none.data_bytes() == 0);
}

TEST_CASE("views are zero-copy and outlive the file object", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "v.safetensors";
  const auto w = at::randn({64, 32});
  write_safetensors(path, {{"w", w}, {"non_contiguous", w.t()}});
  at::Tensor v, slice;
  {
    const auto f = safetensors_file::open(path);
    v = f.view("w");
    CHECK(v.data_ptr() == f.view("w").data_ptr());  // the same bytes of the mapping
    slice = f.view("w").narrow(0, 16, 16);
    CHECK(bit_equal(f.read("non_contiguous"), w.t().contiguous()));
    CHECK(f.read("w", at::kDouble).scalar_type() == at::kDouble);
    CHECK(at::equal(f.read("w", at::kDouble), w.to(at::kDouble)));
    auto copy = f.read("w");
    CHECK(copy.data_ptr() != v.data_ptr());
  }
  CHECK(bit_equal(v, w));  // the mapping lives while a view does
  CHECK(bit_equal(slice.clone(), w.narrow(0, 16, 16)));
}

TEST_CASE("read_slice copies what a tp rank holds", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "s.safetensors";
  const auto w = at::randn({8, 6, 4});
  write_safetensors(path, {{"w", w}, {"e", at::empty({0, 3})}});
  const auto f = safetensors_file::open(path);
  for (std::int64_t d = 0; d < 3; ++d) {
    const std::int64_t part = w.size(d) / 2;
    for (std::int64_t r = 0; r < 2; ++r) {
      const auto s = f.read_slice("w", d, r * part, part);
      CHECK(s.is_contiguous());
      CHECK(bit_equal(s, w.narrow(d, r * part, part).contiguous()));
    }
  }
  CHECK(f.read_slice("w", 1, 2, 3, at::kDouble).scalar_type() == at::kDouble);
  CHECK(f.read_slice("w", 0, 8, 0).numel() == 0);
  CHECK(f.read_slice("e", 1, 0, 3).numel() == 0);
  CHECK_THROWS_AS(f.read_slice("w", 3, 0, 1), std::out_of_range);
  CHECK_THROWS_WITH(f.read_slice("w", 0, 6, 4), Catch::Contains("tensor \"w\" of shape [8, 6, 4]: cannot take [6, 6 + 4) of dim 0"));
}

TEST_CASE("a missing tensor is named", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "m.safetensors";
  write_safetensors(path, {{"present", at::ones({1})}});
  const auto f = safetensors_file::open(path);
  CHECK(f.find("absent") == nullptr);
  CHECK_FAILS(f.view("absent"), path.string(), "tensor \"absent\"", "not in this file", "\"present\"");
}

TEST_CASE("the writer refuses what it cannot write", "[io][safetensors]") {
  temp_dir dir;
  const auto path = dir / "w.safetensors";
  CHECK_FAILS(write_safetensors(path, {{"x", at::ones({1})}, {"x", at::ones({1})}}), path.string(), "\"x\"", "twice");
  CHECK_FAILS(write_safetensors(path, {{"__metadata__", at::ones({1})}}), "reserved");
  CHECK_FAILS(write_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}}), path.string(), "tensor \"c\"",
              "ComplexFloat", "expected one of F64, F32");
  CHECK_FAILS(write_safetensors(path, {{"u", at::Tensor()}}), "tensor \"u\"", "undefined");
  CHECK(!fs::exists(path));
  CHECK(leftovers(dir.path).empty());
}

TEST_CASE("writes are atomic", "[io][safetensors][atomic]") {
  temp_dir dir;
  const auto path = dir / "a.safetensors";
  write_safetensors(path, {{"old", at::ones({4})}});
  CHECK(leftovers(dir.path).empty());

  SECTION("a failure while writing data keeps the old file and leaves no temporary") {
    const auto meta_tensor = at::empty({4}, at::TensorOptions().device(at::kMeta));  // has no data
    CHECK_FAILS(write_safetensors(path, {{"new", at::zeros({4})}, {"ghost", meta_tensor}}), path.string(),
                "tensor \"ghost\"", "cannot bring it to the CPU");
    CHECK(leftovers(dir.path).empty());
    CHECK(safetensors_file::open(path).find("old") != nullptr);
  }
  SECTION("a directory that does not exist") {
    const auto bad = dir / "no" / "such" / "x.safetensors";
    CHECK_FAILS(write_safetensors(bad, {{"x", at::ones({1})}}), bad.string(), "cannot create",
                "No such file or directory");
    CHECK(!fs::exists(dir / "no"));
  }
  SECTION("a parent that is a file") {
    const auto bad = dir / "a.safetensors" / "x.safetensors";
    CHECK_FAILS(write_safetensors(bad, {{"x", at::ones({1})}}), bad.string(), "Not a directory");
  }
  SECTION("the rename fails after the whole file was written") {
    fs::create_directories(dir / "occupied");
    fs::create_directories(dir / "occupied" / "keep");
    CHECK_FAILS(write_safetensors(dir / "occupied", {{"x", at::ones({1024})}}), (dir / "occupied").string(),
                "renaming");
    CHECK(leftovers(dir.path).empty());
    CHECK(fs::is_directory(dir / "occupied" / "keep"));
  }
  SECTION("write_file_atomically") {
    write_file_atomically(dir / "t.json", "{}\n");
    CHECK(read_all(dir / "t.json") == "{}\n");
    CHECK(leftovers(dir.path).empty());
  }
}

// ---- hostile files -------------------------------------------------------------------------------

TEST_CASE("defects of the framing", "[io][safetensors][corrupt]") {
  temp_dir dir;
  const auto p = dir / "bad.safetensors";
  const auto file = p.string();

  SECTION("shorter than 8 bytes") {
    write_text(p, "abc");
    CHECK_FAILS(safetensors_file::open(p), file, "file is 3 bytes", "expected at least 8");
    write_text(p, "");
    CHECK_FAILS(safetensors_file::open(p), file, "file is 0 bytes");
  }
  SECTION("header length beyond the file") {
    write_raw(p, good_header, std::string(24, '\0'), 4096);
    CHECK_THROWS_WITH(safetensors_file::open(p),
                      "megadsl: " + file + ": header length 4096 goes beyond the end of the file (" +
                          std::to_string(good_header.size() + 24) +
                          " bytes follow the 8-byte length); the file is truncated");
  }
  SECTION("header length above the 100 MB limit") {
    write_raw(p, "{}", "");
    fs::resize_file(p, 200'000'016);  // sparse: costs no disk
    std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
    const std::uint64_t n = 200'000'000;
    f.write(reinterpret_cast<const char*>(&n), 8);
    f.close();
    CHECK_FAILS(safetensors_file::open(p), file, "header length 200000000 is above the limit of 100000000 bytes");
  }
  SECTION("a text file is not safetensors") {
    write_text(p, "hello, world: this is not a checkpoint");
    CHECK_FAILS(safetensors_file::open(p), file, "goes beyond the end of the file", "or not safetensors");
  }
  SECTION("not a file") {
    CHECK_FAILS(safetensors_file::open(dir.path), dir.path.string(), "is not a regular file");
    CHECK_FAILS(safetensors_file::open(dir / "nope.safetensors"), "nope.safetensors", "cannot open",
                "No such file or directory");
  }
  SECTION("truncated data") {
    write_safetensors(p, {{"first", at::ones({4})}, {"last", at::ones({64})}});
    const auto full = fs::file_size(p);
    fs::resize_file(p, full - 10);
    CHECK_FAILS(safetensors_file::open(p), file, "tensor \"last\"", "end beyond the data section", "truncated");
  }
}

TEST_CASE("defects of the header", "[io][safetensors][corrupt]") {
  temp_dir dir;
  const auto p = dir / "bad.safetensors";
  const auto file = p.string();
  const std::string data(24, '\0');
  auto open_with = [&](const std::string& header, const std::string& d) {
    write_raw(p, header, d);
    return safetensors_file::open(p);
  };

  SECTION("the good header opens") {
    const auto f = open_with(good_header, data);
    CHECK(f.tensors().size() == 2);
    CHECK(f.view("a").sizes() == at::IntArrayRef{2, 2});
  }
  SECTION("invalid JSON") {
    CHECK_FAILS(open_with(R"({"a": {"dtype": "F32",)", data), file, "header is not valid JSON", "parse error");
    CHECK_FAILS(open_with("", data), file, "header is not valid JSON");
    CHECK_FAILS(open_with(good_header + "}", data), file, "header is not valid JSON");
    CHECK_FAILS(open_with("{\"a\": \"\xff\xfe\"}", data), file, "header is not valid JSON");  // bad UTF-8
  }
  SECTION("not an object") {
    CHECK_FAILS(open_with("[1, 2, 3]", data), file, "header is an array; expected a JSON object");
    CHECK_FAILS(open_with(R"({"a": 3})", data), file, "tensor \"a\"", "entry is a number", "expected {\"dtype\"");
    CHECK_FAILS(open_with(R"({"a": {"dtype": "F32", "shape": [1]}})", data), file, "tensor \"a\"",
                "entry has no \"data_offsets\"");
  }
  SECTION("unknown dtype") {
    CHECK_THROWS_WITH(
        open_with(R"({"w.0": {"dtype": "F8_E4M3", "shape": [4], "data_offsets": [0, 4]}})", data),
        "megadsl: " + file +
            ": tensor \"w.0\": unknown dtype \"F8_E4M3\"; expected one of F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL");
    CHECK_FAILS(open_with(R"({"w": {"dtype": 4, "shape": [4], "data_offsets": [0, 4]}})", data), "tensor \"w\"",
                "dtype is a number");
  }
  SECTION("negative, fractional and overflowing shapes") {
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}})", data), file,
                "tensor \"w\"", "shape [2, -3]: entry -3 is negative; expected non-negative integers");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 24]}})", data),
                "tensor \"w\"", "entry 2.5 is a number with a fraction or exponent, not an integer");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [9223372036854775808], "data_offsets": [0, 24]}})", data),
                "tensor \"w\"", "is too large");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 24]}})",
                          data),
                file, "tensor \"w\"", "shape [4294967296, 4294967296] of F32 overflows 64 bits");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": "4", "data_offsets": [0, 24]}})", data),
                "tensor \"w\"", "shape is a string");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 24]}})", data),
                "tensor \"w\"", "overflows 64 bits");  // 2^62 elements fit, their bytes do not
    // Counted in order as ATen does: a leading zero keeps the product empty, a trailing one does not.
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 0], "data_offsets": [0, 0]}})",
                          data),
                "tensor \"w\"", "overflows 64 bits");
    const auto f = open_with(
        R"({"z": {"dtype": "F32", "shape": [0, 4294967296, 4294967296], "data_offsets": [0, 0]}})", data);
    CHECK(f.view("z").numel() == 0);
  }
  SECTION("data_offsets that are not a pair") {
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [4]}})", data), file,
                "tensor \"w\"", "data_offsets [4] is not a pair; expected [begin, end]");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}})", data),
                "tensor \"w\"", "is not a pair");
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}})", data),
                "tensor \"w\"", "an offset is negative");
  }
  SECTION("begin after end") {
    CHECK_FAILS(open_with(R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", data), file,
                "tensor \"w\"", "data_offsets [8, 4] has begin > end");
  }
  SECTION("out-of-range offsets") {
    CHECK_THROWS_WITH(open_with(R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}})", data),
                      "megadsl: " + file +
                          ": tensor \"w\": data_offsets [16, 32] end beyond the data section of 24 bytes; the file "
                          "is truncated or the offsets are wrong");
    CHECK_FAILS(
        open_with(R"({"w": {"dtype": "U8", "shape": [2], "data_offsets": [18446744073709551615, 1]}})", data),
        "tensor \"w\"", "has begin > end");
  }
  SECTION("byte length that disagrees with shape x dtype") {
    CHECK_THROWS_WITH(open_with(R"({"w": {"dtype": "BF16", "shape": [2, 3], "data_offsets": [0, 16]}})", data),
                      "megadsl: " + file +
                          ": tensor \"w\": data_offsets [0, 16] hold 16 bytes but shape [2, 3] of BF16 needs 12");
    CHECK_FAILS(open_with(R"({"s": {"dtype": "F64", "shape": [], "data_offsets": [0, 4]}})", data),
                "tensor \"s\"", "hold 4 bytes but shape [] of F64 needs 8");
  }
  SECTION("overlapping tensors") {
    CHECK_THROWS_WITH(
        open_with(R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},)"
                  R"( "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}})",
                  data),
        "megadsl: " + file + ": tensors \"a\" [0, 16) and \"b\" [8, 24) overlap; expected disjoint byte ranges");
    CHECK_FAILS(open_with(R"({"big": {"dtype": "U8", "shape": [20], "data_offsets": [0, 20]},)"
                          R"( "inner": {"dtype": "U8", "shape": [2], "data_offsets": [4, 6]},)"
                          R"( "later": {"dtype": "U8", "shape": [2], "data_offsets": [18, 20]}})",
                          data),
                "\"big\" [0, 20) and \"inner\" [4, 6) overlap");
    // Empty tensors occupy nothing and may sit anywhere; gaps are allowed.
    const auto f = open_with(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},)"
                             R"( "e": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},)"
                             R"( "b": {"dtype": "F32", "shape": [2], "data_offsets": [16, 24]}})",
                             data);
    CHECK(f.tensors().size() == 3);
  }
  SECTION("__metadata__ must be a string->string map") {
    CHECK_FAILS(open_with(R"({"__metadata__": {"format": "pt", "step": 3}})", ""), file,
                "__metadata__ entry \"step\" is a number; expected a string->string map");
    CHECK_FAILS(open_with(R"({"__metadata__": ["pt"]})", ""), file, "__metadata__ is an array");
    CHECK(open_with(R"({"__metadata__": null})", "").metadata().empty());
  }
  SECTION("duplicate tensor names") {
    CHECK_FAILS(open_with(R"({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},)"
                          R"( "a": {"dtype": "U8", "shape": [1], "data_offsets": [1, 2]}})",
                          data),
                file, "header names \"a\" twice");
  }
  SECTION("a name with a line break stays on one line") {
    CHECK_FAILS(open_with(R"({"x\ny": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}})", data),
                R"(tensor "x\ny")", "unknown dtype");
  }
  SECTION("a BOOL byte other than 0 or 1") {
    std::string d(24, '\0');
    d[2] = 7;
    const auto f = open_with(R"({"mask": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}})", d);
    CHECK_FAILS(f.view("mask"), file, "tensor \"mask\"", "BOOL element 2 is byte 7; expected 0 or 1");
  }
}

TEST_CASE("data that is not aligned to its element size is copied, not misread", "[io][safetensors]") {
  temp_dir dir;
  const auto p = dir / "odd.safetensors";
  const float values[2] = {1.5f, -2.25f};
  std::string data(1, '\x7f');
  data.append(reinterpret_cast<const char*>(values), sizeof values);
  write_raw(p, R"({"b": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}, "f": {"dtype": "F32", "shape": [2], "data_offsets": [1, 9]}})", data);
  const auto f = safetensors_file::open(p);
  const auto v = f.view("f");
  CHECK(reinterpret_cast<std::uintptr_t>(v.data_ptr()) % 4 == 0);
  CHECK(v[0].item<float>() == 1.5f);
  CHECK(v[1].item<float>() == -2.25f);
  CHECK(f.view("b").item<std::uint8_t>() == 0x7f);
}

TEST_CASE("random damage never crashes the reader", "[io][safetensors][corrupt]") {
  temp_dir dir;
  const auto good = dir / "good.safetensors";
  write_safetensors(good, every_dtype(), {{"format", "pt"}});
  const std::string bytes = read_all(good);
  std::mt19937_64 rng(1234);
  const auto p = dir / "fuzz.safetensors";
  int opened = 0, rejected = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string b = bytes;
    switch (i % 3) {
      case 0:  // truncate anywhere
        b.resize(rng() % b.size());
        break;
      case 1:  // flip bytes, mostly in the header
        for (int k = 0; k < 1 + static_cast<int>(rng() % 4); ++k) b[rng() % std::min<std::size_t>(b.size(), 700)] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 2:  // replace a digit of the header (offsets, shapes, the length)
        for (std::size_t k = 0; k < 8; ++k) {
          const std::size_t at = rng() % std::min<std::size_t>(b.size(), 700);
          if (std::isdigit(static_cast<unsigned char>(b[at]))) {
            b[at] = static_cast<char>('0' + rng() % 10);
            break;
          }
        }
        break;
    }
    write_text(p, b);
    try {
      const auto f = safetensors_file::open(p);
      for (const auto& t : f.tensors()) {
        try {
          (void)f.view(t.name).clone();  // every byte readable
        } catch (const checkpoint_error&) {  // a corrupted BOOL byte
        }
      }
      ++opened;
    } catch (const checkpoint_error& e) {
      ++rejected;
      REQUIRE(std::string(e.what()).find('\n') == std::string::npos);
    }
  }
  CHECK(opened + rejected == 3000);
  CHECK(rejected >= 1000);  // every truncation at least
}

// ---- HF checkpoint directories -------------------------------------------------------------------

TEST_CASE("HF checkpoint: one file when it fits", "[io][hf]") {
  temp_dir dir;
  const tensor_list ts = {{"model.embed_tokens.weight", at::randn({10, 4})}, {"model.norm.weight", at::ones({4})}};
  write_hf_checkpoint(dir.path, ts);
  CHECK(fs::exists(dir / "model.safetensors"));
  CHECK(!fs::exists(dir / "model.safetensors.index.json"));
  const auto c = hf_checkpoint::open(dir.path);
  CHECK(!c.sharded());
  CHECK(c.names() == std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight"});
  CHECK(c.total_bytes() == 10 * 4 * 4 + 4 * 4);
  CHECK(c.dir() == dir.path);
  CHECK(c.file_of("model.norm.weight").metadata().at("format") == "pt");
  CHECK(bit_equal(c.view("model.embed_tokens.weight"), ts[0].second));
  CHECK(c.find("lm_head.weight") == nullptr);
  CHECK_FAILS(c.view("lm_head.weight"), dir.path.string(), "tensor \"lm_head.weight\"", "not in this checkpoint");
  CHECK(leftovers(dir.path).empty());
}

TEST_CASE("HF checkpoint: shards and index", "[io][hf]") {
  temp_dir dir;
  tensor_list ts;
  for (int i = 0; i < 5; ++i) ts.emplace_back("model.layers." + std::to_string(i) + ".w", at::randn({16, 16}));  // 1 KiB each
  ts.emplace_back("model.big", at::randn({1024}, at::kDouble));  // 8 KiB: alone in its shard
  ts.emplace_back("model.norm.weight", at::ones({16}, at::kBFloat16));
  write_hf_checkpoint(dir.path, ts, 2048);

  // [l0 l1] [l2 l3] [l4] [big] [norm]: a new shard when the next tensor would overflow 2 KiB.
  for (int i = 1; i <= 5; ++i) CHECK(fs::exists(dir / ("model-0000" + std::to_string(i) + "-of-00005.safetensors")));
  CHECK(!fs::exists(dir / "model.safetensors"));
  CHECK(leftovers(dir.path).empty());
  const std::string index = read_all(dir / "model.safetensors.index.json");
  CHECK(index.find(R"("total_size": 13344)") != std::string::npos);
  CHECK(index.find(R"("model.big": "model-00004-of-00005.safetensors")") != std::string::npos);
  CHECK(index.find(R"("model.layers.1.w": "model-00001-of-00005.safetensors")") != std::string::npos);

  const auto c = hf_checkpoint::open(dir.path);
  CHECK(c.sharded());
  CHECK(c.files().size() == 5);
  CHECK(c.names().size() == ts.size());
  CHECK(c.total_bytes() == 13344);
  for (const auto& [name, t] : ts) {
    INFO(name);
    CHECK(bit_equal(c.view(name), t));
  }
  CHECK(c.read("model.norm.weight", at::kFloat).scalar_type() == at::kFloat);
  CHECK(bit_equal(c.read_slice("model.big", 0, 256, 256, at::kDouble), ts[5].second.narrow(0, 256, 256)));

  SECTION("rewriting as one file removes the shards and the index") {
    write_hf_checkpoint(dir.path, {{"only", at::ones({2})}});
    std::vector<std::string> files;
    for (const auto& e : fs::directory_iterator(dir.path)) files.push_back(e.path().filename().string());
    CHECK(files == std::vector<std::string>{"model.safetensors"});
  }
  SECTION("rewriting with fewer shards removes the others; other files stay") {
    write_text(dir / "config.json", "{}");
    write_hf_checkpoint(dir.path, {{"a", at::ones({512})}, {"b", at::ones({512})}}, 2048);
    CHECK(fs::exists(dir / "model-00002-of-00002.safetensors"));
    CHECK(!fs::exists(dir / "model-00001-of-00005.safetensors"));
    CHECK(fs::exists(dir / "config.json"));
    CHECK(hf_checkpoint::open(dir.path).names() == std::vector<std::string>{"a", "b"});
  }
}

TEST_CASE("HF checkpoint: defects of a directory", "[io][hf][corrupt]") {
  temp_dir dir;
  const auto index = (dir / "model.safetensors.index.json").string();
  write_safetensors(dir / "model-00001-of-00002.safetensors", {{"a", at::ones({2})}, {"b", at::ones({2})}});

  SECTION("an index naming a missing shard") {
    write_text(dir / "model.safetensors.index.json",
               R"({"metadata": {"total_size": 24}, "weight_map": {"a": "model-00001-of-00002.safetensors",)"
               R"( "c": "model-00002-of-00002.safetensors"}})");
    CHECK_THROWS_WITH(hf_checkpoint::open(dir.path),
                      "megadsl: " + index +
                          ": weight_map names shard \"model-00002-of-00002.safetensors\" (for tensor \"c\") which is "
                          "missing from " + dir.path.string() + "; expected every shard the index names");
  }
  SECTION("an index naming a tensor its shard lacks") {
    write_text(dir / "model.safetensors.index.json",
               R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "z": "model-00001-of-00002.safetensors"}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), index, "tensor \"z\"", "model-00001-of-00002.safetensors",
                "which does not hold it");
  }
  SECTION("an index that is not JSON or has no weight_map") {
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": )");
    CHECK_FAILS(hf_checkpoint::open(dir.path), index, "index is not valid JSON");
    write_text(dir / "model.safetensors.index.json", R"({"metadata": {}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), index, "no \"weight_map\"");
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": 1}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), index, "tensor \"a\"", "not a file name");
  }
  SECTION("an index pointing outside the directory") {
    write_text(dir / "model.safetensors.index.json", R"({"weight_map": {"a": "../model-00001-of-00002.safetensors"}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), index, "tensor \"a\"", "not a file name inside the checkpoint directory");
  }
  SECTION("a corrupt shard is named") {
    const auto shard = dir / "model-00002-of-00002.safetensors";
    write_text(shard, "garbage");
    write_text(dir / "model.safetensors.index.json",
               R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), shard.string(), "file is 7 bytes");
  }
  SECTION("a tensor stored in two shards is refused, whichever copy the index names") {
    // transformers reads every tensor of every shard; the index names one copy. Which one wins
    // differs, so the checkpoint is refused (issue 23, item 6).
    write_safetensors(dir / "model-00002-of-00002.safetensors", {{"c", at::ones({2})}, {"a", at::full({2}, 9.0)}});
    write_text(dir / "model.safetensors.index.json",
               R"({"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",)"
               R"( "c": "model-00002-of-00002.safetensors"}})");
    CHECK_FAILS(hf_checkpoint::open(dir.path), dir.path.string(), "tensor \"a\" is stored in two shards",
                "\"model-00001-of-00002.safetensors\" (where model.safetensors.index.json puts it)",
                "\"model-00002-of-00002.safetensors\"", "remove one copy");
  }
  SECTION("a model.safetensors that is a symbolic link loop is named as such") {
    fs::remove(dir / "model-00001-of-00002.safetensors");
    fs::create_symlink(dir / "model.safetensors", dir / "model.safetensors");
    CHECK_FAILS(hf_checkpoint::open(dir.path), (dir / "model.safetensors").string(),
                "is a symbolic link that cannot be followed", "point it at the checkpoint's file");
    fs::remove(dir / "model.safetensors");
    fs::create_symlink(dir / "gone.safetensors", dir / "model.safetensors");
    CHECK_FAILS(hf_checkpoint::open(dir.path), "is a symbolic link that cannot be followed");
  }
  SECTION("no checkpoint at all") {
    fs::remove(dir / "model-00001-of-00002.safetensors");
    write_text(dir / "pytorch_model.bin", "");
    CHECK_FAILS(hf_checkpoint::open(dir.path), dir.path.string(),
                "holds neither model.safetensors nor model.safetensors.index.json", "convert them to safetensors");
    CHECK_FAILS(hf_checkpoint::open(dir / "nope"), "nope", "does not exist");
  }
  SECTION("an unwritable checkpoint directory") {
    write_text(dir / "file", "");
    CHECK_FAILS(write_hf_checkpoint(dir / "file" / "ckpt", {{"a", at::ones({1})}}), "cannot create the checkpoint directory");
  }
}

TEST_CASE("a distributed checkpoint's model reads the shape fields added since as the models written before them had them",
          "[io][dist_checkpoint]") {
  using megadsl::dist_metadata::fill_fields_added_later;
  const auto name = [](const megadsl::architecture& a) { return std::string(a.name); };
  const std::string llama = name(megadsl::architecture_of<megadsl::llama_blocks>);
  nlohmann::json before = {{"architecture", llama}};  // written before the multipliers existed
  fill_fields_added_later(before);
  CHECK((before.at("architecture") == llama && !before.contains("logit_scale") && !before.contains("settings")));
  // The flag's first name (GLM-4.5's q/k norms, 2026-11): read under its name now (a key of GLM-4.5's
  // layer choice since), never lost; Llama 4's field of that key, neutral there, does not override it.
  const std::string glm = name(megadsl::architecture_of<megadsl::glm4_moe_blocks>);
  nlohmann::json renamed = {{"architecture", glm}, {"qk_rms_norm", true}, {"qk_l2_norm", false}};
  fill_fields_added_later(renamed);
  CHECK(renamed.at("settings").at("use_qk_norm") == 1.0);
  CHECK_FALSE((renamed.contains("qk_rms_norm") || renamed.contains("use_qk_norm") || renamed.contains("qk_l2_norm")));
  nlohmann::json both = {{"architecture", name(megadsl::architecture_of<megadsl::cohere_blocks>)}, {"qk_rms_norm", false},
                         {"use_qk_norm", true}, {"logit_scale", 0.25}};
  fill_fields_added_later(both);
  CHECK((both.at("settings").at("use_qk_norm") == 1.0 && both.at("settings").at("logit_scale") == 0.25));
  // Llama 4's attention fields: its keys; the temperature tuning was off where attn_floor_scale was 0.
  const std::string llama4 = name(megadsl::architecture_of<megadsl::llama4_blocks>);
  nlohmann::json l4 = {{"architecture", llama4}, {"attention_chunk", 4}, {"qk_l2_norm", true}, {"use_qk_norm", false},
                       {"attn_floor_scale", 3.0}, {"attn_scale", 0.5}};
  fill_fields_added_later(l4);
  CHECK(l4.at("settings") == nlohmann::json({{"attention_chunk_size", 4}, {"use_qk_norm", 1.0}, {"attn_temperature_tuning", 1.0},
                                             {"floor_scale", 3.0}, {"attn_scale", 0.5}}));
  nlohmann::json untuned = {{"architecture", llama4}, {"attention_chunk", 4}, {"qk_l2_norm", false}, {"attn_floor_scale", 0.0},
                            {"attn_scale", 0.0}};
  fill_fields_added_later(untuned);
  CHECK(untuned.at("settings") == nlohmann::json({{"attention_chunk_size", 4}, {"use_qk_norm", 0.0}, {"attn_temperature_tuning", 0.0},
                                                  {"floor_scale", 8192.0}, {"attn_scale", 0.1}}));
  // A Granite checkpoint recorded Llama's composition with the multipliers as fields: read as Granite's.
  nlohmann::json granite = {{"architecture", llama}, {"embedding_multiplier", 3.0}, {"residual_multiplier", 0.5},
                            {"attention_multiplier", 0.2}, {"logits_scaling", 2.0}, {"logit_scale", 1.0}};
  fill_fields_added_later(granite);
  CHECK(granite.at("architecture") == name(megadsl::architecture_of<megadsl::granite_blocks>));
  CHECK(granite.at("settings") == nlohmann::json({{"embedding_multiplier", 3.0}, {"residual_multiplier", 0.5},
                                                  {"attention_multiplier", 0.2}, {"logits_scaling", 2.0}}));
  // MLA's sizes were shape fields: its block's keys now, the direct query's 0 (q_lora_rank null)
  // kept; a dense model's zero fields are dropped.
  const std::string deepseek = name(megadsl::architecture_of<megadsl::deepseek_v3_blocks>);
  // So were the routers' numbers (routed_scale, expert_groups, group_top_k; ERNIE's topk_sum_floor).
  nlohmann::json mla = {{"architecture", deepseek}, {"q_lora_rank", 0},  {"kv_lora_rank", 64},
                        {"qk_nope_dim", 32},         {"v_head_dim", 48}, {"rope_interleave", false},
                        {"routed_scale", 1.5},       {"expert_groups", 4}, {"group_top_k", 2}, {"topk_sum_floor", 0.0}};
  fill_fields_added_later(mla);
  CHECK(mla.at("settings") == nlohmann::json({{"q_lora_rank", 0}, {"kv_lora_rank", 64}, {"qk_nope_head_dim", 32}, {"v_head_dim", 48},
                                              {"routed_scaling_factor", 1.5}, {"n_group", 4}, {"topk_group", 2}}));
  CHECK((mla.at("rope_interleave") == false && !mla.contains("kv_lora_rank") && !mla.contains("routed_scale") &&
         !mla.contains("topk_sum_floor")));
  const std::string ernie = name(megadsl::architecture_of<megadsl::ernie4_5_moe_blocks>);
  nlohmann::json floored = {{"architecture", ernie}, {"topk_sum_floor", 1e-9}, {"routed_scale", 1.0}, {"expert_groups", 1},
                            {"group_top_k", 1}};
  fill_fields_added_later(floored);
  CHECK(floored.at("settings") == nlohmann::json({{"moe_norm_min", 1e-9}}));
  nlohmann::json dense = {{"architecture", llama}, {"q_lora_rank", 0}, {"kv_lora_rank", 0}, {"qk_nope_dim", 0}, {"v_head_dim", 0},
                          {"topk_sum_floor", 0.0}, {"routed_scale", 1.0}, {"expert_groups", 1}, {"group_top_k", 1}};
  fill_fields_added_later(dense);
  CHECK_FALSE((dense.contains("settings") || dense.contains("q_lora_rank") || dense.contains("v_head_dim") ||
               dense.contains("routed_scale") || dense.contains("expert_groups")));
}
