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
#: of 58 M parameters (232 MB in float32), and a tiny LLaMA for quick runs
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
}  # fmt: skip


def runnable(name: str, weights: bool = False):
    """Model ``name`` of :data:`RUNNABLE`: with random weights (``weights``; seeded), else its parameters on the
    meta device and its buffers real; and one sequence of token ids (on the meta device when it has no weights)."""
    import transformers

    config_cls, model_cls, args, seq_len = RUNNABLE[name]
    cfg = getattr(transformers, config_cls)(**args, max_position_embeddings=4 * seq_len, attn_implementation="sdpa")
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


def tiny_llama():
    """A 0.1 M-parameter ``LlamaForCausalLM`` (2 layers, dim 64, a head tied to the embedding), parameters on
    the meta device."""
    return runnable("tiny_llama")


def save(name: str, out_dir: str, max_shard_size: str = "50MB") -> None:
    """Write model ``name`` with random weights to ``out_dir`` as ``save_pretrained`` does: safetensors, sharded
    at ``max_shard_size`` with a ``model.safetensors.index.json``."""
    model, _ = runnable(name, weights=True)
    model.save_pretrained(out_dir, max_shard_size=max_shard_size)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "save" or sys.argv[2] not in RUNNABLE:
        sys.exit(f"usage: python {sys.argv[0]} save {{{','.join(RUNNABLE)}}} DIR [MAX_SHARD_SIZE]")
    save(*sys.argv[2:])
