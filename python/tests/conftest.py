"""Shared pieces of the megadsl Python tests.

Run them against a build tree (PYTHONPATH=<build>/python, as CTest's python.pytest does) or an
installed megadsl. MEGADSL_FIXTURES points at tests/fixtures (default: the checkout's).
"""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # helpers.py, importable by the ranks launch_local starts

FIXTURES = Path(os.environ.get("MEGADSL_FIXTURES", HERE.parent.parent / "tests" / "fixtures"))

# verl's trainers and workers run in the verl environment (.venv-verl), as CTest's python.verl: not here.
collect_ignore = ["verl"]


@pytest.fixture(scope="session")
def fixtures():
    if not (FIXTURES / "llama-gqa" / "config.json").exists():
        pytest.fail(f"no fixtures in {FIXTURES}; set MEGADSL_FIXTURES to the checkout's tests/fixtures")
    return FIXTURES


@pytest.fixture(scope="session")
def gqa(fixtures):
    return fixtures / "llama-gqa"


@pytest.fixture(scope="session")
def reference(gqa):
    from safetensors.torch import load_file

    return load_file(str(gqa / "reference.safetensors"))
