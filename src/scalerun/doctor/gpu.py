"""The GPU smoke test: can this rank's GPU multiply two matrices, correctly and how fast?

Why: a GPU with broken memory or a wedged driver often still enumerates; a small product
checked against a float64 CPU result catches it before a training run produces NaNs, and a
2048-sized product gives a throughput figure to compare between nodes. Runs only where the
rank has a GPU; it never changes the device settings (TF32 stays as the user left it, hence
the loose tolerance).
"""

from __future__ import annotations

import time
from typing import Any

from scalerun.doctor.facts import Smoke

CHECK_SIZE = 256
SPEED_SIZE = 2048
SPEED_ITERS = 5
TOLERANCE = 1e-2
"""Largest error relative to the largest entry; TF32 stays well inside it, garbage does not."""


def smoke_test(device: Any) -> Smoke | None:
    """The test on ``device``; None on the CPU, a failed :class:`Smoke` when the GPU errs."""
    if device.type != "cuda":
        return None
    import torch

    count = torch.cuda.device_count()
    try:
        error = product_error(device)
        rate = product_tflops(device)
    except Exception as failure:  # noqa: BLE001 - any driver error is the finding
        return Smoke(device_count=count, ok=False, error=f"{type(failure).__name__}: {failure}"[:300])
    return Smoke(device_count=count, ok=error < TOLERANCE, max_error=error, tflops=rate)


def product_error(device: Any, size: int = CHECK_SIZE) -> float:
    """Largest difference of the GPU's float32 product to the CPU's float64 one, relative."""
    import torch

    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    want = a.double() @ b.double()
    got = (a.to(device) @ b.to(device)).double().cpu()
    return float((got - want).abs().max() / want.abs().max())


def product_tflops(device: Any, size: int = SPEED_SIZE, iters: int = SPEED_ITERS) -> float:
    """float32 matrix-product throughput in TFLOP/s (2 n^3 operations per product)."""
    import torch

    a = torch.randn(size, size, device=device)
    b = torch.randn(size, size, device=device)
    a @ b  # the first product loads the kernels
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(iters):
        a @ b
    torch.cuda.synchronize(device)
    return 2 * size**3 * iters / (time.perf_counter() - start) / 1e12
