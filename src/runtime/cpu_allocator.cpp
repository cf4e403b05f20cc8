#include "cpu_allocator.hpp"

#include <climits>
#include <cstdlib>
#include <mutex>
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace megadsl::detail {

void tune_cpu_allocator() {
#if defined(__GLIBC__)
  static std::once_flag once;
  std::call_once(once, [] {
    if (const char* v = std::getenv("MEGADSL_MALLOC_TUNING"); v != nullptr && std::string_view(v) == "0") return;
    mallopt(M_MMAP_MAX, 0);              // large blocks from the heap, reused after free
    mallopt(M_TRIM_THRESHOLD, INT_MAX);  // and the heap's top kept rather than given back
  });
#endif
}

}  // namespace megadsl::detail
