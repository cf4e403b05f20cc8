// Test helper for the CLI cases (not part of the product): compares tensors of two files, or
// copies some tensors of a file into a new one.
//
//   compare_tensors compare A B [--tol T] [--names n1,n2,...]
//       A, B: FILE.safetensors[:PREFIX] (tensors PREFIX<name>), FILE.json (megadsl run's output:
//       an object of nested lists), or an HF model directory (model.safetensors or an index).
//       Without --names both must hold the same names. --tol 0 (the default): same dtype, shape
//       and bytes; otherwise same shape and |a - b| <= T everywhere. Exit 0 when equal, 1 with
//       the first difference.
//   compare_tensors extract SRC.safetensors OUT.safetensors [--all] from:to[:scale] ...
//       --all: every tensor of SRC first; from:to:scale: tensor `from` times `scale`, named `to`.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "megadsl/io/hf_checkpoint.hpp"
#include "megadsl/io/safetensors.hpp"

namespace fs = std::filesystem;
using json = nlohmann::json;
using tensors = std::map<std::string, at::Tensor>;

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::cerr << "compare_tensors: " << what << '\n';
  std::exit(1);
}

// Nested lists of numbers or booleans -> a tensor (double or bool).
at::Tensor from_json(const json& j, const std::string& name) {
  std::vector<std::int64_t> shape;
  const json* p = &j;
  while (p->is_array()) {
    shape.push_back(static_cast<std::int64_t>(p->size()));
    if (p->empty()) break;
    p = &(*p)[0];
  }
  const bool boolean = p->is_boolean();
  std::vector<double> flat;
  std::function<void(const json&)> walk = [&](const json& v) {
    if (v.is_array())
      for (const json& e : v) walk(e);
    else if (v.is_boolean()) flat.push_back(v.get<bool>() ? 1 : 0);
    else if (v.is_null()) flat.push_back(std::nan(""));
    else if (v.is_number()) flat.push_back(v.get<double>());
    else fail(name + ": not a number: " + v.dump());
  };
  walk(j);
  std::int64_t n = 1;
  for (std::int64_t d : shape) n *= d;
  if (n != static_cast<std::int64_t>(flat.size())) fail(name + ": ragged nested lists");
  at::Tensor t = at::tensor(flat, at::kDouble).view(shape);
  return boolean ? t.to(at::kBool) : t;
}

tensors load(const std::string& spec) {
  std::string file = spec, prefix;
  if (auto colon = spec.rfind(':'); colon != std::string::npos && fs::exists(spec.substr(0, colon))) {
    file = spec.substr(0, colon);
    prefix = spec.substr(colon + 1);
  }
  tensors out;
  if (fs::is_directory(file)) {
    const megadsl::hf_checkpoint c = megadsl::hf_checkpoint::open(file);
    for (const std::string& n : c.names())
      if (n.starts_with(prefix)) out[n.substr(prefix.size())] = c.read(n, c.at(n).dtype);
  } else if (fs::path(file).extension() == ".json") {
    std::ifstream in(file);
    const json j = json::parse(in);
    for (auto it = j.begin(); it != j.end(); ++it)
      if (it.key().starts_with(prefix)) out[it.key().substr(prefix.size())] = from_json(it.value(), it.key());
  } else {
    const megadsl::safetensors_file f = megadsl::safetensors_file::open(file);
    for (const megadsl::tensor_info& t : f.tensors())
      if (t.name.starts_with(prefix)) out[t.name.substr(prefix.size())] = f.read(t.name);
  }
  return out;
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes();
  return s.str();
}

int compare(const std::string& a_spec, const std::string& b_spec, double tol, std::vector<std::string> names) {
  const tensors a = load(a_spec), b = load(b_spec);
  if (names.empty()) {
    for (const auto& [n, t] : a)
      if (!b.count(n)) fail(n + " is in " + a_spec + " but not in " + b_spec);
    for (const auto& [n, t] : b)
      if (!a.count(n)) fail(n + " is in " + b_spec + " but not in " + a_spec);
    for (const auto& [n, t] : a) names.push_back(n);
  }
  if (names.empty()) fail("no tensors to compare");
  for (const std::string& n : names) {
    if (!a.count(n)) fail(a_spec + " has no tensor " + n);
    if (!b.count(n)) fail(b_spec + " has no tensor " + n);
    const at::Tensor &x = a.at(n), &y = b.at(n);
    if (!x.sizes().equals(y.sizes())) fail(n + ": shape " + shape_of(x) + " vs " + shape_of(y));
    if (tol == 0) {
      if (x.scalar_type() != y.scalar_type())
        fail(n + ": dtype " + std::string(c10::toString(x.scalar_type())) + " vs " + c10::toString(y.scalar_type()));
      const at::Tensor xb = x.contiguous(), yb = y.contiguous();
      if (std::memcmp(xb.data_ptr(), yb.data_ptr(), xb.nbytes()) != 0) fail(n + ": the bytes differ");
    } else {
      const at::Tensor d = (x.to(at::kDouble) - y.to(at::kDouble)).abs();
      const double worst = d.numel() ? d.max().item<double>() : 0.0;
      if (!(worst <= tol)) {
        std::ostringstream s;
        s << n << ": max |a - b| = " << worst << " > " << tol;
        fail(s.str());
      }
      std::cout << n << ": max |a - b| = " << worst << " <= " << tol << '\n';
    }
  }
  std::cout << "compare_tensors: " << names.size() << " tensor(s) equal" << (tol == 0 ? " bit for bit" : "") << '\n';
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    if (args.size() >= 3 && args[0] == "compare") {
      double tol = 0;
      std::vector<std::string> names;
      for (std::size_t i = 3; i < args.size(); ++i) {
        if (args[i] == "--tol" && i + 1 < args.size()) tol = std::stod(args[++i]);
        else if (args[i] == "--names" && i + 1 < args.size()) {
          std::stringstream s(args[++i]);
          for (std::string n; std::getline(s, n, ',');) names.push_back(n);
        } else fail("unknown argument " + args[i]);
      }
      return compare(args[1], args[2], tol, names);
    }
    if (args.size() >= 4 && args[0] == "extract") {
      const megadsl::safetensors_file f = megadsl::safetensors_file::open(args[1]);
      std::vector<std::pair<std::string, at::Tensor>> out;
      for (std::size_t i = 3; i < args.size(); ++i) {
        if (args[i] == "--all") {  // every tensor of SRC under its own name
          for (const auto& t : f.tensors()) out.emplace_back(t.name, f.read(t.name));
          continue;
        }
        // from:to, or from:to:scale (the tensor times `scale`: a copy with other values)
        const auto colon = args[i].find(':');
        if (colon == std::string::npos) fail("extract wants from:to[:scale], got " + args[i]);
        const auto second = args[i].find(':', colon + 1);
        at::Tensor t = f.read(args[i].substr(0, colon));
        if (second != std::string::npos) t = (t * std::stod(args[i].substr(second + 1))).to(t.scalar_type());
        out.emplace_back(args[i].substr(colon + 1, second == std::string::npos ? std::string::npos : second - colon - 1), t);
      }
      megadsl::write_safetensors(args[2], out);
      return 0;
    }
  } catch (const std::exception& e) {
    fail(e.what());
  }
  std::cerr << "usage: compare_tensors compare A B [--tol T] [--names a,b] | extract SRC OUT [--all] from:to[:scale] ...\n";
  return 2;
}
