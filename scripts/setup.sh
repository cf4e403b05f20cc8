#!/usr/bin/env bash
# Installs everything megadsl needs on a fresh Debian bookworm machine (idempotent).
#   Debian: compilers, CMake/Ninja, the header-only libraries (Boost.Hana, range-v3, Catch2,
#           nlohmann-json) and Gloo's headers (PyTorch's wheel ships its Gloo but not the headers).
#   .venv:  PyPI's torch (LibTorch 2.x with CUDA 13 and NCCL, its CMake package inside), and what
#           the Python module, its tests and the fixture generator use (transformers, safetensors).
# The CUDA toolkit (nvcc, NCCL) is part of this machine kind; without it the build is CPU-only.
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(build-essential cmake ninja-build libgloo-dev libboost-dev librange-v3-dev catch2
          nlohmann-json3-dev python3 python3-venv clang-14 libclang-rt-14-dev)  # clang: the fuzzers
missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# Pinned: the fixtures, the ABI of the extension module and the figures in the README are taken
# with these versions.
python_packages=(torch==2.15.0 transformers==5.23.0 safetensors numpy pytest)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {"torch": "2.15.0", "transformers": "5.23.0"}
sys.exit(any(not m.version(k).startswith(v) for k, v in want.items()) or
         any(m.version(k) is None for k in ("safetensors", "numpy", "pytest")))
PY
then
  echo "setup: installing ${python_packages[*]} into .venv (torch with CUDA: about 3 GB)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "${python_packages[@]}"
fi

# Test dependency, not the library's: verl's own loss functions are the oracle of
# python/tests/test_verl_losses.py, and verl's engine interface (BaseEngine, EngineRegistry, its
# ppo_loss / value_loss) that megadsl.verl implements is exercised by python/tests/test_verl_engine.py.
# verl pins an older transformers than the fixtures', so it goes in without its dependencies, with
# just what `verl.trainer.ppo.core_algos` and `verl.workers.engine` / `verl.workers.utils.losses`
# import (ray, tensordict, omegaconf, hydra, peft, accelerate, datasets and theirs), pinned.
verl_packages=(ray==2.60.0 tensordict==0.10.0 omegaconf==2.3.0 antlr4-python3-runtime==4.9.3)
verl_nodeps=(verl==0.9.1 hydra-core==1.3.8 codetiming==1.4.0 peft==0.21.2 accelerate==1.15.0 datasets==5.2.0
             multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1 dill==0.4.1 xxhash==4.1.0
             python-dateutil==4.0.0 pytz==2026.6 tzdata==2026.6 pillow==13.0.0)
if ! .venv/bin/python - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
sys.exit(m.version("verl") != "0.9.1" or m.version("tensordict") != "0.10.0" or m.version("peft") != "0.21.2")
PY
then
  echo "setup: installing verl 0.9.1 (test oracle of the losses) into .venv"
  # (pip notes that verl's own requirements are not met: expected, verl is only imported for its losses)
  .venv/bin/pip install -q "${verl_packages[@]}"
  .venv/bin/pip install -q --no-deps "${verl_nodeps[@]}"
fi
