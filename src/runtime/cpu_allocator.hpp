// The process's CPU allocation policy for LibTorch tensors (glibc malloc underneath).
#pragma once

namespace megadsl::detail {

// Once per process, when a model is built on the CPU: large freed blocks stay in the heap for the
// next step's tensors instead of going back to the kernel. glibc serves every allocation above
// 32 MB (a (T, ffn) activation, a block of logits) with a fresh mmap and unmaps it on free, so
// each step touches every such page again: page faults and zeroing took about a third of the CPU
// time of a step in the profile (issue 13). Here: no mmap for the main heap, no trimming of its
// top. MEGADSL_MALLOC_TUNING=0 leaves the allocator as the process had it. A no-op outside glibc.
void tune_cpu_allocator();

}  // namespace megadsl::detail
