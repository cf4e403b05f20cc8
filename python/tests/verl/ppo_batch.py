"""PPO batches as verl's trainer holds them after a rollout (a DataProto: left-padded prompts,
right-padded responses, attention and response masks, positions, the rollout engine's log-probs),
the responses a real sampled generation of the tiny chat model by transformers, the rollout's
log-probs those of a bf16 copy (a rollout engine's numerics), so rollout correction has work."""

import torch

import tiny_chat


def _prompts(tokenizer, n, seed):
    convs = tiny_chat.conversations(n, seed)
    return [tokenizer.apply_chat_template(c[:1], add_generation_prompt=True, tokenize=True, return_dict=False)
            for c in convs]


def make_batches(model_dir, count=2, rows=8, seed=11):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from verl import DataProto

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rollout = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    g = torch.Generator().manual_seed(seed)
    batches = []
    for b in range(count):
        prompts = [torch.tensor(p) for p in _prompts(tokenizer, rows, seed + b)]
        responses = []
        for i, p in enumerate(prompts):  # each row its own length, sampled at temperature 1
            torch.manual_seed(seed * 100 + b * rows + i)
            new = int(torch.randint(5, 15, (1,), generator=g))
            out = model.generate(p.unsqueeze(0), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=new,
                                 min_new_tokens=new, pad_token_id=pad, eos_token_id=None)
            responses.append(out[0, len(p):])
        P, R = max(len(p) for p in prompts), max(len(r) for r in responses)
        prompt_ids = torch.full((rows, P), pad)
        response_ids = torch.full((rows, R), pad)
        attention = torch.zeros(rows, P + R, dtype=torch.long)
        for i, (p, r) in enumerate(zip(prompts, responses)):
            prompt_ids[i, P - len(p):] = p
            response_ids[i, :len(r)] = r
            attention[i, P - len(p):P + len(r)] = 1
        input_ids = torch.cat([prompt_ids, response_ids], 1)
        position_ids = (attention.cumsum(1) - 1).clamp(min=0)
        response_mask = attention[:, P:].clone()
        with torch.no_grad():  # the rollout engine's log-probs of what it sampled (bf16)
            logits = rollout(input_ids=input_ids, attention_mask=attention, position_ids=position_ids).logits.float()
        logp = logits[:, P - 1:-1].log_softmax(-1).gather(-1, response_ids.unsqueeze(-1)).squeeze(-1)
        scores = torch.zeros(rows, R)
        for i, r in enumerate(responses):  # a rule-based reward on the last token
            scores[i, len(r) - 1] = float(len(set(r.tolist())) % 3) - 1.0
        batches.append(DataProto.from_dict(tensors={
            "prompts": prompt_ids, "responses": response_ids, "input_ids": input_ids, "attention_mask": attention,
            "position_ids": position_ids, "response_mask": response_mask, "rollout_log_probs": logp * response_mask,
            "token_level_scores": scores}, meta_info={"temperature": 1.0}))
    return batches
