"""A small Vision Transformer written out in plain torch (torchvision does not import here).

The LUMI course trains ``torchvision.models.vit_b_16``. This module rebuilds the same
architecture (patch embedding, class token, learned position embedding, pre-norm
transformer blocks, layer norm, linear head) so that:

- ``b16`` has exactly torchvision's ViT-B/16 shapes (86,567,656 parameters with a
  1000-class head) and can be trained on LUMI at the course's cost;
- ``tiny`` is the same code, small enough to learn the synthetic data set in a minute on
  two CPU cores.

The transformer blocks live in ``model.blocks``, an ``nn.ModuleList``, because sharded
training (FSDP) wraps the model one block at a time.

Image size, decided here: ``b16`` resizes its 64x64 input to 224x224 (bilinear) before
the patch embedding, as the course's ``Resize`` transform does, so it sees 14x14 = 196
patches like the torchvision model. Running patch 16 straight on 64x64 would give only
16 patches, a different (and 12x cheaper) workload than the one the course measures.
The resize runs inside ``forward`` so that it happens on the GPU, not in data workers.
``tiny`` uses the 64x64 images as they are, with 8x8 patches (64 patches).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class ViTConfig:
    """Shape of a ViT. Every field is checked in ``__post_init__``."""

    image_size: int
    """Side of the square image the patch embedding sees; other inputs are resized to it."""
    patch_size: int
    """Side of one square patch; must divide ``image_size``."""
    dim: int
    """Width of the token embeddings."""
    depth: int
    """Number of transformer blocks."""
    heads: int
    """Attention heads per block; must divide ``dim``."""
    mlp_dim: int
    """Hidden width of each block's MLP."""
    num_classes: int = 1000
    """Outputs of the classification head."""
    dropout: float = 0.0
    """Dropout after attention and MLP (torchvision's vit_b_16 uses 0)."""

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(
                f"patch_size {self.patch_size} does not divide image_size {self.image_size}"
            )
        if self.dim % self.heads:
            raise ValueError(f"heads {self.heads} does not divide dim {self.dim}")
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


CONFIGS: dict[str, ViTConfig] = {
    # Sized for the CPU demo: 2 ranks x 1 thread learn 10 synthetic classes in ~1 minute.
    "tiny": ViTConfig(image_size=64, patch_size=8, dim=64, depth=4, heads=4, mlp_dim=128),
    # torchvision's vit_b_16 (the LUMI course's model), input resized 64 -> 224.
    "b16": ViTConfig(image_size=224, patch_size=16, dim=768, depth=12, heads=12, mlp_dim=3072),
}


def vit_config(name: str, num_classes: int) -> ViTConfig:
    """The named configuration with a head of ``num_classes`` outputs."""
    if name not in CONFIGS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(CONFIGS)}")
    base = CONFIGS[name]
    return ViTConfig(**{**base.__dict__, "num_classes": num_classes})


class Attention(nn.Module):
    """Multi-head self-attention; one fused qkv projection like ``nn.MultiheadAttention``."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).view(batch, tokens, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each: batch, heads, tokens, head_dim
        p = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(config.dim, eps=1e-6)
        self.attn = Attention(config.dim, config.heads, config.dropout)
        self.norm2 = nn.LayerNorm(config.dim, eps=1e-6)
        self.mlp = nn.Sequential(
            nn.Linear(config.dim, config.mlp_dim),
            nn.GELU(),
            nn.Dropout(config.dropout),
            nn.Linear(config.mlp_dim, config.dim),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """Image classifier: images (B, 3, H, W) -> logits (B, num_classes)."""

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = nn.Conv2d(3, config.dim, config.patch_size, stride=config.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, config.num_patches + 1, config.dim))
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.depth))
        self.norm = nn.LayerNorm(config.dim, eps=1e-6)
        self.head = nn.Linear(config.dim, config.num_classes)
        self._init_weights()

    def _init_weights(self) -> None:
        # Small random position embeddings and linears (as timm / torchvision do); a zero
        # head makes the first loss exactly log(num_classes), a quick sanity check in logs.
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
        nn.init.zeros_(self.head.weight)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        size = self.config.image_size
        if images.shape[-2:] != (size, size):
            images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False)
        x = self.patch_embed(images).flatten(2).transpose(1, 2)  # B, patches, dim
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x[:, 0]))


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
