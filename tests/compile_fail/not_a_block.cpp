// A type in a block's place that is not a block: one line says what a block declares.
#include "megadsl/model.hpp"

namespace b = megadsl::blocks;
struct my_mlp {};  // no `lower`
using broken = b::decoder<b::embedding<>, b::block<b::pre_norm<b::rms_norm<>, b::attention<>>, b::pre_norm<b::rms_norm<>, my_mlp>>,
                          b::rms_norm<>>;
template <megadsl::shape S>
struct broken_family : megadsl::decoder_family<broken, S> {};
constexpr megadsl::shape s = broken_family<megadsl::shape{}>::shape;

// expect: not a block: a block type declares `static constexpr int lower\(blocks::arch_builder&, const blocks::slot&\)`
// expect-clang: not a block: a block type declares
