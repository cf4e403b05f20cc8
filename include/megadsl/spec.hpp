// The torch-free part of megadsl that a model declaration needs: shapes, layouts, heads, rules,
// shard plan, stages, rank grid and formulas (under 1 s of CPU to compile). A preset model comes
// with its family's header, so only the presets a file uses are computed:
//   #include <megadsl/models/llama.hpp>     // llama3_8b, tiny_llama, ...
//   #include <megadsl/models/presets.hpp>   // every preset and for_each_preset (about 2 s)
// Also torch-free, included where used (they cost more to compile): megadsl/schedule.hpp
// (pipeline op lists), megadsl/batching.hpp (micro-batching, range-v3), megadsl/lr_schedule.hpp.
#pragma once

#include "megadsl/formulas.hpp"
#include "megadsl/heads.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/model.hpp"
#include "megadsl/architecture.hpp"
#include "megadsl/rank_grid.hpp"
#include "megadsl/require_valid.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/stages.hpp"
