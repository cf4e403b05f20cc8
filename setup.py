"""Builds the `megadsl` Python package with CMake (the target megadsl_python of python/CMakeLists.txt).

    .venv/bin/pip install --no-build-isolation .

No build isolation: the extension is compiled against the torch of the interpreter that runs pip
(PyTorch's own LibTorch), so it must see that torch. The CMake build directory is `build` in the
checkout, or MEGADSL_BUILD_DIR; an existing one is reused (only the module's target is built), a
missing one is configured (Release, Ninja when available, tests and examples off). The number of
build jobs follows CMAKE_BUILD_PARALLEL_LEVEL or MEGADSL_BUILD_JOBS.
"""

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent
BUILD = Path(os.environ.get("MEGADSL_BUILD_DIR", ROOT / "build")).resolve()
# setuptools' own scratch (build/lib.*, bdist.*, the egg-info) goes under the CMake build
# directory, not into the checkout.
SCRATCH = BUILD / "python-setuptools"
SCRATCH.mkdir(parents=True, exist_ok=True)


def _cache_value(cache, name):
    for line in cache.read_text(errors="replace").splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    return None


def _prefix_of(python):
    return subprocess.run([python, "-c", "import sys; print(sys.prefix)"], check=True, capture_output=True,
                          text=True).stdout.strip()


class CMakeExtension(Extension):
    def __init__(self, name, target):
        super().__init__(name, sources=[])
        self.target = target


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = BUILD
        cache = build / "CMakeCache.txt"
        configure = ["cmake", "-S", str(ROOT), "-B", str(build), f"-DMEGADSL_PYTHON={sys.executable}",
                     "-DMEGADSL_BUILD_PYTHON=ON"]
        if cache.exists():
            python = _cache_value(cache, "MEGADSL_PYTHON")
            if python and os.path.realpath(_prefix_of(python)) != os.path.realpath(sys.prefix):
                raise RuntimeError(
                    f"megadsl: the CMake build in {build} uses the Python of {python}, not this one "
                    f"({sys.executable}); its module would not load here. Set MEGADSL_BUILD_DIR to another directory."
                )
            if (_cache_value(cache, "MEGADSL_BUILD_RUNTIME") or "ON").upper() in ("OFF", "0", "FALSE", "NO"):
                raise RuntimeError(f"megadsl: the CMake build in {build} has MEGADSL_BUILD_RUNTIME=OFF; the Python "
                                   "module needs the LibTorch runtime. Set MEGADSL_BUILD_DIR to another directory.")
            if not (build / "python" / "CMakeFiles" / "megadsl_python.dir").exists():
                # Configured before the module existed, or with MEGADSL_BUILD_PYTHON=OFF.
                subprocess.run(["cmake", "-S", str(ROOT), "-B", str(build), "-DMEGADSL_BUILD_PYTHON=ON"], check=True)
        else:
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            subprocess.run(configure + generator + ["-DCMAKE_BUILD_TYPE=Release", "-DMEGADSL_BUILD_TESTS=OFF",
                                                    "-DMEGADSL_BUILD_EXAMPLES=OFF"], check=True)
        command = ["cmake", "--build", str(build), "--target", ext.target]
        jobs = os.environ.get("MEGADSL_BUILD_JOBS")
        if jobs:
            command += ["--parallel", jobs]
        subprocess.run(command, check=True)

        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        built = build / "python" / "megadsl" / ("_C" + suffix)
        if not built.exists():
            raise RuntimeError(f"megadsl: the build did not produce {built}")
        out = Path(self.get_ext_fullpath(ext.name))
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built, out)


setup(
    ext_modules=[CMakeExtension("megadsl._C", target="megadsl_python")],
    cmdclass={"build_ext": CMakeBuild},
    options={"build": {"build_base": str(SCRATCH)}, "egg_info": {"egg_base": str(SCRATCH)}},
)
