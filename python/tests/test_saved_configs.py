"""save_hf writes what transformers 5 loads, for every family: each fixture's actor and critic,
loaded by megadsl and saved again, is read by transformers' config classes (which check their
fields' types strictly: an int field refuses 24.0), and each actor's weights load into its class
with nothing missing or left over (a multimodal checkpoint's into its multimodal class)."""

import json
import warnings

import pytest
import torch

import megadsl
from conftest import FIXTURES

NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").exists())


@pytest.mark.parametrize("name", NAMES)
def test_saved_checkpoint_loads_in_transformers(name, tmp_path):
    transformers = pytest.importorskip("transformers")
    src = FIXTURES / name
    for path, critic in [(src, False), (src / "critic", True)]:
        if not (path / "config.json").exists():
            continue
        out = tmp_path / ("critic" if critic else "actor")
        model = megadsl.Model.from_hf(path, critic=critic)
        model.save_hf(out)
        model.close()
        written = json.loads((out / "config.json").read_text())
        config = transformers.AutoConfig.from_pretrained(str(out))
        assert config.model_type == written["model_type"]
        if critic:
            continue  # several critics' classes are the generator's own (no <Family>ForTokenClassification)
        auto = transformers.AutoModelForImageTextToText if "text_config" in written else transformers.AutoModelForCausalLM
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _, info = auto.from_pretrained(str(out), dtype=torch.float32, output_loading_info=True)
        assert not info["missing_keys"] and not info["mismatched_keys"], info
        assert all(k.startswith("mtp.") for k in info["unexpected_keys"]), info  # Qwen3.5's, ignored as by transformers
