"""Published ``config.json`` files of models servesim ships, as literals (no file is read).

Each entry is the subset of the model's Hugging Face ``config.json`` (https://huggingface.co/
<repository>/blob/main/config.json) that `simulator.hf_models.spec_from_hf_config` reads, with
the published values, and goes through that same reader, so a user's config.json and the catalog
take one path. Keys left out change nothing servesim computes (token ids, RoPE bases, norm
epsilons, router training losses). Values were written from the published files as this author
knows them, without network access while writing; the ones marked UNVERIFIED below should be
checked against the file before a table or an experiment leans on them.

Deliberate departures from the files (each also in the entry's comment):

* ``quantization_config`` is left out of gpt-oss (its experts are MXFP4 in the checkpoint, a
  format servesim does not model: the entries serve bf16 unless ``weights:`` says otherwise) and
  of DeepSeek-V3 (block-wise FP8 in the checkpoint: give ``weights: fp8`` to serve it so).
* Gemma 3 is the text model only (the ``vision_config`` tower is not modelled).
"""

from __future__ import annotations

#: catalog name -> (Hugging Face repository, config.json subset)
HF_CONFIGS: dict[str, tuple[str, dict]] = {
    "qwen3-8b": ("Qwen/Qwen3-8B", {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "attention_bias": False, "use_sliding_window": False,
    }),
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
        "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
        "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": False,
        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "use_sliding_window": False,
    }),
    # Mixtral-8x7B-v0.1: "sliding_window": null in the published file (full attention).
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-v0.1", {
        "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
        "max_position_embeddings": 32768, "tie_word_embeddings": False,
        "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None,
    }),
    # MLA + MoE; q_lora_rank null (plain query projection); fits one GPU.
    "deepseek-v2-lite": ("deepseek-ai/DeepSeek-V2-Lite", {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": 2048, "intermediate_size": 10944, "num_hidden_layers": 27,
        "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 102400,
        "max_position_embeddings": 163840, "tie_word_embeddings": False,
        "kv_lora_rank": 512, "q_lora_rank": None, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
        "n_shared_experts": 2, "num_experts_per_tok": 6, "moe_intermediate_size": 1408,
        "first_k_dense_replace": 1, "moe_layer_freq": 1,
    }),
    # 671B total, 37B active (without the MTP layer, num_nextn_predict_layers: 1, not served
    # here); the checkpoint's block-wise FP8 quantization_config is left out (see above).
    "deepseek-v3": ("deepseek-ai/DeepSeek-V3", {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
        "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 61,
        "num_attention_heads": 128, "num_key_value_heads": 128, "vocab_size": 129280,
        "max_position_embeddings": 163840, "tie_word_embeddings": False,
        "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 256,
        "n_shared_experts": 1, "num_experts_per_tok": 8, "moe_intermediate_size": 2048,
        "first_k_dense_replace": 3, "moe_layer_freq": 1,
    }),
    # Alternating sliding (128 tokens) / full layers, sliding first; attention sinks; MXFP4
    # experts in the checkpoint (left out, see above).
    "gpt-oss-20b": ("openai/gpt-oss-20b", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 201088, "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
        "attention_bias": True,
        "layer_types": ["sliding_attention", "full_attention"] * 12,
    }),
    "gpt-oss-120b": ("openai/gpt-oss-120b", {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 36,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "vocab_size": 201088, "max_position_embeddings": 131072, "tie_word_embeddings": False,
        "num_local_experts": 128, "num_experts_per_tok": 4, "sliding_window": 128,
        "attention_bias": True,
        "layer_types": ["sliding_attention", "full_attention"] * 18,
    }),
    # google/gemma-3-27b-it: the text_config of Gemma3ForConditionalGeneration. vocab_size,
    # max_position_embeddings and sliding_window_pattern are Gemma3TextConfig's defaults (the
    # published file leaves them out; UNVERIFIED that it does not set them). Every 6th layer is
    # global: 10 full + 52 sliding (window 1024).
    "gemma-3-27b": ("google/gemma-3-27b-it", {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {
            "model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
            "num_hidden_layers": 62, "num_attention_heads": 32, "num_key_value_heads": 16,
            "head_dim": 128, "sliding_window": 1024, "vocab_size": 262208,
            "max_position_embeddings": 131072, "sliding_window_pattern": 6,
        },
    }),
}  # fmt: skip

__all__ = ["HF_CONFIGS"]
