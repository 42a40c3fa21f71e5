"""Example model factories for ``doppler graph import`` (copy one and adapt it).

A factory is a function with no required arguments that returns ``(module, example_inputs)``:
the module in eval mode, and a tuple of example tensors whose shapes the graph is built for.

    doppler graph import examples/models.py:llama_block -o block.json --blocks 256=2
"""

from __future__ import annotations


import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaBlock(nn.Module):
    """One LLaMA decoder block: RMSNorm, rotary causal self-attention, RMSNorm, SwiGLU MLP."""

    def __init__(self, dim: int = 256, n_heads: int = 4, hidden: int = 688, seq_len: int = 64, theta: float = 1e4) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.attn_norm, self.mlp_norm = RMSNorm(dim), RMSNorm(dim)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim, bias=False) for _ in range(4))
        self.w_gate, self.w_up = nn.Linear(dim, hidden, bias=False), nn.Linear(dim, hidden, bias=False)
        self.w_down = nn.Linear(hidden, dim, bias=False)
        inv = theta ** (-torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        ang = torch.arange(seq_len, dtype=torch.float32)[:, None] * inv[None, :]
        emb = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", emb.cos())
        self.register_buffer("sin", emb.sin())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        h = self.attn_norm(x)
        q = self.wq(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(h).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        q = q * self.cos + _rotate_half(q) * self.sin
        k = k * self.cos + _rotate_half(k) * self.sin
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.wo(att.transpose(1, 2).reshape(b, s, d))
        h = self.mlp_norm(x)
        return x + self.w_down(F.silu(self.w_gate(h)) * self.w_up(h))


class MLP(nn.Module):
    """Two linear layers with a GELU between them, then a layer norm."""

    def __init__(self, d_in: int = 256, d_hidden: int = 1024, d_out: int = 256) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out)
        self.norm = nn.LayerNorm(d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.fc2(F.gelu(self.fc1(x))))


def llama_block(dim: int = 256, n_heads: int = 4, hidden: int = 688, seq_len: int = 64, batch: int = 1):
    """A LLaMA decoder block and a (batch, seq_len, dim) input."""
    torch.manual_seed(0)
    return LlamaBlock(dim, n_heads, hidden, seq_len).eval(), (torch.randn(batch, seq_len, dim),)


def mlp(batch: int = 64, d_in: int = 256, d_hidden: int = 1024, d_out: int = 256):
    """An MLP and a (batch, d_in) input."""
    torch.manual_seed(0)
    return MLP(d_in, d_hidden, d_out).eval(), (torch.randn(batch, d_in),)
