// A composition whose sublayers have different residual forms: the rule's named type carries the
// two values, readable on GCC and clang alike (not a string of character codes).
#include "megadsl/model.hpp"

namespace b = megadsl::blocks;
using mixed = b::decoder<b::embedding<>,
                         b::block<b::pre_norm<b::rms_norm<>, b::attention<>>, b::post_norm<b::rms_norm<>, b::gated_mlp<>>>,
                         b::rms_norm<>>;
template <megadsl::shape S>
struct mixed_family : megadsl::decoder_family<mixed, S> {};
constexpr megadsl::shape s = mixed_family<megadsl::shape{}>::shape;

// expect: residuals_agree<megadsl::residual_kind::pre_norm, megadsl::residual_kind::post_norm>
// expect: residuals_agree: the attention and MLP sublayers \(the values above\) have different forms
// expect-clang: residuals_agree<megadsl::residual_kind::pre_norm, megadsl::residual_kind::post_norm>
// expect-clang: residuals_agree: the attention and MLP sublayers
