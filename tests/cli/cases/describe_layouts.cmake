# describe under pipeline stages, kv replication, tied embeddings and a critic head.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)

# pp 2 x vpp 2: chunk j of pp rank r is stage j*pp + r.
megadsl(describe llama3-8b --tp 8 --pp 2 --vpp 2 --sp)
expect_exit(0)
expect_out("\n  0 +0 +0 +0-7 +8 +embed\\.weight\n")
expect_out("\n  1 +1 +0 +8-15 +8\n")
expect_out("\n  2 +0 +1 +16-23 +8\n")
expect_out("\n  3 +1 +1 +24-31 +8 +final_norm\\.weight, lm_head\\.weight\n")
expect_out("\n  0 +0-7, 16-23 +16 ")
expect_out("\n  1 +8-15, 24-31 +16 ")
expect_out("activations between blocks: \\(s/8, b, 4096\\) per tp rank")
expect_out("final_norm\\.weight .* pp 1, chunk 1 \\(stage 3\\)\n")

# tiny: 2 kv heads over tp 4, so each kv head is held by 2 ranks; vocab 1000 padded to 1024.
megadsl(describe tiny --tp 4)
expect_exit(0)
expect_out("\n  0 +1 +2 +0-1 +0 +128\n")
expect_out("\n  1 +1 +2 +2-3 +0 +128\n")
expect_out("\n  2 +1 +2 +4-5 +1 +128\n")
expect_out("kv_heads 2 < tp 4: each kv head is replicated on tp / kv_heads = 2 ranks")
expect_out("vocab: 1000 padded to 1024 ")

# Qwen2.5-0.5B: q/k/v bias and tied embeddings, with the last stage's copy under pp 2.
megadsl(describe qwen2.5-0.5b --tp 2 --pp 2)
expect_exit(0)
expect_out("\n  layers\\.{layer}\\.qkv\\.bias +model\\.layers\\.{layer}\\.self_attn\\.q_proj\\.bias +fused q/k/v +\\(896\\) ")
expect_out("\n  lm_head\\.weight +model\\.embed_tokens\\.weight \\(tied\\) ")
expect_out("embeddings: tied: lm_head is embed\\.weight; the last stage keeps a copy")
expect_out("vocab: 151936 padded to 152064 ")

# Critic: a value head, no LM head.
megadsl(describe llama3-8b --tp 2 --critic)
expect_exit(0)
expect_out("critic \\(value head h -> 1, with bias\\)")
expect_out("\n  value_head\\.weight +score\\.weight \\(\\*\\) +replicated +\\(1, 4096\\) ")
expect_out("\n  value_head\\.bias +score\\.bias \\(\\*\\) ")
expect_no_out("lm_head\\.weight +lm_head")
megadsl(describe llama3-8b --tp 2 --critic --no-value-bias)
expect_exit(0)
expect_no_out("value_head\\.bias")

# Context parallelism: tokens split over tp and cp, the attention's all-to-all named.
megadsl(describe llama3-8b --tp 2 --sp --cp 4)
expect_exit(0)
expect_out("activations between blocks: \\(s/8, b, 4096\\) per tp and cp rank")
expect_out("context parallel, cp 4: each cp rank runs 1/4 of the token stream[^\n]* 1 kv group\\(s\\) of q/k/v per cp rank")
megadsl(describe llama3-70b --tp 8 --cp 2)
expect_exit(0)
expect_out("to the whole stream of 4 query head\\(s\\) of one kv group per cp rank, that group's k and v all-gathered")
