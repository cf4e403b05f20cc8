// megadsl: the umbrella header (spec and runtime). Spec-only code includes megadsl/spec.hpp
// instead, which pulls in no LibTorch. A preset model comes with its family's header
// (megadsl/models/llama.hpp, ...; megadsl/models/presets.hpp for all of them).
#pragma once

#include "megadsl/spec.hpp"

#include "megadsl/layers/vocab_parallel.hpp"
#include "megadsl/parallel/distributed.hpp"
#include "megadsl/parallel/launcher.hpp"
#include "megadsl/parallel/mappings.hpp"
#include "megadsl/runtime/parallel_model.hpp"
#include "megadsl/runtime/shard_io.hpp"
