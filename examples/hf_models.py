"""Hugging Face ``transformers`` models built from a config: random weights, nothing downloaded.

Needs ``pip install doppler[hf]``.

    doppler graph import examples/hf_models.py:llama -o llama.json
    doppler graph import examples/hf_models.py:gpt2 -o gpt2.json
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
