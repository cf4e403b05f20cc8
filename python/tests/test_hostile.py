"""What a hostile or careless caller gets (issue 23): ranks that disagree end together with one
line naming what differs and where; a non-finite step is skipped, not applied; save_hf never
replaces the model's own directory and keeps its tokenizer; clear words for micro-batches."""

import json
import math
import re
import shutil
import time

import pytest
import torch

import helpers
import megadsl
from test_train import rollout, snapshot


@pytest.mark.parametrize(
    "kind, expected",
    [("length", r"the ranks were given batches of different shapes in forward: input_ids is 2 x 12 on rank 0, "
                r"2 x 10 on rank 1; every rank of a model replica \(its tp, pp and ep ranks\) must be given the same batch"),
     ("values", r"the ranks were given different batches in forward \(same shapes, other values\): checksum "
                r"[0-9a-f]{16} on rank 0, [0-9a-f]{16} on rank 1")])
def test_ranks_given_different_batches_all_end_naming_it(gqa, kind, expected):
    start = time.monotonic()
    with pytest.raises(megadsl.LaunchError) as e:
        megadsl.launch_local(2, helpers.forward_with_disagreeing_batches, str(gqa), kind, timeout=120)
    took = time.monotonic() - start
    print(f"{kind}: both ranks ended {took:.1f} s after the launch (processes started and models loaded)")
    # Every rank reports the agreement error itself: none was stopped, none hit a transport error.
    assert sorted(e.value.errors) == [0, 1]
    for rank, text in e.value.errors.items():
        assert "ValueError: megadsl: " in text, text
        first = text.splitlines()[0]
        assert re.search(expected, first), first


def test_ranks_asking_for_different_layouts_all_end_naming_them(gqa):
    start = time.monotonic()
    with pytest.raises(megadsl.LaunchError) as e:
        megadsl.launch_local(2, helpers.build_with_disagreeing_layouts, str(gqa), timeout=120)
    print(f"layouts: both ranks ended {time.monotonic() - start:.1f} s after the launch")
    assert sorted(e.value.errors) == [0, 1]
    for text in e.value.errors.values():
        assert ("megadsl: the ranks asked for different layouts: tp is 2 on rank 0, 1 on rank 1; "
                "every rank of the job must use the same layout") in text.splitlines()[0]


@pytest.mark.parametrize("field, value", [("advantages", math.nan), ("old_log_probs", math.nan), ("returns", math.inf)])
def test_a_non_finite_step_is_skipped_not_applied(gqa, reference, field, value):
    model = megadsl.Model.from_hf(gqa / "critic" if field == "returns" else gqa, critic=field == "returns")
    trainer = model.trainer(lr=1e-3)
    batch = rollout(reference, model)
    bad = dict(batch)
    bad[field] = batch[field].clone()
    bad[field][1, 5] = value
    before = snapshot(model)
    m = trainer.step(bad)
    assert m["skipped"] is True and not (math.isfinite(m["grad_norm"]) and math.isfinite(m["loss"]))
    after = model.parameters()
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step changed the parameters"
    assert trainer.steps == 0 and trainer.samples == 0 and trainer.skipped == 1
    good = trainer.step(batch)  # training goes on from the untouched state
    assert good["skipped"] is False and math.isfinite(good["loss"]) and trainer.steps == 1
    assert all(torch.isfinite(v).all() for v in model.parameters().values())


def test_more_micro_batches_than_sequences_say_so(gqa, reference):
    model = megadsl.Model.from_hf(gqa)
    batch = {k: v[:2] for k, v in rollout(reference, model).items()}
    with pytest.raises(ValueError, match=r"megadsl: 5 micro-batches do not fit the 2 sequence\(s\) of the batch: "
                                         r"every micro-batch needs at least one sequence; use at most 2 micro-batches"):
        model.trainer().step(batch, microbatches=5)


def test_save_hf_refuses_the_models_own_directory_and_keeps_its_files(gqa, tmp_path):
    src = tmp_path / "model"
    shutil.copytree(gqa, src)
    config = json.loads((src / "config.json").read_text())
    config.update(bos_token_id=1, eos_token_id=2)
    (src / "config.json").write_text(json.dumps(config))
    for name, text in [("tokenizer.json", '{"model": {}}'), ("README.md", "# my model\n"),
                       ("generation_config.json", '{"temperature": 0.7}')]:
        (src / name).write_text(text)
    before = {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()}
    model = megadsl.Model.from_hf(src)
    with pytest.raises(RuntimeError, match="is the directory this model was loaded from"):
        model.save_hf(src)
    assert {p.name: p.read_bytes() for p in src.iterdir() if p.is_file()} == before
    # Elsewhere, the tokenizer, generation settings and config.json's other fields come along.
    model.save_hf(tmp_path / "out")
    out = tmp_path / "out"
    assert (out / "tokenizer.json").read_text() == '{"model": {}}'
    assert (out / "generation_config.json").read_text() == '{"temperature": 0.7}'
    saved = json.loads((out / "config.json").read_text())
    assert saved["bos_token_id"] == 1 and saved["eos_token_id"] == 2
    # And through a distributed checkpoint: loaded into another model, saved as HF again.
    model.save_distributed(tmp_path / "dist")
    other = megadsl.Model.from_hf(gqa, tp=1)
    other.load_distributed(tmp_path / "dist")
    other.save_hf(tmp_path / "back")
    assert (tmp_path / "back" / "tokenizer.json").read_text() == '{"model": {}}'
    assert json.loads((tmp_path / "back" / "config.json").read_text())["eos_token_id"] == 2


def test_an_infinite_old_log_prob_is_clamped_as_verl_does(gqa, reference):
    """verl's policy loss clamps log(ratio) to [-20, 20], so a -inf old log-prob gives a finite,
    bounded loss rather than NaN: the step is applied, every parameter stays finite."""
    model = megadsl.Model.from_hf(gqa)
    batch = rollout(reference, model)
    batch["old_log_probs"] = batch["old_log_probs"].clone()
    batch["old_log_probs"][1, 5] = -math.inf
    m = model.trainer(lr=1e-3).step(batch)
    assert m["skipped"] is False and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    assert all(torch.isfinite(v).all() for v in model.parameters().values())
