# The shard plan of Llama-3-8B at tp 4: fused QKV, row-parallel o_proj/down, fused gate/up and the
# vocab-sharded embedding and LM head over the padded vocab.
include(${CMAKE_CURRENT_LIST_DIR}/../cli_lib.cmake)
megadsl(describe llama3-8b --tp 4)
expect_exit(0)
expect_no_err(".")
expect_out("vocab: 128256 padded to 128512 ")
expect_out("\n  embed\\.weight +model\\.embed_tokens\\.weight +vocab +\\(128256, 4096\\) +\\(128512, 4096\\) +dim 0 +\\(32128, 4096\\) +pp 0\n")
expect_out("\n  layers\\.{layer}\\.qkv\\.weight +model\\.layers\\.{layer}\\.self_attn\\.q_proj\\.weight +fused q/k/v +\\(4096, 4096\\) +\\(6144, 4096\\) +dim 0 +\\(1536, 4096\\) ")
expect_out("\n +model\\.layers\\.{layer}\\.self_attn\\.k_proj\\.weight +\\(1024, 4096\\)\n")
expect_out("\n  layers\\.{layer}\\.o_proj\\.weight +model\\.layers\\.{layer}\\.self_attn\\.o_proj\\.weight +row +\\(4096, 4096\\) +\\(4096, 4096\\) +dim 1 +\\(4096, 1024\\) ")
expect_out("\n  layers\\.{layer}\\.gate_up\\.weight +model\\.layers\\.{layer}\\.mlp\\.gate_proj\\.weight +fused gate/up +\\(14336, 4096\\) +\\(28672, 4096\\) +dim 0 +\\(7168, 4096\\) ")
expect_out("\n  layers\\.{layer}\\.down\\.weight +model\\.layers\\.{layer}\\.mlp\\.down_proj\\.weight +row +\\(4096, 14336\\) +\\(4096, 14336\\) +dim 1 +\\(4096, 3584\\) ")
expect_out("\n  lm_head\\.weight +lm_head\\.weight +vocab +\\(128256, 4096\\) +\\(128512, 4096\\) +dim 0 +\\(32128, 4096\\) +pp 0\n")
expect_out("embeddings: untied")
expect_out("parameters: 8,030,261,248 ")
# Per-rank fused QKV: 2 kv groups of [4 q | k | v] heads on each of the 4 ranks.
expect_out("\n  tp rank +kv groups +q heads/group +q heads +kv heads +rows\n")
expect_out("\n  0 +2 +4 +0-7 +0-1 +1536\n")
expect_out("\n  3 +2 +4 +24-31 +6-7 +1536\n")
# Pipeline: one stage holding every layer.
expect_out("\n  0 +0 +0 +0-31 +32 +embed\\.weight, final_norm\\.weight, lm_head\\.weight\n")
