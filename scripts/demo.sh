#!/usr/bin/env bash
# The README's main job: the actor and the critic of an embedded tiny model on several local ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
./build/examples/01_actor_critic "$@"
