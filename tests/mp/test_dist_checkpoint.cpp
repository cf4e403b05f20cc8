// Distributed checkpoints: saved under one layout, loaded under others with identical parameters,
// outputs and optimizer state; every corruption is a one-line error naming the file and the key;
// saving is all-or-nothing.
#include "../catch_torch.hpp"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <fstream>
#include <nlohmann/json.hpp>

#include "megadsl/io/safetensors.hpp"
#include "megadsl/runtime/dist_checkpoint.hpp"
#include "mp_support.hpp"

namespace megadsl::test {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Catch::Contains;

template <class M, layout L, bool Actor>
using spec_of = std::conditional_t<Actor, causal_lm<M, L>, value_model<M, L>>;

// A scratch directory with the same name on every rank (rank 0's pid), created by rank 0.
fs::path shared_root(const comm_group& world, std::string_view tag) {
  at::Tensor pid = at::full({1}, static_cast<std::int64_t>(::getpid()), at::kLong);
  world.broadcast(pid, 0);
  const fs::path root = fs::temp_directory_path() / ("megadsl-dcp-" + std::to_string(pid.item<std::int64_t>()) + "-" + std::string(tag));
  if (world.rank() == 0) {
    fs::remove_all(root);
    fs::create_directories(root);
  }
  world.barrier();
  return root;
}

// MEGADSL_KEEP_TEST_DIRS=1 keeps the checkpoints for inspection.
void remove_root(const comm_group& world, const fs::path& root) {
  world.barrier();
  if (world.rank() == 0 && std::getenv("MEGADSL_KEEP_TEST_DIRS") == nullptr) fs::remove_all(root);
}

// Every HF tensor of a model on every rank: gathered over tp, then broadcast by its owner (tp 0,
// dp 0 of the pipeline stage that holds it).
std::map<std::string, at::Tensor> all_hf(std::vector<named_parameter>& params, const runtime_config& c,
                                         const parallel_groups& g) {
  const auto mine = gather_hf_tensors(params, c, g.tp.get(), false);
  std::map<std::string, at::Tensor> out;
  const std::int64_t last = c.l.pp.get() - 1;
  for (const param_plan& p : plan_params(c.s, c.l, c.head)) {
    if (p.tied) continue;
    const std::int64_t count = p.row->where == placement::layer ? c.s.layers.get() : 1;
    for (std::int64_t layer = 0; layer < count; ++layer) {
      const std::int64_t stage = p.row->where == placement::first_stage ? 0
                                 : p.row->where == placement::last_stage ? last
                                                                         : place_of_layer(c.s, c.l, layer).pp_rank;
      const std::int64_t owner = g.grid.rank_of({.tp = 0, .cp = 0, .dp = 0, .pp = stage});
      for (int i = 0; i < p.row->hf_count; ++i) {
        const std::string name = with_layer(p.row->hf[static_cast<std::size_t>(i)], layer);
        const dims& d = p.hf_shapes[static_cast<std::size_t>(i)];
        at::Tensor t = owner == dist().rank() ? mine.at(name).contiguous().clone()
                                              : at::empty(d.rank == 1 ? std::vector<std::int64_t>{d.rows}
                                                                      : std::vector<std::int64_t>{d.rows, d.cols});
        g.world->broadcast(t, static_cast<int>(owner));
        out[name] = t;
      }
    }
  }
  return out;
}

// The learning rate depends on the samples seen, so a lost sample counter changes the next step.
optimizer_config train_config() {
  optimizer_config o{.lr = 1e-4, .weight_decay = 0.01, .clip_grad = 1.0};
  o.lr_at = [](std::int64_t samples) { return 1e-4 * (1.0 + static_cast<double>(samples) / 16.0); };
  return o;
}
constexpr actor_loss_config loss_config{.clip_ratio = 0.2, .entropy_coeff = 0.01, .kl_coeff = 0.05};
constexpr std::int64_t microbatches = 2;  // 8 rows: dp 1 or 2, and a multiple of pp for vpp

// What the saving model had and would do next.
struct reference {
  std::map<std::string, at::Tensor> saved, continued;  // parameters at the save, one step later
  model_output outputs;                                // at the save
  std::int64_t steps = 0, samples = 0;
};

template <class M, layout L, bool Actor>
void check_load(const fs::path& dir, const reference& ref) {
  INFO(M::name << (Actor ? " actor" : " critic") << " loaded at tp=" << L.tp.get() << " pp=" << L.pp.get()
               << " vpp=" << L.vpp.get() << " sp=" << L.sp.get() << " rmpad=" << L.rmpad.get());
  auto groups = parallel_groups::build(dist(), L);
  parallel_model<spec_of<M, L, Actor>> model(groups, {.seed = 99, .test_init = true});  // other weights
  trainer t = make_trainer(model, groups, train_config(), loss_config);
  load_distributed(model, groups, dir, &t);

  const auto got = all_hf(model.parameters(), model.config(), groups);
  REQUIRE(got.size() == ref.saved.size());
  for (const auto& [name, value] : ref.saved) {
    INFO("parameter " << name);
    REQUIRE(got.count(name) == 1);
    CHECK(at::equal(got.at(name), value));
  }
  const padded_batch pb = make_batch(M::shape.vocab, true);
  const model_output out = model.forward({.input_ids = pb.ids, .attention_mask = pb.mask});
  if constexpr (Actor) {
    CHECK(max_abs_diff(out.log_probs, ref.outputs.log_probs) <= 1e-5);
    CHECK(max_abs_diff(out.entropy, ref.outputs.entropy) <= 1e-5);
  } else {
    CHECK(max_abs_diff(out.values, ref.outputs.values) <= 1e-5);
  }

  // Counters and AdamW's moments came along: one more step lands where the saving model's did.
  CHECK(t.steps_done() == ref.steps);
  CHECK(t.samples_done() == ref.samples);
  t.step(make_rollout(M::shape.vocab), microbatches);
  const auto next = all_hf(model.parameters(), model.config(), groups);
  double worst = 0, moved = 0;
  for (const auto& [name, value] : ref.continued) {
    worst = std::max(worst, max_abs_diff(next.at(name), value));
    moved = std::max(moved, max_abs_diff(ref.saved.at(name), value));
  }
  INFO("largest difference after one more step " << worst << ", largest change by that step " << moved);
  CHECK(worst <= 1e-5);
  CHECK(moved > 1e-4);
}

// Train two steps under layout S, save, then load under each of Loads.
template <class M, bool Actor, layout S, layout... Loads>
void check_reshard(const fs::path& root) {
  auto groups = parallel_groups::build(dist(), S);
  parallel_model<spec_of<M, S, Actor>> model(groups, {.test_init = true});
  trainer t = make_trainer(model, groups, train_config(), loss_config);
  const rollout_batch rb = make_rollout(M::shape.vocab);
  t.step(rb, microbatches);
  t.step(rb, microbatches);
  const fs::path dir = root / (std::string(M::name) + (Actor ? "-actor" : "-critic") + "-tp" + std::to_string(S.tp.get()) +
                        "-pp" + std::to_string(S.pp.get()));
  save_distributed(model, groups, dir, &t);

  reference ref;
  ref.saved = all_hf(model.parameters(), model.config(), groups);
  const padded_batch pb = make_batch(M::shape.vocab, true);
  ref.outputs = model.forward({.input_ids = pb.ids, .attention_mask = pb.mask});
  ref.steps = t.steps_done();
  ref.samples = t.samples_done();
  t.step(rb, microbatches);
  ref.continued = all_hf(model.parameters(), model.config(), groups);
  (check_load<M, Loads, Actor>(dir, ref), ...);
}

constexpr layout tp2_pp2{.tp = 2, .pp = 2};
constexpr layout tp1_pp4{.pp = 4};
constexpr layout tp4_pp1{.tp = 4};
constexpr layout tp2_sp_rmpad{.tp = 2, .sp = true, .rmpad = true};
constexpr layout pp2_vpp2{.pp = 2, .vpp = 2};

}  // namespace

TEST_CASE("a distributed checkpoint saved at tp 2 x pp 2 loads at any layout: same parameters, outputs and optimizer state",
          "[world4][dist_checkpoint]") {
  REQUIRE(dist().world() == 4);
  auto world = parallel_groups::build(dist(), {});
  const fs::path root = shared_root(*world.world, "reshard");
  check_reshard<tiny8, true, tp2_pp2, tp1_pp4, tp4_pp1, tp2_sp_rmpad, pp2_vpp2>(root);
  check_reshard<tiny8_tied, true, tp2_pp2, tp1_pp4, tp4_pp1, tp2_sp_rmpad, pp2_vpp2>(root);
  check_reshard<tiny8, false, tp2_pp2, tp1_pp4, tp4_pp1, tp2_sp_rmpad, pp2_vpp2>(root);
  check_reshard<tiny8_tied, false, tp2_pp2, tp1_pp4, tp4_pp1, tp2_sp_rmpad, pp2_vpp2>(root);
  // Saved at tp 4: kv heads replicated over two ranks are written once, by their main replica.
  check_reshard<tiny8_tied, true, tp4_pp1, tp2_pp2, pp2_vpp2>(root);
  // ... and Command R+'s k norm weight per kv head with them (and its q norm's split with the heads).
  check_reshard<tiny8_cohere_plus, true, tp4_pp1, tp2_pp2>(root);
  // Saved at dp 2: only dp rank 0 writes.
  check_reshard<tiny8, false, tp2_sp_rmpad, tp1_pp4>(root);
  remove_root(*world.world, root);
}

namespace {

// 4 layers instead of 8: a model of another shape.
struct tiny4 : llama<shape{.hidden = 128, .layers = 4, .heads = 4, .kv_heads = 2, .ffn = 352,
                           .vocab = 500, .max_positions = 256}> {
  static constexpr std::string_view name = "tiny4";
};

template <class Model>
std::string load_error(Model& model, const parallel_groups& g, const fs::path& dir) {
  try {
    load_distributed(model, g, dir);
  } catch (const checkpoint_error& e) {
    return e.what();
  }
  return "(no error)";
}

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}
void write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

}  // namespace

TEST_CASE("a damaged distributed checkpoint is a one-line error naming the file and the key", "[world4][dist_checkpoint]") {
  REQUIRE(dist().world() == 4);
  auto saver = parallel_groups::build(dist(), tp2_pp2);
  const comm_group& world = *saver.world;
  const fs::path root = shared_root(world, "damaged");
  const fs::path good = root / "good";
  {
    parallel_model<causal_lm<tiny8, tp2_pp2>> model(saver, {.test_init = true});
    save_distributed(model, saver, good);
  }
  auto groups = parallel_groups::build(dist(), tp1_pp4);
  parallel_model<causal_lm<tiny8, tp1_pp4>> model(groups, {.seed = 5, .test_init = true});
  REQUIRE(load_error(model, groups, good) == "(no error)");
  const auto before = all_hf(model.parameters(), model.config(), groups);

  // A copy of the good checkpoint, changed by `edit` on rank 0.
  auto damaged = [&](const std::string& name, const std::function<void(const fs::path&)>& edit) {
    const fs::path dir = root / name;
    if (world.rank() == 0) {
      fs::copy(good, dir, fs::copy_options::recursive);
      edit(dir);
    }
    world.barrier();
    return dir;
  };
  auto first_key = [](const fs::path& file) { return safetensors_file::open(file).tensors().front().name; };
  const std::string rank1_key = first_key(good / "rank_1.safetensors");
  const std::string rank3_key = first_key(good / "rank_3.safetensors");
  const std::string rank2_key = safetensors_file::open(good / "rank_2.safetensors").tensors().at(3).name;
  auto one_line = [](const std::string& m) {
    if (std::getenv("MEGADSL_SHOW_ERRORS") != nullptr && dist().rank() == 0) std::cout << m << "\n";
    return m.find('\n') == std::string::npos;
  };

  {
    const std::string e = load_error(model, groups, damaged("missing-file", [](const fs::path& d) { fs::remove(d / "rank_1.safetensors"); }));
    CHECK_THAT(e, Contains("rank_1.safetensors is missing") && Contains(rank1_key));
    CHECK(one_line(e));
  }
  {
    const std::string e = load_error(model, groups, damaged("flipped-byte", [&](const fs::path& d) {
      const fs::path f = d / "rank_2.safetensors";
      const auto file = safetensors_file::open(f);
      const tensor_info& t = file.at(rank2_key);
      const std::uint64_t at = file.file_bytes() - file.data_bytes() + t.begin + 5;
      std::fstream io(f, std::ios::in | std::ios::out | std::ios::binary);
      io.seekg(static_cast<std::streamoff>(at));
      char c = 0;
      io.read(&c, 1);
      c = static_cast<char>(c ^ 0x10);
      io.seekp(static_cast<std::streamoff>(at));
      io.write(&c, 1);
    }));
    CHECK_THAT(e, Contains("rank_2.safetensors") && Contains("piece " + rank2_key + " fails its checksum"));
    CHECK(one_line(e));
  }
  {
    const std::string e = load_error(model, groups, damaged("truncated", [](const fs::path& d) {
      const fs::path f = d / "rank_3.safetensors";
      fs::resize_file(f, fs::file_size(f) / 2);
    }));
    CHECK_THAT(e, Contains("rank_3.safetensors") && Contains("truncated") && Contains(rank3_key));
    CHECK(one_line(e));
  }
  {
    const std::string e = load_error(model, groups, damaged("no-metadata", [](const fs::path& d) { fs::remove(d / "metadata.json"); }));
    CHECK_THAT(e, Contains("metadata.json is missing"));
    CHECK(one_line(e));
  }
  {
    const std::string e = load_error(model, groups, damaged("bad-metadata", [](const fs::path& d) { write_text(d / "metadata.json", "{\"format\": "); }));
    CHECK_THAT(e, Contains("metadata.json is corrupt"));
    CHECK(one_line(e));
  }
  {
    // A number where an integer belongs (found by fuzz_dist_metadata: nlohmann converted 1.76e86
    // to a long with undefined behaviour) and a negative offset are refused with their field.
    const std::string e = load_error(model, groups, damaged("float-bytes", [&](const fs::path& d) {
      json m = read_json(d / "metadata.json");
      m["files"][1]["bytes"] = 1.76e86;
      write_text(d / "metadata.json", m.dump(1));
    }));
    CHECK_THAT(e, Contains("metadata.json is corrupt") && Contains("\"bytes\" is number with a fraction or exponent, not an integer"));
    CHECK(one_line(e));
    const std::string e2 = load_error(model, groups, damaged("negative-offset", [&](const fs::path& d) {
      json m = read_json(d / "metadata.json");
      m["files"][0]["pieces"][0]["global_offset"][0] = -1;
      write_text(d / "metadata.json", m.dump(1));
    }));
    CHECK_THAT(e2, Contains("outside its tensor's shape"));
    CHECK(one_line(e2));
  }
  std::string removed;
  {
    const std::string e = load_error(model, groups, damaged("gap", [&](const fs::path& d) {
      json m = read_json(d / "metadata.json");
      auto& pieces = m["files"][3]["pieces"];
      for (std::size_t i = 0; i < pieces.size(); ++i)
        if (pieces[i]["tensor"] == "model.layers.5.self_attn.q_proj.weight") {
          pieces.erase(i);
          break;
        }
      write_text(d / "metadata.json", m.dump(1));
    }));
    // tp rank 1 of the second stage held the upper half of layer 5's query rows.
    CHECK_THAT(e, Contains("tensor model.layers.5.self_attn.q_proj.weight (128, 128): elements [64, 128) x [0, 128) are in no saved piece"));
    CHECK(one_line(e));
  }
  {
    const std::string e = load_error(model, groups, damaged("overlap", [&](const fs::path& d) {
      json m = read_json(d / "metadata.json");
      json copy = m["files"][0]["pieces"][0];
      copy["key"] = copy["key"].get<std::string>() + "#again";
      m["files"][2]["pieces"].push_back(copy);
      write_text(d / "metadata.json", m.dump(1));
    }));
    CHECK_THAT(e, Contains("in 2 saved pieces (an overlap)") && Contains("rank_0.safetensors") && Contains("rank_2.safetensors"));
    CHECK(one_line(e));
  }
  {
    auto small_groups = parallel_groups::build(dist(), tp1_pp4);
    parallel_model<causal_lm<tiny4, tp1_pp4>> small(small_groups, {.test_init = true});
    const std::string e = load_error(small, small_groups, good);
    CHECK_THAT(e, Contains("holds another model") && Contains("shape.layers: checkpoint 8, this model 4"));
    CHECK(one_line(e));
    parallel_model<value_model<tiny8, tp1_pp4>> critic(small_groups, {.test_init = true});
    CHECK_THAT(load_error(critic, small_groups, good), Contains("head: checkpoint \"actor\", this model \"critic\""));
    // metadata.json edited to say 4 layers while the pieces hold 8: the two must agree.
    const std::string e4 = load_error(small, small_groups, damaged("fewer-layers", [](const fs::path& d) {
      json m = read_json(d / "metadata.json");
      m["model"]["shape"]["layers"] = 4;
      write_text(d / "metadata.json", m.dump(1));
    }));
    CHECK_THAT(e4, Contains("holds tensor model.layers.4.") && Contains("the metadata and the pieces disagree"));
    CHECK(one_line(e4));
  }
  // No failed load touched the parameters.
  const auto after = all_hf(model.parameters(), model.config(), groups);
  for (const auto& [name, value] : before) CHECK(at::equal(after.at(name), value));
  remove_root(world, root);
}

namespace {

// Entries of `dir` whose names contain ".tmp".
std::vector<std::string> leftovers(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename().string().find(".tmp") != std::string::npos) out.push_back(e.path().string());
  return out;
}

}  // namespace

TEST_CASE("saving a distributed checkpoint is all-or-nothing and leaves no temporary files", "[world4][dist_checkpoint]") {
  REQUIRE(dist().world() == 4);
  auto groups = parallel_groups::build(dist(), tp2_pp2);
  const comm_group& world = *groups.world;
  const fs::path root = shared_root(world, "atomic");
  const fs::path dir = root / "ckpt";
  using spec = causal_lm<tiny8, tp2_pp2>;

  parallel_model<spec> a(groups, {.seed = 1, .test_init = true});
  save_distributed(a, groups, dir);
  world.barrier();
  CHECK(leftovers(root).empty());
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{"metadata.json", "rank_0.safetensors", "rank_1.safetensors",
                                       "rank_2.safetensors", "rank_3.safetensors"});

  // Saving over a checkpoint replaces it whole.
  parallel_model<spec> b(groups, {.seed = 2, .test_init = true});
  trainer tb = make_trainer(b, groups, train_config(), loss_config);
  tb.step(make_rollout(tiny8::shape.vocab), microbatches);
  save_distributed(b, groups, dir, &tb);
  world.barrier();
  CHECK(leftovers(root).empty());
  const auto want = all_hf(b.parameters(), b.config(), groups);
  auto check_holds_b = [&] {
    parallel_model<spec> c(groups, {.seed = 3, .test_init = true});
    load_distributed(c, groups, dir);
    const auto got = all_hf(c.parameters(), c.config(), groups);
    for (const auto& [name, value] : want) CHECK(at::equal(got.at(name), value));
  };
  check_holds_b();

  // A save that fails part-way (rank 2's optimizer state does not fit) leaves the old checkpoint.
  checkpoint_extras bad{.training = tb.export_state()};
  if (dist().rank() == 2) bad.training->exp_avg[1] = at::zeros({3});
  const std::string param = b.parameters()[1].name;
  auto save_bad = [&] { save_distributed(b.parameters(), b.config(), groups, dir, bad); };
  if (dist().rank() == 2) CHECK_THROWS_WITH(save_bad(), Contains("the AdamW exp_avg of " + param + " has shape [3]"));
  else CHECK_THROWS_WITH(save_bad(), Contains("the AdamW exp_avg of") && Contains("[reported by rank 2]"));
  world.barrier();
  CHECK(leftovers(root).empty());
  check_holds_b();

  // An unwritable destination, and a directory that is not a checkpoint, are refused whole.
  if (dist().rank() == 0) write_text(root / "plain-file", "x");
  const fs::path other = root / "other";
  if (dist().rank() == 0) {
    fs::create_directories(other);
    write_text(other / "notes.txt", "keep me");
  }
  world.barrier();
  CHECK_THROWS_WITH(save_distributed(a, groups, root / "plain-file" / "ckpt"), Contains("cannot create"));
  CHECK_THROWS_WITH(save_distributed(a, groups, other), Contains("not a megadsl distributed checkpoint"));
  world.barrier();
  CHECK(fs::exists(other / "notes.txt"));
  CHECK(leftovers(root).empty());
  if (::geteuid() != 0) {  // permissions do not stop root
    if (dist().rank() == 0) fs::permissions(root, fs::perms::owner_write, fs::perm_options::remove);
    world.barrier();
    CHECK_THROWS(save_distributed(a, groups, root / "new"));
    world.barrier();
    if (dist().rank() == 0) fs::permissions(root, fs::perms::owner_write, fs::perm_options::add);
  }
  check_holds_b();
  remove_root(world, root);
}

}  // namespace megadsl::test
