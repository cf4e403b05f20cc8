"""The module's error types, raised where a user meets them, and the family listing.

ConfigError, LayoutError and CheckpointError subclass the built-ins megadsl raised before
(ValueError, ValueError, RuntimeError), so code that caught those still does."""

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

import megadsl


def test_the_error_types_subclass_the_builtins_they_were():
    assert issubclass(megadsl.ConfigError, ValueError)
    assert issubclass(megadsl.LayoutError, ValueError)
    assert issubclass(megadsl.CheckpointError, RuntimeError)
    assert not issubclass(megadsl.ConfigError, megadsl.LayoutError)


def test_a_layout_the_model_does_not_fit_is_a_layout_error(gqa):
    with pytest.raises(megadsl.LayoutError, match="heads_divisible_by_tp"):
        megadsl.describe("llama3-8b", tp=3)
    with pytest.raises(megadsl.LayoutError, match="heads_divisible_by_tp"):
        megadsl.plan(gqa, tp=8)
    # a model in a world of one process: tp 2 does not fit it
    with pytest.raises(megadsl.LayoutError, match="world"):
        megadsl.Model.from_hf(gqa, tp=2)


def test_a_bad_config_json_is_a_config_error(tmp_path, gqa):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(megadsl.ConfigError, match="config.json"):
        megadsl.read_hf_config(bad)
    unknown = tmp_path / "unknown"
    unknown.mkdir()
    config = json.loads((gqa / "config.json").read_text())
    config["model_type"] = "no_such_family"
    (unknown / "config.json").write_text(json.dumps(config))
    with pytest.raises(megadsl.ConfigError, match="no_such_family"):
        megadsl.describe(unknown)
    with pytest.raises(megadsl.ConfigError, match="no_such_family"):
        megadsl.Model.from_hf(unknown)


def test_a_broken_checkpoint_is_a_checkpoint_error(tmp_path, gqa):
    broken = tmp_path / "broken"
    shutil.copytree(gqa, broken)
    weights = sorted(broken.glob("*.safetensors"))
    weights = [w for w in weights if w.name != "reference.safetensors"]
    assert weights
    data = weights[0].read_bytes()
    weights[0].write_bytes(data[: len(data) // 2])  # truncated: the header promises more bytes
    with pytest.raises(megadsl.CheckpointError, match=re.escape(weights[0].name)):
        megadsl.Model.from_hf(broken)


def test_families_lists_the_registry():
    table = megadsl.families_table()
    rows = [line.split()[0] for line in table.splitlines()[1:] if line.strip() and not line.startswith("-")]
    for model_type in ("llama", "qwen3", "qwen3_moe", "deepseek_v3", "gpt_oss", "qwen3_next", "cohere"):
        assert model_type in rows, table
    assert "llama3-8b" in table and "LlamaForCausalLM" in table
    # every preset appears on its family's line
    listed = set(re.findall(r"[\w.-]+", " ".join(line.split("ForCausalLM", 1)[-1] for line in table.splitlines())))
    for name in megadsl.presets():
        assert name in listed, (name, table)


def test_the_type_stubs_name_what_the_module_has():
    stub = Path(megadsl.__file__).with_name("_C.pyi")
    assert stub.exists(), "python/megadsl/_C.pyi is missing: run python/gen_stubs.sh"
    assert Path(megadsl.__file__).with_name("py.typed").exists()
    text = stub.read_text()
    declared = set()
    for node in ast.parse(text).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            declared.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            declared.add(node.target.id)
        elif isinstance(node, ast.Assign):
            declared.update(t.id for t in node.targets if isinstance(t, ast.Name))
    declared = {n for n in declared if not n.startswith("__")}
    public = {n for n in dir(megadsl._C) if not n.startswith("__")}
    missing = sorted(public - declared)
    stale = sorted(declared - public)
    assert not missing and not stale, f"python/megadsl/_C.pyi is out of date (run python/gen_stubs.sh): missing {missing}, stale {stale}"
