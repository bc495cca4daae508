"""``scalerun.checkpoint``: atomic, resumable checkpoints for every strategy.

    from scalerun import checkpoint
    checkpoint.save("runs/ckpt", model, loader=train_loader, keep_last=3)
    resumed = checkpoint.load("runs/ckpt", model, loader=train_loader)  # None: fresh start

The implementation lives in :mod:`scalerun.runtime.checkpoint`; this module is its
public name.
"""

from scalerun.runtime.checkpoint import Resumed, latest, load, save, skip_first_batches

__all__ = ["save", "load", "latest", "Resumed", "skip_first_batches"]
