"""A tiny local chat model for verl's own trainers (no hub here): a BPE tokenizer trained on the
conversations it will see, with a ChatML template, a small Llama (or a Qwen3-MoE mixture) of
random weights saved by transformers, and verl's SFT data as parquet (`messages` rows).

    python tiny_chat.py OUT [--moe]      # OUT/model (OUT/model/critic: with a value head),
                                         # OUT/train.parquet, OUT/val.parquet
"""

import argparse
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
WORDS = ["apples", "pears", "boxes", "stones", "birds", "coins", "cups", "trees"]


def conversations(n, seed):
    """n short arithmetic conversations of varied lengths, some with two turns."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b, w = rng.randint(2, 99), rng.randint(2, 99), rng.choice(WORDS)
        msgs = [{"role": "user", "content": f"I have {a} {w} and get {b} more. How many {w} do I have?"},
                {"role": "assistant", "content": f"You have {a} {w}, then {b} more: {a} plus {b} is {a + b} {w}."}]
        if i % 3 == 0:
            c = rng.randint(2, 9)
            msgs += [{"role": "user", "content": f"And {c} times as many?"},
                     {"role": "assistant", "content": f"{c} times {a + b} is {c * (a + b)} {w}."}]
        out.append(msgs)
    return out


def make_tokenizer(texts, out):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(out)
    return fast


def make_model(tokenizer, out, moe, seed, hidden=64, layers=4):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=hidden // 16, num_key_value_heads=hidden // 32, head_dim=16,
                  max_position_embeddings=512, rms_norm_eps=1e-6,
                  bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  tie_word_embeddings=False)
    if moe:
        config = Qwen3MoeConfig(**common, intermediate_size=96, moe_intermediate_size=48, num_experts=4,
                                num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
        model = Qwen3MoeForCausalLM(config)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, intermediate_size=2 * hidden))
    with torch.no_grad():  # larger than the init's 0.02, so a few steps move the numbers
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.08)
    model.save_pretrained(out, safe_serialization=True)
    # The critic: the same body with a value head (score, (1, h)), as a reward model's checkpoint
    # holds it; no classifier dropout, so a training step of it is deterministic.
    from transformers import AutoConfig, AutoModelForTokenClassification

    torch.manual_seed(seed + 1)
    config = AutoConfig.from_pretrained(out, num_labels=1)
    config.classifier_dropout = 0.0
    critic = AutoModelForTokenClassification.from_pretrained(out, config=config, dtype=torch.float32)
    critic.save_pretrained(Path(out) / "critic", safe_serialization=True)
    tokenizer.save_pretrained(Path(out) / "critic")


def make(out, moe=False, seed=7, hidden=64, layers=4, train=32):
    import pandas as pd
    from transformers.utils import logging

    logging.set_verbosity_error()  # the critic's load report (lm_head unused, score new) is expected
    out = Path(out)
    convs = conversations(train + 16, seed)
    texts = [m["content"] for c in convs for m in c] + SPECIAL
    tokenizer = make_tokenizer(texts, out / "model")
    make_model(tokenizer, out / "model", moe, seed, hidden, layers)
    pd.DataFrame({"messages": convs[:train]}).to_parquet(out / "train.parquet")
    pd.DataFrame({"messages": convs[train:]}).to_parquet(out / "val.parquet")
    return out


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--moe", action="store_true")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=4)
    a = p.parse_args()
    make(a.out, a.moe, hidden=a.hidden, layers=a.layers)
