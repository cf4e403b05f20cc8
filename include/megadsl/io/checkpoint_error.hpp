// The one exception type of checkpoint I/O.
#pragma once

#include <stdexcept>

namespace megadsl {

// A checkpoint that cannot be read or written. One line: the file, the tensor where there is one,
// what is wrong and what was expected.
struct checkpoint_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace megadsl
