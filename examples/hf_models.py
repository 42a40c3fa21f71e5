"""Hugging Face ``transformers`` models built from a config: random weights, nothing downloaded.

Needs ``pip install doppler[hf]``.

    doppler graph import examples/hf_models.py:llama -o llama.json
    doppler graph import examples/hf_models.py:gpt2 -o gpt2.json
    doppler graph import examples/hf_models.py:llama2_7b -o llama2_7b.json --devices 4

``llama2_7b``, ``mistral_7b`` and ``llama3_8b`` are the real sizes, built on the meta device: no weight
is allocated, and the graph is cost-only (its ops, FLOPs, bytes and modules, but no values to execute).
Each model is the stock ``*ForCausalLM`` with its default ``use_cache``; the importer exports its logits.

``llama_58m``, ``qwen2_58m`` and ``tiny_llama`` run with their own weights (docs/run_weights.md): each is
built with its parameters on the meta device and its buffers real
(:func:`doppler.importer.parameters_on_meta`), so the graph records the rotary tables and
``doppler execute --weights`` loads the weights; the same factory is the ``--reference`` of
``execute --check``. ``python examples/hf_models.py save NAME DIR`` writes that model with random weights
as ``save_pretrained`` does (sharded safetensors).

:data:`ARCHITECTURES` lists stock causal-LM architectures of ``transformers`` at a tiny size (2 layers, dim 64,
vocabulary 1000), each a factory of the same name here (``examples/hf_models.py:tiny_phi3``), built like
``tiny_llama``; ``benchmarks/hf_weights_sweep.py`` runs each through import, placement and a checked run.
"""

from __future__ import annotations

import sys

import torch


def llama(layers: int = 2, dim: int = 128, heads: int = 4, hidden: int = 344, vocab: int = 512, seq_len: int = 32):
    """A small ``LlamaForCausalLM`` and a batch of token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=4 * seq_len,
                      attn_implementation="sdpa", use_cache=False)  # fmt: skip
    model = LlamaForCausalLM(cfg).eval()
    return model, (torch.randint(0, vocab, (1, seq_len)),)


def gpt2(layers: int = 2, dim: int = 128, heads: int = 4, vocab: int = 512, seq_len: int = 32):
    """A small ``GPT2LMHeadModel`` and a batch of token ids."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=vocab, n_embd=dim, n_layer=layers, n_head=heads, n_positions=4 * seq_len,
                     bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", use_cache=False)  # fmt: skip
    model = GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, vocab, (1, seq_len)),)


def gqa_llama(layers: int = 2, dim: int = 128, heads: int = 8, kv_heads: int = 2, hidden: int = 344, vocab: int = 512,
              seq_len: int = 32, meta: bool = False):  # fmt: skip
    """A small ``LlamaForCausalLM`` with grouped-query attention (``kv_heads`` < ``heads``), its default
    ``use_cache``; on the meta device when ``meta``."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=dim, intermediate_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4 * seq_len,
                      attn_implementation="sdpa")  # fmt: skip
    return _built(LlamaForCausalLM, cfg, seq_len, "meta" if meta else "cpu", torch.float32)


def llama2_7b(seq_len: int = 2048, layers: int = 32):
    """LLaMA-2-7B (``LlamaForCausalLM``: dim 4096, 32 heads, hidden 11008, vocab 32000), float16, on the meta
    device, and one sequence of ``seq_len`` token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, rope_theta=10000.0, attn_implementation="sdpa")  # fmt: skip
    return _built(LlamaForCausalLM, cfg, seq_len)


def mistral_7b(seq_len: int = 2048, layers: int = 32):
    """Mistral-7B v0.1 (``MistralForCausalLM``: dim 4096, 32 query heads over 8 key/value heads, hidden 14336,
    vocab 32000, a sliding window of 4096 positions), float16, on the meta device, and ``seq_len`` token ids.
    Up to ``seq_len`` 4096 the window is the causal mask."""
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=32768,
                        rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4096, attn_implementation="sdpa")  # fmt: skip
    return _built(MistralForCausalLM, cfg, seq_len)


def llama3_8b(seq_len: int = 2048, layers: int = 32):
    """Llama-3-8B (``LlamaForCausalLM``: dim 4096, 32 query heads over 8 key/value heads, hidden 14336, vocab
    128256, rope theta 500000), float16, on the meta device, and ``seq_len`` token ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, rope_theta=500000.0, attn_implementation="sdpa")  # fmt: skip
    return _built(LlamaForCausalLM, cfg, seq_len)


def _built(model_cls, cfg, seq_len: int, device: str = "meta", dtype: torch.dtype = torch.float16):
    """``model_cls(cfg)`` built on ``device`` in ``dtype`` (on the meta device no weight memory is allocated),
    and one sequence of ``seq_len`` token ids there."""
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(cfg).to(dtype).eval()
    if device == "meta":
        return model, (torch.empty((1, seq_len), dtype=torch.long, device="meta"),)
    return model, (torch.randint(0, cfg.vocab_size, (1, seq_len)),)


# ----------------------------------------------------------------- models run with their own weights
#: name -> (config class, model class, config arguments, sequence length): LLaMA- and Qwen2-style causal LMs
#: of 58 M parameters (232 MB in float32), a tiny LLaMA for quick runs, Falcon (multi-query attention), GPT-J
#: (an interleaved rotary embedding) and BLOOM (ALiBi) causal LMs of about 0.1 B parameters, and GPT-Neo-125M's
#: configuration
RUNNABLE = {
    "llama_58m": ("LlamaConfig", "LlamaForCausalLM",
                  dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=8), 32),
    "qwen2_58m": ("Qwen2Config", "Qwen2ForCausalLM",
                  dict(vocab_size=32000, hidden_size=512, intermediate_size=1376, num_hidden_layers=8,
                       num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=False), 32),
    "tiny_llama": ("LlamaConfig", "LlamaForCausalLM",
                   dict(vocab_size=512, hidden_size=64, intermediate_size=176, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True), 16),
    "falcon_97m": ("FalconConfig", "FalconForCausalLM",
                   dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        bos_token_id=1, eos_token_id=2), 32),
    "gptj_106m": ("GPTJConfig", "GPTJForCausalLM",
                  dict(vocab_size=32000, n_embd=768, n_layer=8, n_head=12, rotary_dim=32, tie_word_embeddings=False,
                       bos_token_id=1, eos_token_id=2), 32),
    "bloom_96m": ("BloomConfig", "BloomForCausalLM",
                  dict(vocab_size=32000, hidden_size=768, n_layer=10, n_head=12, attn_implementation="eager"), 32),
    "gpt_neo_125m": ("GPTNeoConfig", "GPTNeoForCausalLM",
                     dict(vocab_size=50257, hidden_size=768, num_layers=12, num_heads=12, window_size=256,
                          attention_types=[[["global", "local"], 6]], max_position_embeddings=2048,
                          attn_implementation="eager"), 32),
}  # fmt: skip


#: the size every tiny architecture shares (names through each config's ``attribute_map``: GPT-2's ``n_embd`` is
#: ``hidden_size``); token ids 0-2 are the special tokens, inside the vocabulary. Attention runs through
#: ``scaled_dot_product_attention`` unless an architecture that has no such path names ``"eager"``
TINY = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
#: name -> (config class, model class, config arguments besides :data:`TINY`): stock causal LMs at a tiny size,
#: each with what sets it apart (grouped or multi-query attention, biases, a partial or interleaved rotary
#: embedding, ALiBi, QK norms, logit soft-capping, parallel blocks, tied or untied heads, mixtures of experts)
ARCHITECTURES = {
    "tiny_gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    "tiny_opt": ("OPTConfig", "OPTForCausalLM", dict(ffn_dim=128, word_embed_proj_dim=64)),
    "tiny_phi": ("PhiConfig", "PhiForCausalLM", dict(num_key_value_heads=4)),
    "tiny_phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_gemma": ("GemmaConfig", "GemmaForCausalLM", dict(num_key_value_heads=1, head_dim=16)),
    "tiny_gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(num_key_value_heads=2, head_dim=16,
                                                              attn_implementation="eager")),
    "tiny_gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_stablelm": ("StableLmConfig", "StableLmForCausalLM", dict(num_key_value_heads=2)),
    "tiny_falcon": ("FalconConfig", "FalconForCausalLM", {}),
    "tiny_bloom": ("BloomConfig", "BloomForCausalLM", dict(attn_implementation="eager")),
    "tiny_gpt_bigcode": ("GPTBigCodeConfig", "GPTBigCodeForCausalLM", {}),
    "tiny_gptj": ("GPTJConfig", "GPTJForCausalLM", dict(rotary_dim=8)),
    "tiny_codegen": ("CodeGenConfig", "CodeGenForCausalLM", dict(rotary_dim=8)),
    "tiny_olmo": ("OlmoConfig", "OlmoForCausalLM", dict(num_key_value_heads=2)),
    "tiny_olmo2": ("Olmo2Config", "Olmo2ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_starcoder2": ("Starcoder2Config", "Starcoder2ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_granite": ("GraniteConfig", "GraniteForCausalLM", dict(num_key_value_heads=2)),
    "tiny_cohere": ("CohereConfig", "CohereForCausalLM", dict(num_key_value_heads=2)),
    "tiny_smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_llama_tied": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2, tie_word_embeddings=True)),
    "tiny_mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_key_value_heads=2, num_local_experts=4,
                                                                num_experts_per_tok=2)),
    "tiny_qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", dict(num_key_value_heads=2, num_experts=4,
                                                                    num_experts_per_tok=2, moe_intermediate_size=64,
                                                                    shared_expert_intermediate_size=128)),
    "tiny_gpt_neo": ("GPTNeoConfig", "GPTNeoForCausalLM", dict(attention_types=[[["global", "local"], 1]],
                                                            window_size=8, attn_implementation="eager")),
    "tiny_mpt": ("MptConfig", "MptForCausalLM", dict(d_model=64, n_heads=4, n_layers=2, expansion_ratio=2,
                                                    attn_implementation="eager")),
    "tiny_xglm": ("XGLMConfig", "XGLMForCausalLM", dict(d_model=64, ffn_dim=128, attention_heads=4, num_layers=2,
                                                       attn_implementation="eager")),
    "tiny_openai_gpt": ("OpenAIGPTConfig", "OpenAIGPTLMHeadModel", dict(attn_implementation="eager")),
    "tiny_ctrl": ("CTRLConfig", "CTRLLMHeadModel", dict(dff=128)),
    "tiny_biogpt": ("BioGptConfig", "BioGptForCausalLM", {}),
    "tiny_persimmon": ("PersimmonConfig", "PersimmonForCausalLM", {}),
    "tiny_nemotron": ("NemotronConfig", "NemotronForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_arcee": ("ArceeConfig", "ArceeForCausalLM", dict(num_key_value_heads=2)),
    "tiny_bitnet": ("BitNetConfig", "BitNetForCausalLM", dict(num_key_value_heads=2)),
    "tiny_glm": ("GlmConfig", "GlmForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_glm4": ("Glm4Config", "Glm4ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_helium": ("HeliumConfig", "HeliumForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_exaone4": ("Exaone4Config", "Exaone4ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_olmo3": ("Olmo3Config", "Olmo3ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_cohere2": ("Cohere2Config", "Cohere2ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_ernie4_5": ("Ernie4_5Config", "Ernie4_5ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_seed_oss": ("SeedOssConfig", "SeedOssForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_hunyuan": ("HunYuanDenseV1Config", "HunYuanDenseV1ForCausalLM", dict(num_key_value_heads=2, head_dim=16)),
    "tiny_falcon_gqa": ("FalconConfig", "FalconForCausalLM", dict(new_decoder_architecture=True, num_kv_heads=2)),
    "tiny_falcon_alibi": ("FalconConfig", "FalconForCausalLM", dict(alibi=True, multi_query=False,
                                                                    parallel_attn=False, bias=True)),
    "tiny_mistral_window": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2, sliding_window=4)),
    "tiny_llama_ctl": ("LlamaConfig", "LlamaForCausalLM", dict(num_key_value_heads=2)),
    "tiny_qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_key_value_heads=2)),
    "tiny_mistral": ("MistralConfig", "MistralForCausalLM", dict(num_key_value_heads=2)),
    "tiny_gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM", {}),
}  # fmt: skip
#: the sequence length of the tiny architectures
TINY_SEQ_LEN = 16


def _spec(name: str) -> tuple[str, str, dict, int]:
    """Model ``name``'s (config class, model class, config arguments, sequence length), from :data:`RUNNABLE`
    or :data:`ARCHITECTURES`."""
    if name in RUNNABLE:
        return RUNNABLE[name]
    config_cls, model_cls, args = ARCHITECTURES[name]
    return config_cls, model_cls, {**TINY, **args}, TINY_SEQ_LEN


def runnable(name: str, weights: bool = False):
    """Model ``name`` of :data:`RUNNABLE` or :data:`ARCHITECTURES`: with random weights (``weights``; seeded), else
    its parameters on the meta device and its buffers real; and one sequence of token ids (on the meta device
    when it has no weights)."""
    import transformers

    config_cls, model_cls, args, seq_len = _spec(name)
    cfg = getattr(transformers, config_cls)(**{"max_position_embeddings": 4 * seq_len, "attn_implementation": "sdpa",
                                               **args})  # (an architecture without sdpa names "eager")
    torch.manual_seed(0)
    if weights:
        return getattr(transformers, model_cls)(cfg).eval(), (torch.randint(0, cfg.vocab_size, (1, seq_len)),)
    from doppler.importer import parameters_on_meta

    with parameters_on_meta():
        model = getattr(transformers, model_cls)(cfg).eval()
    return model, (torch.empty((1, seq_len), dtype=torch.long, device="meta"),)


def llama_58m():
    """A 58 M-parameter ``LlamaForCausalLM`` (8 layers, dim 512, vocab 32000), parameters on the meta device."""
    return runnable("llama_58m")


def qwen2_58m():
    """A 58 M-parameter ``Qwen2ForCausalLM`` (8 layers, dim 512, 2 key/value heads, query/key/value biases),
    parameters on the meta device."""
    return runnable("qwen2_58m")


def falcon_97m():
    """A 97 M-parameter ``FalconForCausalLM`` (12 layers, dim 768, one key/value head), parameters on the meta
    device."""
    return runnable("falcon_97m")


def gptj_106m():
    """A 106 M-parameter ``GPTJForCausalLM`` (8 layers, dim 768, rotary on 32 of each head's 64 dimensions),
    parameters on the meta device."""
    return runnable("gptj_106m")


def bloom_96m():
    """A 96 M-parameter ``BloomForCausalLM`` (10 layers, dim 768, ALiBi), parameters on the meta device."""
    return runnable("bloom_96m")


def gpt_neo_125m():
    """GPT-Neo-125M's configuration (``GPTNeoForCausalLM``: 12 layers, dim 768, global and local attention
    layers in turn, vocab 50257), random weights, parameters on the meta device."""
    return runnable("gpt_neo_125m")


def tiny_llama():
    """A 0.1 M-parameter ``LlamaForCausalLM`` (2 layers, dim 64, a head tied to the embedding), parameters on
    the meta device."""
    return runnable("tiny_llama")


def _factory(name: str):
    def factory():
        return runnable(name)

    factory.__name__ = factory.__qualname__ = name
    factory.__doc__ = f"A tiny ``{ARCHITECTURES[name][1]}``, parameters on the meta device."
    return factory


for _name in ARCHITECTURES:
    globals()[_name] = _factory(_name)


def save(name: str, out_dir: str, max_shard_size: str = "50MB") -> None:
    """Write model ``name`` with random weights to ``out_dir`` as ``save_pretrained`` does: safetensors, sharded
    at ``max_shard_size`` with a ``model.safetensors.index.json``."""
    model, _ = runnable(name, weights=True)
    model.save_pretrained(out_dir, max_shard_size=max_shard_size)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "save" or sys.argv[2] not in {**RUNNABLE, **ARCHITECTURES}:
        sys.exit(f"usage: python {sys.argv[0]} save {{{','.join([*RUNNABLE, *ARCHITECTURES])}}} DIR [MAX_SHARD_SIZE]")
    save(*sys.argv[2:])
