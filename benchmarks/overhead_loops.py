"""The training loops ``overhead.py`` compares, and their one-change variants (inside ranks).

Why a module of its own: the same loops run in two set-ups, one loop per launch (what a
user sees, start-up included) and all loops interleaved in one launch (what tells a 1 %
cost from a shared machine's noise), and both must time exactly the same code.

- ``course``: the LUMI course's ``ddp_visualtransformer.py``: ``DistributedDataParallel``
  with torch's defaults, ``DistributedSampler`` + ``set_epoch``, ``zero_grad`` /
  ``backward`` / ``step``;
- ``scalerun``: ``scalerun.wrap(model, optimizer)``, ``scalerun.loader``,
  ``model.backward`` / ``model.step``.

Variants change one thing each (``ARMS``). Nothing here launches, reports or decides a
ratio; it must not import scalerun unless a scalerun loop is built.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from dataclasses import dataclass, field
from typing import Any

# arm -> (loop, bound to the CPUs scalerun.init() picks?, one change)
ARMS: dict[str, tuple[str, bool, str]] = {
    "course": ("course", False, "the course's loop, unbound (torchrun binds nothing)"),
    "scalerun": ("scalerun", True, "scalerun's loop, bound as init() binds"),
    "scalerun unbound": ("scalerun", False, "scalerun's loop without init()'s CPU binding"),
    "course bound": ("course", True, "the course's loop bound as init() binds"),
    "scalerun no bucket view": ("scalerun no bucket view", True,
                                "wrap(gradient_as_bucket_view=False): torch's DDP default"),
    "scalerun DistributedSampler": ("scalerun DistributedSampler", True,
                                    "the course's DataLoader + DistributedSampler, not loader()"),
    "scalerun loss.backward()": ("scalerun loss.backward()", True,
                                 "wrap(model) without optimizer: the course's backward/step"),
}


def rank_data(args: argparse.Namespace, world: int, batches: int):  # noqa: ANN201 - a TensorDataset
    """``batches`` batches per rank of random normalised 64x64 images, in memory."""
    import torch
    from torch.utils.data import TensorDataset

    samples = batches * args.batch_size * world
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(samples, 3, 64, 64, generator=generator)
    return TensorDataset(images, torch.randint(0, 10, (samples,), generator=generator))


@dataclass
class Loop:
    """One training loop: ``step()`` takes the next batch (a new epoch when the last ends)."""

    model: Any
    optimizer: Any
    loader: Any
    device: Any
    dtype: Any
    style: str  # "course", "scalerun" or "plain" (wrap without optimizer)
    sampler: Any = None  # a DistributedSampler whose epoch the loop sets, as the course does
    epoch: int = 0
    batches: Any = None
    loss_sum: Any = None

    def step(self) -> None:
        import torch
        import torch.nn.functional as F

        batch = next(self.batches, None) if self.batches is not None else None
        if batch is None:
            if self.sampler is not None:
                self.sampler.set_epoch(self.epoch)
            self.epoch += 1
            self.batches = iter(self.loader)
            batch = next(self.batches)
        images, labels = batch[0].to(self.device), batch[1].to(self.device)
        if self.style != "scalerun":
            self.optimizer.zero_grad()
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.style == "course"
                            and self.dtype is not None):
            outputs = self.model(images)
        loss = F.cross_entropy(outputs.float(), labels)
        if self.style == "scalerun":
            self.model.backward(loss)
            self.model.step()
        else:
            loss.backward()
            self.optimizer.step()
        detached = loss.detach()
        self.loss_sum = detached if self.loss_sum is None else self.loss_sum + detached


def build_loop(kind: str, args: argparse.Namespace, dataset, device) -> Loop:  # noqa: ANN001
    """The loop ``kind`` (an ``ARMS`` loop name) on the process group that exists."""
    import model as vit_model
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.precision)
    torch.manual_seed(0)
    vit = vit_model.ViT(vit_model.vit_config(args.model, 10))
    if kind == "course":
        return course_loop(vit, args, dataset, device, dtype)
    import scalerun

    optimizer = torch.optim.Adam(vit.parameters(), lr=1e-4)
    plain = kind == "scalerun loss.backward()"
    options = {"gradient_as_bucket_view": False} if kind == "scalerun no bucket view" else {}
    model = scalerun.wrap(vit, None if plain else optimizer, precision=args.precision, **options)
    if plain:  # built after wrap moved the model to the device
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    sampler = None
    if kind == "scalerun DistributedSampler":
        loader, sampler = course_loader(dataset, args.batch_size)
    else:
        loader = scalerun.loader(dataset, batch_size=args.batch_size)
    return Loop(model, optimizer, loader, device, dtype, "plain" if plain else "scalerun", sampler)


def course_loop(vit, args: argparse.Namespace, dataset, device, dtype) -> Loop:  # noqa: ANN001
    import torch
    from torch.nn.parallel import DistributedDataParallel

    cuda = device.type == "cuda"
    model = DistributedDataParallel(vit.to(device), device_ids=[device.index] if cuda else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    loader, sampler = course_loader(dataset, args.batch_size)
    return Loop(model, optimizer, loader, device, dtype, "course", sampler)


def course_loader(dataset, batch_size: int):  # noqa: ANN001, ANN201
    from torch.utils.data import DataLoader, DistributedSampler

    sampler = DistributedSampler(dataset)
    return DataLoader(dataset, sampler=sampler, batch_size=batch_size), sampler


# --- CPU binding, switched per block ---------------------------------------------------------


def set_affinity(cpus: set[int]) -> None:
    """Move every thread of this process (gloo's, OpenMP's) to ``cpus``, as binding
    before the process group does for threads started later."""
    for tid in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except (ProcessLookupError, OSError):  # a thread that just ended
            continue


@dataclass
class Tally:
    """Wall and CPU seconds, and minor page faults, of one arm, per block."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    faults: list[float] = field(default_factory=list)

    def time_block(self, loop: Loop, steps: int, sync) -> None:  # noqa: ANN001
        sync()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            loop.step()
        sync()
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(time.process_time() - cpu)
        self.faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults)
