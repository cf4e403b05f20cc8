"""check / describe / plan / presets / Layout: the words of the `megadsl` tool, from Python."""

import pickle

import pytest

import megadsl


def test_check_rejects_tp_3_with_the_rule_and_the_alternatives():
    ok, message = megadsl.check("llama3-8b", tp=3)
    assert not ok
    assert "heads_divisible_by_tp" in message
    assert "valid tp: 1, 2, 4, 8, 16, 32" in message


def test_check_accepts_a_valid_layout():
    ok, message = megadsl.check("llama3-8b", tp=8, pp=4, sp=True)
    assert ok, message
    assert message == "ok: llama3-8b at tp=8 pp=4 vpp=1 sp=on rmpad=off is valid"


def test_check_takes_a_layout_object_and_facts():
    assert megadsl.check("llama3-8b", megadsl.Layout(tp=2, pp=2))[0]
    ok, message = megadsl.check("llama3-8b", megadsl.Layout(tp=2, pp=2), world=6)
    assert not ok and "world" in message
    with pytest.raises(TypeError, match="not both"):
        megadsl.check("llama3-8b", megadsl.Layout(tp=2), pp=2)
    with pytest.raises(TypeError, match="unknown keyword 'tensor_parallel'"):
        megadsl.check("llama3-8b", tensor_parallel=2)


def test_check_an_hf_directory(gqa):
    assert megadsl.check(gqa, tp=2, pp=2)[0]
    ok, message = megadsl.check(str(gqa), tp=8)
    assert not ok and "heads_divisible_by_tp" in message


def test_an_unknown_model_is_a_value_error_with_a_suggestion():
    with pytest.raises(ValueError, match="did you mean llama3-8b"):
        megadsl.check("llama3-8c")


def test_describe_shows_the_shard_plan():
    text = megadsl.describe("llama3-8b", tp=4)
    assert "layers.{layer}.qkv.weight" in text
    assert "(1536, 4096)" in text  # the fused QKV shard of one tp rank
    assert "fused QKV per tp rank" in text
    with pytest.raises(ValueError, match="heads_divisible_by_tp"):
        megadsl.describe("llama3-8b", tp=3)


def test_describe_a_critic():
    assert "critic (value head h -> 1, with bias)" in megadsl.describe("llama3-8b", tp=2, critic=True)


def test_plan_reports_memory_and_flops():
    text = megadsl.plan("llama3-8b", tp=8, pp=4, sp=True, seq=8192)
    assert text.startswith("megadsl plan: llama3-8b (actor, lm_head)")
    assert "seq 8,192" in text and "Model state per rank" in text and "Activations per tp rank" in text
    assert text == megadsl.plan("llama3-8b", megadsl.Layout(tp=8, pp=4, sp=True), seq=8192)
    assert text != megadsl.plan("llama3-8b", tp=8, pp=4, sp=True, seq=4096)
    with pytest.raises(ValueError, match="pp"):
        megadsl.plan("llama3-8b", pp=7)
    assert "recompute selective <- this layout" in megadsl.plan("llama3-8b", tp=8, sp=True, recompute="selective")


def test_presets():
    assert "llama3-8b" in megadsl.presets()
    assert "llama3-8b" in megadsl.presets_table()


def test_layout_value_type():
    l = megadsl.Layout(tp=2, sp=True)
    assert (l.tp, l.pp, l.vpp, l.sp, l.rmpad) == (2, 1, 1, True, False)
    assert repr(l) == "Layout(tp=2, pp=1, vpp=1, sp=True, rmpad=False)"
    assert l == megadsl.Layout(tp=2, sp=True) and l != megadsl.Layout(tp=2)
    assert pickle.loads(pickle.dumps(l)) == l
    l.pp = 4
    assert l.model_parallel_size == 8
    r = megadsl.Layout(tp=2, recompute="selective")
    assert r.recompute == "selective" and r != megadsl.Layout(tp=2)
    assert repr(r) == 'Layout(tp=2, pp=1, vpp=1, sp=False, rmpad=False, recompute="selective")'
    assert pickle.loads(pickle.dumps(r)) == r
    r.recompute = "full"
    assert r.recompute == "full"
    with pytest.raises(ValueError, match="recompute"):
        megadsl.Layout(recompute="sometimes")


def test_read_hf_config(gqa):
    c = megadsl.read_hf_config(gqa)
    assert c["model_type"] == "llama"
    assert ".hidden = 64" in c["shape"]
