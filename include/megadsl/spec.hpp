// The torch-free part of megadsl: model shapes, layouts, heads, rules, shard plan, stages, rank
// grid, formulas and the preset models. Compiles in well under a second.
#pragma once

#include "megadsl/batching.hpp"
#include "megadsl/formulas.hpp"
#include "megadsl/heads.hpp"
#include "megadsl/layout.hpp"
#include "megadsl/lr_schedule.hpp"
#include "megadsl/model.hpp"
#include "megadsl/models/presets.hpp"
#include "megadsl/param_table.hpp"
#include "megadsl/rank_grid.hpp"
#include "megadsl/rules.hpp"
#include "megadsl/schedule.hpp"
#include "megadsl/shape.hpp"
#include "megadsl/shard_plan.hpp"
#include "megadsl/stages.hpp"
