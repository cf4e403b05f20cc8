// megadsl.LrScheduler: Megatron's OptimizerParamScheduler (include/megadsl/lr_schedule.hpp) for an
// engine that runs its own schedule, as verl's Megatron engine does with McoreOptimizerConfig
// (steps counted as the engine calls step(), one per optimizer step).
#include <pybind11/stl.h>

#include <string>

#include "bindings.hpp"
#include "megadsl/lr_schedule.hpp"

namespace py = pybind11;

namespace megadsl::python {
namespace {

template <class E, std::size_t N>
E style_of(const std::string& key, const std::string& name, const E (&styles)[N]) {
  std::string known;
  for (E s : styles) {
    if (name_of(s) == name || (name == "wsd" && name_of(s) == "WSD")) return s;
    known += (known.empty() ? "" : ", ") + std::string(name_of(s));
  }
  throw py::value_error("megadsl.LrScheduler: " + key + " \"" + name + "\" is not one of " + known);
}

py::dict state_dict(const lr_scheduler_state& s) {
  py::dict d;  // Megatron's OptimizerParamScheduler.state_dict keys
  d["num_steps"] = s.num_steps;
  d["max_lr"] = s.max_lr;
  d["min_lr"] = s.min_lr;
  d["lr_warmup_steps"] = s.lr_warmup_steps;
  d["lr_decay_steps"] = s.lr_decay_steps;
  d["lr_decay_style"] = std::string(name_of(s.decay_style));
  d["start_wd"] = s.start_wd;
  d["end_wd"] = s.end_wd;
  d["wd_incr_steps"] = s.wd_incr_steps;
  d["wd_incr_style"] = std::string(name_of(s.wd_style));
  return d;
}

constexpr lr_decay_style decay_styles[] = {lr_decay_style::constant, lr_decay_style::linear, lr_decay_style::cosine,
                                           lr_decay_style::inverse_square_root, lr_decay_style::wsd};
constexpr wsd_decay_style wsd_styles[] = {wsd_decay_style::linear, wsd_decay_style::cosine,
                                          wsd_decay_style::exponential, wsd_decay_style::minus_sqrt};
constexpr wd_incr_style wd_styles[] = {wd_incr_style::constant, wd_incr_style::linear, wd_incr_style::cosine};

}  // namespace

void bind_schedule(py::module_& m) {
  py::class_<optimizer_param_scheduler>(m, "LrScheduler", R"(Megatron's OptimizerParamScheduler: the learning rate
(linear warmup from init_lr, then constant, linear, cosine, inverse-square-root or WSD decay to min_lr)
and the weight decay (constant, linear or cosine ramp) after step() has been called n times (or
with a sum of increments n). Megatron's constructor checks, each a ValueError naming the value.)")
      .def(py::init([](double max_lr, double min_lr, double init_lr, double lr_warmup_steps, std::int64_t lr_decay_steps,
                       const std::string& lr_decay_style, std::int64_t wsd_decay_steps,
                       const std::string& lr_wsd_decay_style, double start_wd, double end_wd,
                       std::int64_t wd_incr_steps, const std::string& wd_incr_style) {
             lr_schedule_config c;
             c.max_lr = max_lr;
             c.min_lr = min_lr;
             c.init_lr = init_lr;
             c.lr_warmup_steps = lr_warmup_steps;
             c.lr_decay_steps = lr_decay_steps;
             c.decay_style = style_of("lr_decay_style", lr_decay_style, decay_styles);
             c.wsd_decay_steps = wsd_decay_steps;
             c.wsd_style = style_of("lr_wsd_decay_style", lr_wsd_decay_style, wsd_styles);
             c.start_wd = start_wd;
             c.end_wd = end_wd;
             c.wd_incr_steps = wd_incr_steps;
             c.wd_style = style_of("wd_incr_style", wd_incr_style, wd_styles);
             try {
               return optimizer_param_scheduler(c);
             } catch (const std::invalid_argument& e) {
               throw py::value_error(e.what());
             }
           }),
           py::kw_only(), py::arg("max_lr"), py::arg("min_lr") = 0.0, py::arg("init_lr") = 0.0,
           py::arg("lr_warmup_steps") = 0.0, py::arg("lr_decay_steps"), py::arg("lr_decay_style") = "linear",
           py::arg("wsd_decay_steps") = 0, py::arg("lr_wsd_decay_style") = "exponential", py::arg("start_wd") = 0.0,
           py::arg("end_wd") = 0.0, py::arg("wd_incr_steps") = 0, py::arg("wd_incr_style") = "constant")
      .def("step", &optimizer_param_scheduler::step, py::arg("increment") = 1)
      .def_property_readonly("num_steps", &optimizer_param_scheduler::num_steps)
      .def_property_readonly("lr", py::overload_cast<>(&optimizer_param_scheduler::lr, py::const_))
      .def_property_readonly("weight_decay", [](const optimizer_param_scheduler& s) { return s.weight_decay(); })
      .def("state_dict", [](const optimizer_param_scheduler& s) { return state_dict(s.state()); },
           "Megatron's state_dict keys (num_steps, max_lr, ..., wd_incr_style).")
      .def(
          "load_state_dict",
          [](optimizer_param_scheduler& s, const py::dict& d) {
            lr_scheduler_state st;
            try {
              st.num_steps = d["num_steps"].cast<std::int64_t>();
              st.max_lr = d["max_lr"].cast<double>();
              st.min_lr = d["min_lr"].cast<double>();
              st.lr_warmup_steps = d["lr_warmup_steps"].cast<double>();
              st.lr_decay_steps = d["lr_decay_steps"].cast<std::int64_t>();
              st.decay_style = style_of("lr_decay_style", d["lr_decay_style"].cast<std::string>(), decay_styles);
              st.start_wd = d["start_wd"].cast<double>();
              st.end_wd = d["end_wd"].cast<double>();
              st.wd_incr_steps = d["wd_incr_steps"].cast<std::int64_t>();
              st.wd_style = style_of("wd_incr_style", d["wd_incr_style"].cast<std::string>(), wd_styles);
              s.load(st);
            } catch (const py::error_already_set& e) {
              throw py::value_error(std::string("megadsl.LrScheduler.load_state_dict: ") + e.what());
            } catch (const std::invalid_argument& e) {
              throw py::value_error(e.what());
            }
          },
          py::arg("state"),
          "Continues from a state_dict (a fresh scheduler: its values are the checkpoint's, then num_steps steps).");
}

}  // namespace megadsl::python
