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
python_packages=(torch==2.15.0 transformers==5.23.0 peft==0.21.2 safetensors numpy pytest)
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
if ! .venv/bin/python - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
want = {"torch": "2.15.0", "transformers": "5.23.0", "peft": "0.21.2"}
sys.exit(any(not m.version(k).startswith(v) for k, v in want.items()) or
         any(m.version(k) is None for k in ("safetensors", "numpy", "pytest")))
PY
then
  echo "setup: installing ${python_packages[*]} into .venv (torch with CUDA: about 3 GB)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q "${python_packages[@]}"
fi

if [ "${MEGADSL_SETUP_VERL:-1}" = 0 ]; then exit 0; fi  # the demo needs no verl
# The verl environment: verl's own trainers and workers (the SFT trainer, the PPO workers) run megadsl
# in it, and verl's losses are the oracle of megadsl's. verl 0.9.1 pins an older transformers than the
# fixtures', so it has a virtual environment of its own, .venv-verl, with the versions verl requires
# (scripts/verl-env.txt), over the same torch: a .pth file after its own site-packages reads .venv's.
verl_site=.venv-verl/lib/python$(.venv/bin/python -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')/site-packages
if [ ! -x .venv-verl/bin/python ]; then
  echo "setup: creating .venv-verl"
  python3 -m venv .venv-verl
fi
.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$verl_site/zz-megadsl-torch.pth"
if ! .venv-verl/bin/python - scripts/verl-env.txt <<'PY' 2>/dev/null
import importlib.metadata as m, pathlib, sys
want = [l.split("==") for l in pathlib.Path(sys.argv[1]).read_text().splitlines() if l and not l.startswith("#")]
site = pathlib.Path(sys.prefix).resolve()
for name, version in want:
    d = m.distribution(name)
    if d.version != version or site not in pathlib.Path(d.locate_file("")).resolve().parents:
        sys.exit(1)
PY
then
  echo "setup: installing verl 0.9.1 and its requirements into .venv-verl (scripts/verl-env.txt)"
  .venv-verl/bin/pip install -q --upgrade pip
  .venv-verl/bin/pip install -q --no-deps --ignore-installed -r scripts/verl-env.txt
fi
# torch's torchrun in the verl environment (torch's console scripts are in .venv/bin).
if [ ! -x .venv-verl/bin/torchrun ]; then
  printf '#!%s\n# torchrun of the torch .venv-verl reads from .venv\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n' \
    "$PWD/.venv-verl/bin/python" > .venv-verl/bin/torchrun
  chmod +x .venv-verl/bin/torchrun
fi
