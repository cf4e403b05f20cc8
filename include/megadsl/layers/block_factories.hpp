// The core blocks' run-time module factories, declared without LibTorch so that a block type
// (layers/blocks.hpp) can name its module in constant evaluation. Each is defined once, in the
// block's own source file under src/layers/. A block only one family uses declares its own beside
// its type under models/<family>/ (models/deepseek_v3/mla.hpp), and a user's block the same way.
//
// Outside the runtime library the declarations are weak references: a torch-free program may use
// an architecture (its parameter rows, its formulas) without linking any module, and the factories
// it never calls read as null. The runtime library declares them strongly, and layer_plan.cpp
// takes each one's address, so that a program that builds modules links every one of them.
#pragma once

#include <memory>

#include "megadsl/architecture.hpp"

#ifndef MEGADSL_FACTORY_LINKAGE
#define MEGADSL_FACTORY_LINKAGE __attribute__((weak))
#endif

namespace megadsl::modules {

// norms (src/layers/norms.cpp): `<prefix>.weight` (and `.bias`)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> rms_norm(const block_build& b);       // Llama: w * x.to(dtype)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> rms_norm_1p(const block_build& b);    // Gemma: (1 + w) * x in fp32
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> rms_norm_wmul(const block_build& b);  // OLMo2: (w * x).to(dtype)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> layer_norm(const block_build& b);     // nn.LayerNorm, weight and bias
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> layer_norm_no_bias(const block_build& b);  // Cohere: no bias, fp32

// q/k norms before RoPE (src/layers/qk_norms.cpp); children: the q norm, the k norm
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> per_head_qk_norm(const block_build& b);
// per_head_qk_norm's knobs: blocks::qk_norm_knobs (after RoPE: HunYuan; a weight per head: Command R+)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> full_width_qk_norm(const block_build& b);

// grouped-query attention with RoPE (src/layers/attention.cpp); child 0: its q/k norm, if any;
// knobs: blocks::attention_knobs
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> attention(const block_build& b);
// the gated DeltaNet (src/layers/gated_delta_net.cpp: Qwen3-Next's and Qwen3.5's)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> gated_delta_net(const block_build& b);

// MLPs; knobs: blocks::mlp_knobs (the activation), the mixture's blocks::experts_knobs
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> gated_mlp(const block_build& b);  // src/layers/gated_mlp.cpp
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> plain_mlp(const block_build& b);  // src/layers/plain_mlp.cpp
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> moe_mlp(const block_build& b);    // src/layers/moe_mlp.cpp; child 0: its router
// a mixture's routers (src/layers/softmax_router.cpp, grouped_sigmoid_router.cpp); knobs: blocks::router_knobs
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> softmax_router(const block_build& b);
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> grouped_sigmoid_router(const block_build& b);

// the embedding (src/layers/embedding.cpp); knobs: blocks::embedding_knobs
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> embedding(const block_build& b);

// residual combinators (src/layers/residuals.cpp)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> pre_norm(const block_build& b);   // children: norm, inner
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> post_norm(const block_build& b);  // children: norm, inner
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> sandwich(const block_build& b);   // children: pre norm, inner, post norm
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> branch(const block_build& b);     // children: norm, inner; inner(norm(x)), no residual
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> parallel_sum(const block_build& b);  // children: two branches; x + a(x) + m(x)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> sequence(const block_build& b);   // children: first, second
// children: norm, attention, MLP; x + attn(n(x)) + mlp(n(x)), one norm for both (Cohere)
MEGADSL_FACTORY_LINKAGE std::unique_ptr<block_module> parallel_shared_norm(const block_build& b);

}  // namespace megadsl::modules
