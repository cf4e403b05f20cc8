"""The second hostile probe's defects (issue 51), each as a caller meets it: a checkpoint whose fused
parts are stored in different dtypes, the text weights under two prefixes, a distributed
checkpoint's HF extras tampered with or deleted, a save into a folder holding the source, a save
with the optimizer offloaded, a bucket size of inf, and the module importable from the project's
environment."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import megadsl
from helpers import lp_valid, max_diff

ROOT = Path(__file__).resolve().parents[2]


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("critic", "reference.safetensors"))
    return dst


def _transformers_log_probs(path, ids, mask):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        logp = model(input_ids=ids, attention_mask=mask).logits.float().log_softmax(-1)
    out = torch.zeros(ids.shape, dtype=torch.float32)
    out[:, :-1] = logp[:, :-1].gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return out


def test_fused_parts_keep_their_own_dtype(gqa, reference, tmp_path):
    """gate_proj in bf16 beside an fp32 up_proj, q_proj in fp16 beside fp32 k/v: megadsl's fused
    gate/up and qkv used to take the first part's dtype, rounding the others (log-probs 2.2e-3 off
    transformers); now each part is read at its own precision."""
    path = _copy(gqa, tmp_path / "mixed")
    weights = load_file(str(path / "model.safetensors"))
    for name in list(weights):
        if name.endswith("mlp.gate_proj.weight"):
            weights[name] = weights[name].to(torch.bfloat16)
        if name.endswith("self_attn.q_proj.weight"):
            weights[name] = weights[name].to(torch.float16)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    ids, mask = reference["left.input_ids"], reference["left.attention_mask"]
    want = _transformers_log_probs(str(path), ids, mask)
    with torch.no_grad():
        got = megadsl.Model.from_hf(path).forward(ids, mask)["log_probs"]
    assert max_diff(got, want, lp_valid(mask)) < 1e-5
    # convert --dtype fp32 writes the fp32 parts as stored, not rounded through another part's dtype
    out = tmp_path / "fp32"
    subprocess.run([str(ROOT / "build" / "tools" / "megadsl"), "convert", "--from", str(path), "--to", str(out),
                    "--to-format", "hf", "--dtype", "fp32"], check=True, capture_output=True)
    written = load_file(str(out / "model.safetensors"))
    for name, t in weights.items():
        if name.endswith("up_proj.weight") or name.endswith("k_proj.weight"):
            assert torch.equal(written[name], t), name
        if name.endswith("gate_proj.weight") or name.endswith("q_proj.weight"):
            assert torch.equal(written[name], t.float()), name


def test_a_bucket_of_inf_megabytes_is_named(gqa):
    model = megadsl.Model.from_hf(gqa)
    with pytest.raises(ValueError, match=r"bucket_mb is the size of a bucket in MB, a finite number above 0, got inf"):
        next(iter(model.export_weights(bucket_mb=float("inf"))))
    assert len(dict(model.export_weights(bucket_mb=1e300))) > 0  # huge but finite: one bucket


def test_the_module_imports_from_the_projects_environment():
    """scripts/build.sh puts the build's module on .venv's path: no PYTHONPATH needed."""
    python = ROOT / ".venv" / "bin" / "python"
    if not python.exists():
        pytest.skip("no .venv (scripts/setup.sh makes it)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([str(python), "-c", "import megadsl; print(megadsl.__file__)"], env=env, cwd="/",
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().startswith(str(ROOT / "build" / "python")), out.stdout


def test_text_weights_under_both_prefixes_are_refused_naming_both(fixtures, tmp_path):
    """A multimodal checkpoint holding its text model under language_model.model.* and again, with
    other values, under model.language_model.*: megadsl took the copy transformers does not (log-probs
    9.6 off, exit 0); now it names both prefixes."""
    path = _copy(fixtures / "gemma3-vl-tf5", tmp_path / "twice")
    weights = load_file(str(path / "model.safetensors"))
    for name in [n for n in weights if n.startswith("language_model.model.")]:
        weights["model.language_model." + name[len("language_model.model."):]] = weights[name] * 2
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(RuntimeError, match=r"holds the text model twice, under model\.language_model\.\* \(\d+ "
                                           r"tensors\) and language_model\.model\.\* \(\d+ tensors\)"):
        megadsl.Model.from_hf(path)


def test_a_distributed_checkpoints_hf_files_are_listed_and_checked(fixtures, tmp_path):
    """hf/ (tokenizer, configs, a multimodal source's vision tower) is in metadata.json with sizes and
    checksums, as the pieces are: a flipped byte in hf/multimodal.safetensors used to convert back
    with a changed vision weight, and deleting it turned a Gemma 3 checkpoint into a text-only one."""
    model = megadsl.Model.from_hf(fixtures / "gemma3-vl-tf5")
    ckpt = tmp_path / "ckpt"
    model.save_distributed(ckpt)
    listed = {f["file"] for f in json.loads((ckpt / "metadata.json").read_text())["hf_files"]}
    assert {"hf/config.json", "hf/multimodal.safetensors"} <= listed
    fresh = megadsl.Model.from_hf(fixtures / "gemma3-vl-tf5")
    fresh.load_distributed(ckpt)  # untouched: loads
    extra = ckpt / "hf" / "multimodal.safetensors"
    data = bytearray(extra.read_bytes())
    data[-3] ^= 0x40
    extra.write_bytes(bytes(data))
    with pytest.raises(RuntimeError, match=r"hf/multimodal\.safetensors fails its checksum \(fnv1a64 [0-9a-f]{16}, "
                                           r"metadata\.json records [0-9a-f]{16}\); the file is corrupted"):
        fresh.load_distributed(ckpt)
    extra.unlink()
    with pytest.raises(RuntimeError, match=r"hf/multimodal\.safetensors is missing .*metadata\.json lists it"):
        fresh.load_distributed(ckpt)
    out = tmp_path / "hf-out"
    code = subprocess.run([str(ROOT / "build" / "tools" / "megadsl"), "convert", "--from", str(ckpt), "--to", str(out)],
                          capture_output=True, text=True)
    assert code.returncode == 1 and "hf/multimodal.safetensors is missing" in code.stderr and not out.exists()


def test_a_save_into_a_folder_holding_the_source_is_refused(gqa, tmp_path):
    """save_hf("par") of a model loaded from par/model, and convert --from par/model --to par, used to
    exit 0 with par/model gone (README.md included): the target replaced whole. Now both refuse, by
    real path (through a symbolic link too), and the source is untouched."""
    par = tmp_path / "par"
    source = _copy(gqa, par / "model")
    (source / "README.md").write_text("keep me")
    before = sorted(p.name for p in source.iterdir())
    model = megadsl.Model.from_hf(source)
    with pytest.raises(RuntimeError, match=r"it holds .*par/model, the model's source, and saving replaces the whole "
                                           r"directory, which would delete it"):
        model.save_hf(par)
    (tmp_path / "link").symlink_to(par)
    with pytest.raises(RuntimeError, match=r"it holds .*par/model, the model's source"):
        model.save_hf(tmp_path / "link")
    with pytest.raises(RuntimeError, match=r"it is inside .*par/model, the model's source; write outside it"):
        model.save_hf(source / "sub")
    out = subprocess.run([str(ROOT / "build" / "tools" / "megadsl"), "convert", "--from", str(source), "--to", str(par),
                          "--to-format", "hf"], capture_output=True, text=True)
    assert out.returncode == 2 and "the model's source, and saving replaces the whole directory" in out.stderr, out.stderr
    assert sorted(p.name for p in source.iterdir()) == before and (source / "README.md").read_text() == "keep me"
    model.save_hf(tmp_path / "elsewhere")  # a directory beside it is fine


def test_saving_and_loading_with_offloaded_state_keeps_it(gqa, reference, tmp_path):
    """trainer.offload() then save_distributed(trainer=...) used to segfault: AdamW's moments were read
    from their emptied device storage. Now the host copies are saved (the same checkpoint as without
    offload), a load into an offloaded trainer leaves it offloaded, and training goes on alike."""
    from test_train import rollout

    def trained():
        model = megadsl.Model.from_hf(gqa)
        trainer = model.trainer(lr=1e-3)
        trainer.step(rollout(reference, model), microbatches=2)
        return model, trainer

    model, trainer = trained()
    model.save_distributed(tmp_path / "plain", trainer=trainer)
    trainer.offload()
    assert trainer.optimizer_bytes == 0
    model.save_distributed(tmp_path / "offloaded", trainer=trainer)
    assert trainer.optimizer_bytes == 0  # still offloaded after the save
    plain = load_file(str(tmp_path / "plain" / "rank_0.safetensors"))
    offloaded = load_file(str(tmp_path / "offloaded" / "rank_0.safetensors"))
    assert plain.keys() == offloaded.keys() and any("exp_avg" in k for k in plain)
    for k in plain:
        assert torch.equal(plain[k], offloaded[k]), k
    other, other_trainer = trained()
    other_trainer.offload()
    other.load_distributed(tmp_path / "offloaded", trainer=other_trainer)
    assert other_trainer.optimizer_bytes == 0
    other_trainer.reload()
    trainer.reload()
    batch = rollout(reference, model)
    assert other_trainer.step(batch, microbatches=2)["loss"] == trainer.step(batch, microbatches=2)["loss"]


def test_seed_oss_with_its_default_dropout_loads_and_infers_as_transformers_eval(fixtures, tmp_path):
    """Seed-OSS's config class defaults to 0.1 attention and residual dropout; a config.json that
    keeps them used to be refused ("megadsl has no dropout"). It loads now, with those rates for
    training steps, and its log-probs are transformers' eval-mode ones; dropout=False and a dict of
    the family's keys choose other rates, and convert writes the rates back."""
    path = _copy(fixtures / "seed-oss-tf5", tmp_path / "seed")
    config = json.loads((path / "config.json").read_text())
    del config["attention_dropout"], config["residual_dropout"]
    (path / "config.json").write_text(json.dumps(config))
    assert megadsl.read_hf_config(path)["dropout"] == {"attention": 0.1, "residual": 0.1, "embedding": 0.0}
    ref = load_file(str(fixtures / "seed-oss-tf5" / "reference.safetensors"))
    ids, mask = ref["left.input_ids"], ref["left.attention_mask"]
    want = _transformers_log_probs(str(path), ids, mask)
    model = megadsl.Model.from_hf(path)
    assert model.dropout == {"attention": 0.1, "residual": 0.1, "embedding": 0.0}
    with torch.no_grad():
        got = model.forward(ids, mask)["log_probs"]
    assert max_diff(got, want, lp_valid(mask)) < 1e-5
    assert megadsl.Model.from_hf(path, dropout=False).dropout == {"attention": 0.0, "residual": 0.0, "embedding": 0.0}
    assert megadsl.Model.from_hf(path, dropout={"residual_dropout": 0.0}).dropout["attention"] == 0.1
    with pytest.raises(ValueError, match=r"\"resid_pdrop\" is not a dropout key of Seed-OSS"):
        megadsl.Model.from_hf(path, dropout={"resid_pdrop": 0.0})
    out = tmp_path / "converted"
    subprocess.run([str(ROOT / "build" / "tools" / "megadsl"), "convert", "--from", str(path), "--to", str(out),
                    "--to-format", "hf"], check=True, capture_output=True)
    written = json.loads((out / "config.json").read_text())
    assert (written["attention_dropout"], written["residual_dropout"]) == (0.1, 0.1)
