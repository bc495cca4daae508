"""The speed flags both scripts share, ``--precision`` and ``--compile``, and what they decide.

Why a module of its own: ``train_single.py`` and ``train.py`` must offer the same flags
with the same defaults, so that the diff between them stays what scaling changes.

Decided here:

- **Precision**: bf16 on a GPU (fp16 where the GPU has no bf16, e.g. a V100), fp32 on a
  CPU, unless ``--precision`` says. Mixed precision means autocast: weights and optimizer
  state stay fp32; matrix products run in the low type.
- **Compile**: each transformer block is compiled in place (``block.compile()``), before
  the model is wrapped. Why per block and before ``scalerun.wrap``:

  * the model keeps its type and its state-dict keys (``torch.compile(model)`` would
    return a wrapper whose keys start with ``_orig_mod.``: saved weights and checkpoints
    would change format);
  * each block's backward is its own graph, so DDP's gradient hooks fire block by block
    and its all-reduce overlaps the backward of the blocks before it (one graph for the
    whole model would hand over every gradient at the end);
  * FSDP2 wants exactly this order (compile the blocks, then ``fully_shard`` them), as
    torchtitan does;
  * the 12 blocks share one compiled graph (same code, parameters are graph inputs), so
    compiling costs about one block's time.

  ``dynamic=False``: the last, smaller batch of an epoch and the validation batches get
  graphs of their own instead of turning the training graph into a slower dynamic one.
"""

from __future__ import annotations

import argparse

import torch
from torch import nn

PRECISIONS = ("bf16", "fp16", "fp32")


def add_speed_options(parser: argparse.ArgumentParser) -> None:
    """Add ``--precision`` and ``--compile`` to a script's parser."""
    parser.add_argument(
        "--precision", choices=PRECISIONS, default=None,
        help="mixed precision (default: bf16 on a GPU, fp16 on a GPU without bf16, fp32 on CPU)",
    )
    parser.add_argument(
        "--compile", action="store_true",
        help="torch.compile each transformer block (first steps are slower while it compiles)",
    )


def choose_precision(requested: str | None, device: torch.device) -> tuple[str, str]:
    """(precision, where it came from) for this device."""
    if requested is not None:
        return requested, "--precision"
    if device.type != "cuda":
        return "fp32", "default on CPU"
    if torch.cuda.is_bf16_supported():
        return "bf16", "default on GPU"
    return "fp16", "default on a GPU without bf16"


def compile_blocks(model: nn.Module) -> int:
    """Compile every block of ``model.blocks`` in place; returns how many."""
    for block in model.blocks:
        block.compile(dynamic=False)
    return len(model.blocks)


def autocast_dtype(precision: str) -> torch.dtype | None:
    """The autocast type of a precision, None for fp32 (what train_single.py needs)."""
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]
