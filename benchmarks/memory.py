"""Memory per rank: what DDP, FSDP and ZeRO-1/2/3 really keep, beside what theory says.

Why: sharding strategies are chosen for memory, and the claim to check is the ZeRO
paper's: with W ranks, ZeRO-1 shards the optimizer state, ZeRO-2 also the gradients,
ZeRO-3 (and FSDP) also the parameters, so ZeRO-3 holds about 1/W of DDP.

What is measured: for each strategy and world size, every rank builds the same model
(``--depth`` residual MLP blocks of width ``--width``, fp32, Adam), takes one optimizer
step (which creates the optimizer state) and one more forward and backward (so the
gradients exist), then counts the bytes of parameters, gradients and optimizer state it
holds with ``Wrapped.held_bytes()``: every tensor storage reachable from the model's
parameters, their gradients and the optimizer (DeepSpeed's flat buffers, fp32 master
copies and gradient partitions included), each storage once. The largest rank is
reported (ranks differ by padding and by which reduce buffer a slice lives in).

Theory, for P parameters in fp32 with Adam (bytes per rank)::

    strategy  parameters  gradients  optimizer state
    ddp       4P          4P         8P      (two moments)
    fsdp      4P/W        4P/W       8P/W
    zero1     4P          4P         12P/W   (DeepSpeed keeps an fp32 master copy too)
    zero2     4P          4P/W       12P/W
    zero3     4P/W        4P/W       12P/W

Everything runs on CPU with gloo; bytes are the same on GPUs, where they matter.

    python benchmarks/memory.py                         # worlds 1 2 4, width 512, depth 4
    python benchmarks/memory.py --worlds 2 --width 256 --out /tmp/memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

THIS_FILE = Path(__file__).resolve()
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")
PARTS = ("parameters", "gradients", "optimizer")
TIMEOUT_S = 600.0
MB = 1024 * 1024


# --- inside each rank ------------------------------------------------------------------


def build_model(width: int, depth: int):  # noqa: ANN201 - torch is imported lazily
    """Residual MLP blocks in ``blocks`` (what FSDP shards one by one), as a transformer."""
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(self.norm(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(depth))
            self.head = nn.Linear(width, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    return Net()


def measure_rank(out_dir: Path, width: int, depth: int) -> None:
    """Held bytes of each strategy on this rank, written to ``out_dir/rank-N.json``."""
    import torch
    import torch.nn.functional as F

    import scalerun

    ctx = scalerun.init()
    results = {}
    for name in STRATEGIES:
        torch.manual_seed(0)
        net = build_model(width, depth)
        count = sum(p.numel() for p in net.parameters())
        options = {"strategy": "deepspeed", "zero_stage": int(name[-1])} if name.startswith("zero") else {"strategy": name}
        model = scalerun.wrap(net, torch.optim.Adam(net.parameters(), lr=1e-4), micro_batch_size=8, **options)
        x, y = torch.randn(8, width), torch.randint(0, 10, (8,))
        model.backward(F.cross_entropy(model(x), y))
        model.step()
        model.backward(F.cross_entropy(model(x), y))
        results[name] = {"parameter_count": count, **model.held_bytes().as_dict()}
        model.step()
        del model, net
    (out_dir / f"rank-{ctx.rank}.json").write_text(json.dumps(results))
    scalerun.shutdown()


# --- the driver ----------------------------------------------------------------------------


def theory(strategy: str, count: int, world: int) -> dict[str, float]:
    """Bytes per rank that the ZeRO paper's accounting predicts (fp32, Adam)."""
    shard = {"ddp": (1, 1, 1), "fsdp": (world, world, world), "zero1": (1, 1, world),
             "zero2": (1, world, world), "zero3": (world, world, world)}[strategy]
    optimizer_bytes = 8 if strategy in ("ddp", "fsdp") else 12  # ZeRO: + fp32 master copy
    parts = dict(zip(PARTS, (4 * count / shard[0], 4 * count / shard[1], optimizer_bytes * count / shard[2]), strict=True))
    return {**parts, "total": sum(parts.values())}


def run_world(world: int, width: int, depth: int) -> dict[str, dict]:
    """One launch of ``world`` local ranks; the largest rank's bytes per strategy."""
    with tempfile.TemporaryDirectory(prefix="scalerun-memory-") as tmp:
        command = [
            str(Path(sys.executable).parent / "scalerun"), "launch", "--standalone",
            "--nproc-per-node", str(world), str(THIS_FILE),
            "--rank-out", tmp, "--width", str(width), "--depth", str(depth),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        if done.returncode != 0:
            raise RuntimeError(f"{world} rank(s) failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
        ranks = [json.loads((Path(tmp) / f"rank-{r}.json").read_text()) for r in range(world)]
    return {s: max((rank[s] for rank in ranks), key=lambda held: held["total"]) for s in STRATEGIES}


def rows(measured: dict[int, dict[str, dict]]) -> list[dict]:
    table = []
    for world, per_strategy in sorted(measured.items()):
        ddp_total = per_strategy["ddp"]["total"]
        for strategy in STRATEGIES:
            held = per_strategy[strategy]
            expected = theory(strategy, held["parameter_count"], world)
            table.append({
                "strategy": strategy, "world_size": world, "parameter_count": held["parameter_count"],
                "measured": {k: held[k] for k in (*PARTS, "total")},
                "theory": expected,
                "measured_vs_ddp": held["total"] / ddp_total,
                "theory_vs_ddp": expected["total"] / theory("ddp", held["parameter_count"], world)["total"],
            })
    return table


def render(table: list[dict]) -> str:
    header = (
        "strategy  W   parameters MB      gradients MB       optimizer MB       total MB"
        "           total / DDP\n"
        "                  measured (theory)  measured (theory)  measured (theory)  measured (theory)"
        "  measured (theory)"
    )
    lines = [header, "-" * len(header.splitlines()[1])]
    for row in table:
        cells = [f"{row['measured'][k] / MB:8.2f} ({row['theory'][k] / MB:6.2f})" for k in (*PARTS, "total")]
        ratio = f"{row['measured_vs_ddp']:8.2f} ({row['theory_vs_ddp']:4.2f})"
        lines.append(f"{row['strategy']:8s} {row['world_size']:2d}  " + "  ".join(cells) + "  " + ratio)
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="Per-rank memory of DDP, FSDP and ZeRO-1/2/3.")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4], help="world sizes (default 1 2 4)")
    parser.add_argument("--width", type=int, default=512, help="block width (default 512)")
    parser.add_argument("--depth", type=int, default=4, help="number of blocks (default 4)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/memory.json"), help="JSON report")
    parser.add_argument("--rank-out", type=Path, help=argparse.SUPPRESS)  # rank mode
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.rank_out:
        measure_rank(args.rank_out, args.width, args.depth)
        return 0
    measured = {}
    for world in args.worlds:
        print(f"memory: {world} rank(s) ...", file=sys.stderr, flush=True)
        try:
            measured[world] = run_world(world, args.width, args.depth)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            print(f"memory.py: error: {error}", file=sys.stderr)
            return 1
    table = rows(measured)
    print(render(table))
    import torch

    report = {
        "benchmark": "memory",
        "measures": "bytes of parameters, gradients and optimizer state held by the largest rank "
        "after one step and one more backward (fp32, Adam), beside the ZeRO paper's accounting",
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(["python", *sys.argv]),
        "model": {"width": args.width, "depth": args.depth},
        "environment": {"host": platform.node(), "python": platform.python_version(),
                        "torch": torch.__version__, "deepspeed": _version("deepspeed")},
        "results": table,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    sys.exit(main())
