#!/usr/bin/env bash
# The README's main job: the actor and the critic of an embedded tiny model on several local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
MEGADSL_SETUP_VERL=0 bash scripts/setup.sh
# Only the two programs it runs (and the library), not the tests and benchmarks.
MEGADSL_BUILD_TARGETS="01_actor_critic 02_ppo" bash scripts/build.sh
# The actor and critic on 4 local ranks (tp 2 x dp 2), checked against one process...
./build/examples/01_actor_critic
echo
# ...then PPO steps of both under tp 2 x pp 2 with SP and remove-padding (flags: see 02_ppo.cpp).
./build/examples/02_ppo --ranks 4 --tp 2 --pp 2 --sp --rmpad "$@"
