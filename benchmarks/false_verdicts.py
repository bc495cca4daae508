"""False slow-rank verdicts: launches in which no rank is slowed, and the report names one
anyway (issue 29: the DDP tutorial got "rank 1 is 44 % slower" in 5 of 15 launches).

Each launch runs one script on N local CPU ranks with nothing slowed, then reads its
report (``scalerun report --json``); every ``slow-rank`` verdict is false. The scripts: a
plain DDP loop in the shape of pytorch/examples' DDP tutorial (DistributedSampler, DDP, no
scalerun in the script: a loop scalerun does not own) and the example ViT (wrap(),
scalerun's loader). Target: 0 false verdicts in 20 launches of each at 2 and 4 ranks.

    python benchmarks/false_verdicts.py                 # 20 launches each: about 15 minutes here
    python benchmarks/false_verdicts.py --smoke         # 1 launch of the DDP loop at 2 ranks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, render, write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
DDP_LOOP = """
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(4096, 20), torch.randn(4096, 1))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data))
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(2):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()
"""


def script_words(name: str, folder: Path) -> list[str]:
    if name == "ddp-tutorial":
        script = folder / "ddp_loop.py"
        script.write_text(textwrap.dedent(DDP_LOOP))
        return [str(script)]
    return [str(REPO / "examples" / "vit" / "train.py"), "--model", "tiny", "--samples", "640", "--classes", "4",
            "--epochs", "1", "--batch-size", "8", "--num-workers", "0", "--data", str(folder / "data.h5"),
            "--out", str(folder / "model.pt")]


def one_launch(name: str, ranks: int, folder: Path, number: int) -> dict:
    """The verdicts of one launch: topics and messages."""
    run = folder / f"run-{name}-{ranks}-{number}"
    done = subprocess.run([sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", str(ranks),
                           "--no-monitor", "--run-dir", str(run), *script_words(name, folder)],
                          capture_output=True, text=True, timeout=600, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"false_verdicts.py: {name} at {ranks} ranks failed:\n{done.stderr[-2000:]}")
    report = subprocess.run([sys.executable, "-m", "scalerun", "report", str(run), "--json"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    verdicts = json.loads(report.stdout)["verdicts"]
    return {"slow": [v["message"] for v in verdicts if v["topic"] == "slow-rank"],
            "contention": [v["message"] for v in verdicts if v["topic"] == "cpu-contention"],
            "topics": [v["topic"] for v in verdicts]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20, help="launches of each script at each size")
    parser.add_argument("--smoke", action="store_true", help="1 launch of the DDP loop at 2 ranks")
    parser.add_argument("--out", type=Path, default=RESULTS / "false_verdicts.json")
    parser.add_argument("--only", help="one case, SCRIPT:RANKS (vit:2)")
    parser.add_argument("--keep", type=Path, help="keep the run directories in this folder")
    args = parser.parse_args(argv)
    cases = [("ddp-tutorial", 2)] if args.smoke else [(s, n) for s in ("ddp-tutorial", "vit") for n in (2, 4)]
    if args.only:
        name, _, ranks = args.only.partition(":")
        cases = [(name, int(ranks))]
    launches = 1 if args.smoke else args.launches
    rows, results = [], []
    with tempfile.TemporaryDirectory(prefix="false-verdicts-") as temporary:
        folder = str(args.keep) if args.keep else temporary
        Path(folder).mkdir(parents=True, exist_ok=True)
        for name, ranks in cases:
            found = [one_launch(name, ranks, Path(folder), i) for i in range(launches)]
            false = [message for launch in found for message in launch["slow"]]
            shared = [message for launch in found for message in launch["contention"]]
            others = sorted({topic for launch in found for topic in launch["topics"]
                             if topic not in ("slow-rank", "cpu-contention")})
            rows.append([name, ranks, launches, len(false), len(shared), ", ".join(others) or "none"])
            results.append({"script": name, "ranks": ranks, "launches": launches,
                            "false_slow_rank": len(false), "messages": false,
                            "cpu_contention": len(shared), "contention_messages": shared, "other_topics": others})
    # a cpu-contention verdict is not counted false: it names the rank's measured wait for a core
    print(render(["script", "ranks", "launches", "false slow-rank verdicts", "cpu-contention verdicts",
                  "other verdict topics"], rows))
    write_report(args.out, "false_verdicts", "slow-rank verdicts in launches where no rank is slowed "
                 "(each is false)", {"results": results}, environment())
    return 0


if __name__ == "__main__":
    sys.exit(main())
