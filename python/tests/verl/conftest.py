"""verl's own code running megadsl: the tests of this folder run in the verl environment
(.venv-verl, scripts/setup.sh: verl 0.9.1 with the versions it requires, over the same torch), as
CTest's python.verl runs them; python.pytest (the project's environment) leaves this folder out.

This folder is on sys.path for the ranks the tests start: verl_cpu (the CPU platform verl lacks,
loaded through VERL_USE_EXTERNAL_MODULES), tiny_chat (a local chat model), verl_engine_ranks."""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
FIXTURES = Path(os.environ.get("MEGADSL_FIXTURES", HERE.parent.parent.parent / "tests" / "fixtures"))


@pytest.fixture(scope="session")
def fixtures():
    if not (FIXTURES / "llama-gqa" / "config.json").exists():
        pytest.fail(f"no fixtures in {FIXTURES}; set MEGADSL_FIXTURES to the checkout's tests/fixtures")
    return FIXTURES


def pytest_configure(config):
    # verl's engine package names each optional backend it cannot import (torchtitan, megatron, ...).
    config.addinivalue_line("filterwarnings", "ignore:.*engine is not available:UserWarning")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:megatron")
