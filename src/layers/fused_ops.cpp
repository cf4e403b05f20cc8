// The fused CUDA kernels as tensors and autograd functions (include/megadsl/layers/fused_ops.hpp).
#include "megadsl/layers/fused_ops.hpp"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#ifdef MEGADSL_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../cuda/fused_kernels.hpp"
#endif

namespace megadsl {
namespace {

std::atomic<int> switched{-1};  // -1: read MEGADSL_FUSED_KERNELS on first use

bool switched_on() {
  int v = switched.load();
  if (v < 0) {
    const char* e = std::getenv("MEGADSL_FUSED_KERNELS");
    v = (e != nullptr && std::strcmp(e, "0") == 0) ? 0 : 1;
    switched.store(v);
  }
  return v == 1;
}

#ifdef MEGADSL_WITH_CUDA
cuda_kernels::half_type half_of(const at::Tensor& t) {
  TORCH_CHECK(t.is_cuda() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf),
              "megadsl: the fused kernels take bf16 or fp16 CUDA tensors, got ", t.scalar_type(), " on ", t.device());
  return t.scalar_type() == at::kBFloat16 ? cuda_kernels::half_type::bf16 : cuda_kernels::half_type::fp16;
}
// A companion tensor of `like`'s rows: on its device, `rows` elements.
void check_rows(const at::Tensor& t, const at::Tensor& like, std::int64_t rows, const char* what) {
  TORCH_CHECK(t.device() == like.device(), "megadsl: fused kernels: ", what, " is on ", t.device(), ", the logits on ",
              like.device());
  TORCH_CHECK(t.numel() == rows, "megadsl: fused kernels: ", what, " has ", t.numel(), " elements for ", rows, " rows");
}
void* stream_of(const at::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct swiglu_fn : torch::autograd::Function<swiglu_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate_up_in) {
    const at::Tensor gate_up = gate_up_in.contiguous();
    const c10::cuda::CUDAGuard guard(gate_up.device());
    const std::int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / std::max<std::int64_t>(2 * f, 1);
    std::vector<std::int64_t> out_shape(gate_up.sizes().begin(), gate_up.sizes().end());
    out_shape.back() = f;
    at::Tensor out = at::empty(out_shape, gate_up.options());
    cuda_kernels::swiglu_forward(gate_up.const_data_ptr(), half_of(gate_up), rows, f, out.mutable_data_ptr(),
                                 stream_of(gate_up));
    ctx->save_for_backward({gate_up});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor gate_up = ctx->get_saved_variables()[0];
    const at::Tensor dy = grads[0].to(gate_up.scalar_type()).contiguous();
    const c10::cuda::CUDAGuard guard(gate_up.device());
    const std::int64_t f = gate_up.size(-1) / 2, rows = gate_up.numel() / std::max<std::int64_t>(2 * f, 1);
    at::Tensor d = at::empty_like(gate_up);
    cuda_kernels::swiglu_backward(gate_up.const_data_ptr(), dy.const_data_ptr(), half_of(gate_up), rows, f,
                                  d.mutable_data_ptr(), stream_of(gate_up));
    return {d};
  }
};

// x viewed as (T, A, B, 2h) with its strides; the kernel writes a contiguous (T, A, B, 2h).
at::Tensor rope_rows(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool inverse) {
  std::int64_t size[4] = {1, 1, 1, 1}, stride[4] = {0, 0, 0, 1};
  const std::int64_t lead = x.dim() - 1;  // dims before the rotated one: T and up to two more
  size[0] = x.size(0);
  stride[0] = x.stride(0);
  for (std::int64_t i = 1; i < lead; ++i) {
    size[i] = x.size(i);
    stride[i] = x.stride(i);
  }
  const std::int64_t half = x.size(-1) / 2;
  at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
  const c10::cuda::CUDAGuard guard(x.device());
  cuda_kernels::rope(x.const_data_ptr(), half_of(x), size[0], size[1], size[2], stride[0], stride[1], stride[2], half,
                     cos.const_data_ptr(), sin.const_data_ptr(), inverse, out.mutable_data_ptr(), stream_of(x));
  return out;
}

struct rope_fn : torch::autograd::Function<rope_fn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    return rope_rows(x, cos, sin, false);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor g = grads[0].to(saved[0].scalar_type()).contiguous();
    return {rope_rows(g, saved[0], saved[1], true), {}, {}};  // the transposed rotation
  }
};
#endif

[[noreturn]] void not_built() {
  throw std::logic_error("megadsl: the fused CUDA kernels are not in this build (built without CUDA)");
}

}  // namespace

bool fused_kernels_take(const at::Tensor& t) {
#ifdef MEGADSL_WITH_CUDA
  return t.defined() && t.is_cuda() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf) &&
         switched_on();
#else
  (void)t;
  (void)switched_on;
  return false;
#endif
}

bool set_fused_kernels(bool on) {
  const bool was = switched_on();
  switched.store(on ? 1 : 0);
  return was;
}

at::Tensor fused_swiglu(const at::Tensor& gate_up) {
#ifdef MEGADSL_WITH_CUDA
  TORCH_CHECK(gate_up.dim() >= 1 && gate_up.size(-1) % 2 == 0, "megadsl: fused_swiglu takes [gate | up] of an even width");
  (void)half_of(gate_up);  // bf16 or fp16 on CUDA
  return swiglu_fn::apply(gate_up);
#else
  (void)gate_up;
  not_built();
#endif
}

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos_in, const at::Tensor& sin_in) {
#ifdef MEGADSL_WITH_CUDA
  TORCH_CHECK(x.dim() >= 2 && x.dim() <= 4 && x.stride(-1) == 1 && x.size(-1) % 2 == 0,
              "megadsl: fused_rope takes x (T, ..., 2h) of 2 to 4 dims, its last one contiguous; got ", x.sizes(),
              " with strides ", x.strides());
  (void)half_of(x);  // bf16 or fp16 on CUDA
  const at::Tensor cos = cos_in.to(x.scalar_type()).contiguous(), sin = sin_in.to(x.scalar_type()).contiguous();
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->device() == x.device() && t->dim() == 2 && t->size(0) == x.size(0) && 2 * t->size(1) == x.size(-1),
                "megadsl: fused_rope's tables are (T, h) = (", x.size(0), ", ", x.size(-1) / 2, ") on ", x.device(),
                ", got ", t->sizes(), " on ", t->device());
  return rope_fn::apply(x, cos, sin);
#else
  (void)x, (void)cos_in, (void)sin_in;
  not_built();
#endif
}

std::array<at::Tensor, 4> logits_row_stats(const at::Tensor& logits_in, const at::Tensor& labels_in,
                                           std::int64_t start, std::int64_t valid) {
#ifdef MEGADSL_WITH_CUDA
  const at::Tensor logits = logits_in.contiguous(), labels = labels_in.to(at::kLong).contiguous();
  TORCH_CHECK(logits.dim() == 2 && valid >= 0 && valid <= logits.size(1),
              "megadsl: logits_row_stats takes logits (T, width) and valid <= width");
  check_rows(labels, logits, logits.size(0), "labels");
  const c10::cuda::CUDAGuard guard(logits.device());
  const std::int64_t rows = logits.size(0);
  at::Tensor out = at::empty({4, rows}, logits.options().dtype(at::kFloat));
  cuda_kernels::logits_row_stats(logits.const_data_ptr(), half_of(logits), rows, logits.size(1), valid,
                                 labels.const_data_ptr<std::int64_t>(), start, out[0].mutable_data_ptr<float>(),
                                 out[1].mutable_data_ptr<float>(), out[2].mutable_data_ptr<float>(),
                                 out[3].mutable_data_ptr<float>(), stream_of(logits));
  return {out[0], out[1], out[2], out[3]};
#else
  (void)logits_in, (void)labels_in, (void)start, (void)valid;
  not_built();
#endif
}

at::Tensor logits_row_grad(const at::Tensor& logits_in, const at::Tensor& labels_in, std::int64_t start,
                           std::int64_t valid, const at::Tensor& m, const at::Tensor& s, const at::Tensor& a,
                           const at::Tensor& g_logp, const at::Tensor& g_h) {
#ifdef MEGADSL_WITH_CUDA
  const at::Tensor logits = logits_in.contiguous(), labels = labels_in.to(at::kLong).contiguous();
  TORCH_CHECK(logits.dim() == 2 && valid >= 0 && valid <= logits.size(1),
              "megadsl: logits_row_grad takes logits (T, width) and valid <= width");
  const std::int64_t rows = logits.size(0);
  check_rows(labels, logits, rows, "labels");
  for (const auto& [t, what] : {std::pair<const at::Tensor*, const char*>{&m, "m"}, {&s, "s"}, {&a, "a"},
                                {&g_logp, "the log-probs' gradient"}, {&g_h, "the entropy's gradient"}})
    check_rows(*t, logits, rows, what);
  const c10::cuda::CUDAGuard guard(logits.device());
  const auto f32 = [](const at::Tensor& t) { return t.to(at::kFloat).contiguous(); };
  const at::Tensor mm = f32(m), ss = f32(s), aa = f32(a), gl = f32(g_logp), gh = f32(g_h);
  at::Tensor grad = at::empty_like(logits);
  cuda_kernels::logits_row_grad(logits.const_data_ptr(), half_of(logits), logits.size(0), logits.size(1), valid,
                                labels.const_data_ptr<std::int64_t>(), start, mm.const_data_ptr<float>(),
                                ss.const_data_ptr<float>(), aa.const_data_ptr<float>(), gl.const_data_ptr<float>(),
                                gh.const_data_ptr<float>(), grad.mutable_data_ptr(), stream_of(logits));
  return grad;
#else
  (void)logits_in, (void)labels_in, (void)start, (void)valid, (void)m, (void)s, (void)a, (void)g_logp, (void)g_h;
  not_built();
#endif
}

}  // namespace megadsl
