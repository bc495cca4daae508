"""The GPU-resident bound: how fast the example's ViT trains when data costs nothing.

Why: "the example is fast" only means something against what its model can do on the
GPU. This is that number: the same ViT (``examples/vit/model.py``) and batch, one
normalised batch already on the GPU, bf16 autocast, fused AdamW, the loss in fp32, and
nothing else (no loader, no DDP, no scalerun). ``example_gpu.py`` compares the example's
training loop with the ``compiled`` variant.

Variants, timed alternately in every round (the order rotates), medians over rounds:

- ``eager``: the model as it is;
- ``compiled``: ``torch.compile(model)``, the whole model as one graph (the bound);
- ``compiled per block``: each transformer block compiled in place, as the example's
  ``--compile`` does (``speed.py`` says why), to show what per-block costs, if anything.

Each variant is warmed up first (compiling takes tens of seconds for ViT-B/16); then
each timed segment runs as many steps as fit in ``--segment-seconds``, between two
``torch.cuda.synchronize()``. Without a GPU it prints a 'skipped: no GPU' row and exits
0, unless ``--device cpu`` asks for a CPU run (model tiny, to check the code).

    python benchmarks/gpu_bound.py                              # b16, batch 128, 3 rounds
    python benchmarks/gpu_bound.py --batch-size 64 --variants eager compiled
    python benchmarks/gpu_bound.py --smoke                      # tiny model, 1 round
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import common

VARIANTS = ("eager", "compiled", "compiled per block")
CLASSES = 200  # Tiny-ImageNet's head, as the example builds it for LUMI's file


def build_step(variant: str, model_name: str, batch: int, device, precision: str = "bf16") -> Callable:  # noqa: ANN001
    """A function that takes one training step of a fresh model on a resident batch."""
    import model as vit_model
    import speed
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    net = vit_model.ViT(vit_model.vit_config(model_name, CLASSES)).to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4, **fused)
    forward = net
    if variant == "compiled":
        forward = torch.compile(net)
    elif variant == "compiled per block":
        speed.compile_blocks(net)
    images = torch.randn(batch, 3, 64, 64, device=device)  # what normalise() gives
    labels = torch.randint(0, CLASSES, (batch,), device=device)
    dtype = speed.autocast_dtype(precision)

    def step() -> None:
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            logits = forward(images)
        F.cross_entropy(logits.float(), labels).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def synchronize(device) -> None:  # noqa: ANN001
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(step: Callable, steps: int, device) -> float:  # noqa: ANN001
    """Seconds for ``steps`` steps, the GPU drained before and after."""
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize(device)
    return time.perf_counter() - start


def warm_up(step: Callable, steps: int, device) -> tuple[float, float]:  # noqa: ANN001
    """(seconds of the first ``steps`` steps, compiling included; seconds per step after)."""
    first = time_steps(step, steps, device)
    return first, time_steps(step, 3, device) / 3


def steps_for(seconds_per_step: float, segment_seconds: float) -> int:
    return max(3, min(2000, round(segment_seconds / max(seconds_per_step, 1e-6))))


def run(args: argparse.Namespace, device) -> dict[str, dict]:  # noqa: ANN001
    steps = {v: build_step(v, args.model, args.batch_size, device) for v in args.variants}
    results = {v: {"images_per_s": []} for v in args.variants}
    for v in args.variants:
        first, per_step = warm_up(steps[v], args.warmup, device)
        results[v].update(warmup_s=first, steps=steps_for(per_step, args.segment_seconds))
        print(f"  {v}: warm-up {first:.1f} s, then {args.batch_size / per_step:,.0f} images/s",
              file=sys.stderr, flush=True)
    for rnd in range(args.repeat):
        shift = rnd % len(args.variants)
        for v in args.variants[shift:] + args.variants[:shift]:
            n = results[v]["steps"]
            rate = n * args.batch_size / time_steps(steps[v], n, device)
            results[v]["images_per_s"].append(rate)
            print(f"  round {rnd + 1}/{args.repeat} {v:19s} {rate:9,.0f} images/s",
                  file=sys.stderr, flush=True)
    for r in results.values():
        r["images_per_s_median"] = common.median(r["images_per_s"])
    return results


def render(results: dict[str, dict]) -> str:
    eager = results.get("eager", {}).get("images_per_s_median")
    rows = []
    for v, r in results.items():
        rates = r["images_per_s"]
        spread = f"{min(rates):,.0f}-{max(rates):,.0f}"
        vs = f"{r['images_per_s_median'] / eager:.2f}x" if eager else ""
        rows.append([v, r["images_per_s_median"], spread, vs, f"{r['warmup_s']:.1f}"])
    return common.render(["variant", "images/s", "min-max", "vs eager", "warm-up s"], rows)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Training images/s of the example's ViT "
                                     "with its data already on the GPU.")
    add = parser.add_argument
    add("--model", choices=["tiny", "b16"], default=None, help="default: b16 on GPU, tiny on CPU")
    add("--batch-size", type=int, default=128, help="images per step (default 128)")
    add("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS), help="what to time")
    add("--repeat", type=int, default=3, help="timed rounds (default 3)")
    add("--warmup", type=int, default=5, help="untimed steps first, compiling included (default 5)")
    add("--segment-seconds", type=float, default=3.0, help="seconds per timed segment (default 3)")
    add("--device", choices=["cuda", "cpu"], default="cuda",
        help="cuda (default; skipped without a GPU) or cpu (a check of the code, not a bound)")
    add("--out", type=Path, default=common.RESULTS / "gpu_bound.json", help="JSON report")
    add("--smoke", action="store_true", help="smallest run: tiny model, batch 16, 1 round")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    common.import_example()
    import torch

    env = common.environment()
    if args.device == "cuda" and not torch.cuda.is_available():
        return common.skipped_report(args.out, "gpu_bound", "no GPU", env)
    device = torch.device(args.device)
    if args.smoke:
        args.model, args.batch_size, args.repeat, args.warmup = "tiny", 16, 1, 3
        args.segment_seconds = 0.5
    args.model = args.model or ("b16" if device.type == "cuda" else "tiny")
    print(f"gpu bound: {args.model}, batch {args.batch_size}, bf16 autocast, AdamW, on "
          f"{env['gpu'] if device.type == 'cuda' else device}; variants {args.variants}",
          file=sys.stderr)
    results = run(args, device)
    print(render(results))
    body = {"device": str(device), "model": args.model, "batch_size": args.batch_size,
            "precision": "bf16", "optimizer": "AdamW(fused)" if device.type == "cuda" else "AdamW",
            "repeat": args.repeat, "results": results}
    path = common.write_report(args.out, "gpu_bound", "training images/s of the example's ViT "
                               "on one resident batch (no loader, no DDP)", body, env)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
