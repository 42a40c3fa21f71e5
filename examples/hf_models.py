"""Hugging Face ``transformers`` models built from a config: random weights, nothing downloaded.

Needs ``pip install doppler[hf]``.

    doppler graph import examples/hf_models.py:llama -o llama.json
    doppler graph import examples/hf_models.py:gpt2 -o gpt2.json
    doppler graph import examples/hf_models.py:llama2_7b -o llama2_7b.json --devices 4

``llama2_7b``, ``mistral_7b`` and ``llama3_8b`` are the real sizes, built on the meta device: no weight
is allocated, and the graph is cost-only (its ops, FLOPs, bytes and modules, but no values to execute).
Each model is the stock ``*ForCausalLM`` with its default ``use_cache``; the importer exports its logits.
"""

from __future__ import annotations

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
