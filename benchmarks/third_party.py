"""Public training scripts nobody here wrote, under `scalerun launch` (issue 29): do they run,
and is what scalerun says about them true?

Each launch runs one script on 2 local CPU ranks (gloo, ``--no-monitor``) from a fresh
folder, reads its report (``scalerun report --json``) and judges every verdict and the
launcher's closing lines against what the script does: nothing is slowed, every rank gets
the same work, so a slow-rank, imbalance or data verdict is false; mnist/main.py forms no
process group, so "never formed one world" is true there (and must come first) and false
anywhere else. The numbers are checked too: steps per rank and samples per step against
what the script's arguments make. The scripts, unmodified copies under
benchmarks/third_party/ (each folder's SOURCE.md names repository, commit and licence):

- ddp-torchrun, ddp-multinode: pytorch/examples' DDP tutorial series (BSD-3); they
  hard-code CUDA and NCCL, so a copy is patched for CPU ranks at run time (diff printed);
- mnist: pytorch/examples' mnist/main.py (BSD-3); torchvision is not installed here, so a
  stand-in torchvision (random digits, no download) goes first on PYTHONPATH;
- nanogpt: karpathy/nanoGPT's train.py (MIT), a tiny GPT on a tiny random data set; in DDP
  mode it moves to CUDA whatever --device says, so a copy is patched (diff printed).

    python benchmarks/third_party.py              # 5 launches of each of 4 scripts: 2-10 minutes on 2 cores
    python benchmarks/third_party.py --smoke      # 1 launch of the DDP tutorial
    python benchmarks/third_party.py --launches 15 --keep DIR   # the run in results/third_party.json
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, environment, render, write_report  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
COPIES = Path(__file__).resolve().parent / "third_party"
RANKS = 2

# git blob ids of the upstream files (SOURCE.md names the commits): a copy that no longer
# matches was edited, and the benchmark refuses to call it a third-party script
BLOBS = {
    "ddp_tutorial/multigpu_torchrun.py": "32d6254d2dc43b104655bb7aec41a00b492e8dc4",
    "ddp_tutorial/multinode.py": "2cbae84b56ce2e11a657d2678facd3bfeaed41c0",
    "ddp_tutorial/datautils.py": "22c364eaa0d36bdcb5726f9f23972fe6b5d50615",
    "mnist/main.py": "dee5a384cb2c43acf7c7ce8e521330ccd01c6e92",
    "nanogpt/train.py": "de5785051050d64bbda37a4964c2c079f0739b2b",
    "nanogpt/model.py": "c698f8b60129d793494de058b0dd4e318c0dcb5e",
    "nanogpt/configurator.py": "a8bba9599537cbb34b378399a077b525a87d497f",
}


def ddp_patches(attribute: str) -> tuple[tuple[str, str, int], ...]:
    """The DDP tutorial on CPU ranks: no CUDA device, gloo, the model and batches stay on
    the CPU, DDP without device_ids. (old, new, how many times old occurs)."""
    return (
        ('torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))', "pass  # CPU ranks: no CUDA device", 1),
        ('init_process_group(backend="nccl")', 'init_process_group(backend="gloo")', 1),
        (f".to(self.{attribute})", '.to("cpu")', 3),
        (f"device_ids=[self.{attribute}]", "device_ids=None", 1),
    )


NANOGPT_PATCHES = (
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    if 'cuda' in device:\n        device = f'cuda:{ddp_local_rank}'\n        torch.cuda.set_device(device)\n", 1),
    ("DDP(model, device_ids=[ddp_local_rank])",
     "DDP(model, device_ids=[ddp_local_rank] if device_type == 'cuda' else None)", 1),
)

NANOGPT_ARGS = ("--dataset=tiny", "--device=cpu", "--compile=False", "--backend=gloo", "--dtype=float32",
                "--n_layer=2", "--n_head=2", "--n_embd=32", "--block_size=32", "--batch_size=4",
                "--max_iters=50", "--eval_interval=100000", "--eval_iters=2",
                "--gradient_accumulation_steps=4", "--warmup_iters=2", "--lr_decay_iters=50", "--out_dir=out")

FAKE_TORCHVISION = '''"""A stand-in for torchvision, written by benchmarks/third_party.py: torchvision is not
installed in this venv and the machine cannot download MNIST. datasets.MNIST is a
FakeData-like set of random 28x28 digits made in memory (640 to train, 128 to test);
transforms has the three that pytorch/examples' mnist/main.py uses."""
import types

import torch

__version__ = "0.0+scalerun-benchmark-stand-in"


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, x):
        for transform in self.transforms:
            x = transform(x)
        return x


class ToTensor:
    def __call__(self, image):
        return image.to(torch.float32).div(255).unsqueeze(0)


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean[0], std[0]

    def __call__(self, x):
        return (x - self.mean) / self.std


class MNIST(torch.utils.data.Dataset):
    def __init__(self, root, train=True, download=False, transform=None):
        size = 640 if train else 128
        generator = torch.Generator().manual_seed(0 if train else 1)
        self.images = torch.randint(0, 256, (size, 28, 28), dtype=torch.uint8, generator=generator)
        self.targets = torch.randint(0, 10, (size,), generator=generator)
        self.transform = transform

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        image = self.images[index]
        return (self.transform(image) if self.transform else image), int(self.targets[index])


datasets = types.SimpleNamespace(MNIST=MNIST)
transforms = types.SimpleNamespace(Compose=Compose, ToTensor=ToTensor, Normalize=Normalize)
'''


@dataclass(frozen=True)
class Case:
    name: str
    folder: str                       # under benchmarks/third_party/
    script: str
    files: tuple[str, ...]            # copied next to the script
    args: tuple[str, ...]
    steps: int                        # optimizer steps each rank takes
    samples_per_step: int             # samples each rank trains on per step
    forms_world: bool                 # the script joins a process group
    patches: tuple[tuple[str, str, int], ...] = ()
    fake_torchvision: bool = False
    tiny_gpt_data: bool = False
    source: str = ""

    @property
    def adapted(self) -> str:
        parts = []
        if self.patches:
            parts.append(f"run-time patch ({sum(n for _, _, n in self.patches)} edits)")
        if self.fake_torchvision:
            parts.append("stand-in torchvision")
        if self.tiny_gpt_data:
            parts.append("flags + random data")
        return ", ".join(parts) or "none"


CASES = {
    # 2048 samples, 32 per batch, 2 ranks: 32 steps an epoch, 4 epochs
    "ddp-torchrun": Case("ddp-torchrun", "ddp_tutorial", "multigpu_torchrun.py", ("datautils.py",),
                         ("4", "2"), 128, 32, True, ddp_patches("gpu_id"),
                         source="pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py"),
    "ddp-multinode": Case("ddp-multinode", "ddp_tutorial", "multinode.py", ("datautils.py",),
                          ("4", "2"), 128, 32, True, ddp_patches("local_rank"),
                          source="pytorch/examples distributed/ddp-tutorial-series/multinode.py (one node)"),
    # 640 fake digits, 64 per batch: 10 steps an epoch, 2 epochs, on each rank alone
    "mnist": Case("mnist", "mnist", "main.py", (), ("--epochs", "2"), 20, 64, False,
                  fake_torchvision=True, source="pytorch/examples mnist/main.py"),
    # iterations 0..50; 4 micro-batches of 4 split over 2 ranks: 2 x 4 samples a step
    "nanogpt": Case("nanogpt", "nanogpt", "train.py", ("model.py", "configurator.py"), NANOGPT_ARGS,
                    51, 8, True, NANOGPT_PATCHES, tiny_gpt_data=True, source="karpathy/nanoGPT train.py"),
}


# -- the copies ----------------------------------------------------------------------


def git_blob(path: Path) -> str:
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def check_copies() -> None:
    edited = [name for name, blob in BLOBS.items() if git_blob(COPIES / name) != blob]
    if edited:
        raise SystemExit(f"third_party.py: these copies differ from upstream: {', '.join(edited)}")


def patched(case: Case) -> tuple[str, str]:
    """The script's text after the case's patches, and their unified diff."""
    original = (COPIES / case.folder / case.script).read_text()
    text = original
    for old, new, count in case.patches:
        if text.count(old) != count:
            raise SystemExit(f"third_party.py: {case.script}: expected {count} of {old!r}, "
                             f"found {text.count(old)}")
        text = text.replace(old, new)
    diff = "".join(difflib.unified_diff(original.splitlines(keepends=True), text.splitlines(keepends=True),
                                        f"third_party/{case.folder}/{case.script}",
                                        f"(run-time copy)/{case.script}", n=0))
    return text, diff


def prepare(case: Case, work: Path, script_text: str) -> dict[str, str]:
    """A fresh working folder for one launch (the scripts write snapshot.pt, out/ and read
    configurator.py and data/ from their working directory); the environment's additions."""
    work.mkdir(parents=True)
    (work / case.script).write_text(script_text)
    for name in case.files:
        shutil.copy(COPIES / case.folder / name, work / name)
    env = {}
    if case.fake_torchvision:
        shim = work.parent / f"{work.name}-shim" / "torchvision"
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text(FAKE_TORCHVISION)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim.parent), os.environ.get("PYTHONPATH")) if p)
    if case.tiny_gpt_data:
        import numpy as np

        data = work / "data" / "tiny"
        data.mkdir(parents=True)
        tokens = np.random.default_rng(0)
        for split in ("train", "val"):
            tokens.integers(0, 64, 20_000, dtype=np.uint16).tofile(data / f"{split}.bin")
        with open(data / "meta.pkl", "wb") as meta:
            pickle.dump({"vocab_size": 64}, meta)
    return env


# -- one launch ----------------------------------------------------------------------


def launch(case: Case, script_text: str, folder: Path, number: int, timeout: float) -> dict:
    work, run = folder / f"{case.name}-{number}", folder / f"{case.name}-{number}-run"
    env = {**os.environ, **prepare(case, work, script_text)}
    command = [sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", str(RANKS), "--no-monitor",
               "--run-dir", str(run), case.script, *case.args]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    # its own session, so that a launch past the timeout is ended with all its ranks
    process = subprocess.Popen(command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
        code: int | str = process.returncode
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        code = "timeout"
    wall = time.perf_counter() - start
    closing = [line.removeprefix("scalerun launch: ") for line in err.splitlines()
               if line.startswith("scalerun launch: ")]
    report = subprocess.run([sys.executable, "-m", "scalerun", "report", str(run), "--json"],
                            capture_output=True, text=True, timeout=300, cwd=REPO)
    try:
        parsed = json.loads(report.stdout)
    except json.JSONDecodeError:
        parsed = None
    result = {"script": case.name, "launch": number, "exit_code": code, "wall_s": round(wall, 2),
              "loadavg_1m_before": load, "closing_lines": closing, "run_dir": str(run),
              "report_exit_code": report.returncode,
              "verdicts": [{k: v.get(k) for k in ("topic", "severity", "message", "fix", "rank")}
                           for v in (parsed or {}).get("verdicts", [])]}
    result["judged"] = judge(case, code, parsed, closing, report.stderr)
    result["steps_per_rank"] = [r["steps"]["steps"] for r in (parsed or {}).get("ranks", []) if r.get("steps")]
    if code != 0:
        result["stderr_tail"] = err[-3000:]
    return result


# -- judging ---------------------------------------------------------------------------

FALSE_TOPICS = {
    "slow-rank": "no rank is slowed: the ranks run the same code on the same data sizes",
    "imbalance": "every rank gets the same work (equal batches, no rank-only work after warm-up)",
    "data": "the loaders are in memory and their wait is not measured in a loop scalerun does not own",
    "communication": "communication is not timed in a loop scalerun does not own",
    "missing-ranks": "both ranks ran and wrote their steps (checked below)",
    "stopped-early": "both ranks ran to the script's last step (checked below)",
    "restarted": "no restart was asked for (no --max-restarts) and none happened",
    "preempted": "a local launch is not preempted",
}
NO_MONITOR_TOPICS = ("node-memory", "node-cpu", "gpu-idle", "low-gpu-util", "unused-gpu", "gpu-memory",
                     "cpu-bound")


def finding(judgement: str, what: str, text: str, why: str) -> dict:
    return {"judged": judgement, "what": what, "text": text, "why": why}


def judge(case: Case, code: int | str, report: dict | None, closing: list[str], report_err: str) -> list[dict]:
    """Every verdict and closing line of one launch, judged true, false, suspect or
    measured (a number the ranks measured, not checkable here), with why."""
    found = []
    if code != 0:
        found.append(finding("false", "exit", f"exit code {code}", "the script runs to its end on its own"))
    if report is None:
        return [*found, finding("false", "report", report_err.strip()[-300:], "`scalerun report --json` failed")]
    verdicts = report.get("verdicts", [])
    for index, verdict in enumerate(verdicts):
        topic, message = verdict["topic"], verdict["message"]
        if topic == "one-world":
            if case.forms_world:
                found.append(finding("false", f"verdict {topic}", message,
                                     "the script calls init_process_group on every rank"))
            else:
                why = "main.py never calls init_process_group: each rank trains alone"
                found.append(finding("true" if index == 0 else "false", f"verdict {topic}", message,
                                     why if index == 0 else f"{why}, but it is not the first verdict"))
        elif topic == "cpu-contention":
            found.append(finding("measured", f"verdict {topic}", message,
                                 "names a measured wait for a CPU core on a shared 2-core machine; not "
                                 f"counted false (load average {os.getloadavg()[0]:.1f} after the run)"))
        elif topic in FALSE_TOPICS:
            found.append(finding("false", f"verdict {topic}", message, FALSE_TOPICS[topic]))
        elif topic in NO_MONITOR_TOPICS:
            found.append(finding("false", f"verdict {topic}", message, "--no-monitor: no node or GPU samples"))
        else:
            found.append(finding("unjudged", f"verdict {topic}", message, "a topic this benchmark does not know"))
    if not case.forms_world and not any(v["topic"] == "one-world" for v in verdicts):
        found.append(finding("false", "missing verdict one-world", "-",
                             "main.py forms no process group; the report does not say so"))
    found += judge_numbers(case, report)
    found += judge_unmeasured(report)
    found += judge_closing(case, report, closing)
    return found


def judge_numbers(case: Case, report: dict) -> list[dict]:
    """Steps per rank and samples per step against what the script's arguments make."""
    found = []
    ranks = [r for r in report.get("ranks", []) if r.get("steps")]
    if len(ranks) != RANKS:
        found.append(finding("false", "ranks", f"{len(ranks)} ranks with steps", f"{RANKS} ranks ran"))
    for rank in ranks:
        steps = rank["steps"]
        per_step = steps["samples"] / steps["steady_steps"] if steps.get("steady_steps") else None
        if steps["steps"] != case.steps:
            found.append(finding("false", f"rank {rank['rank']} steps", str(steps["steps"]),
                                 f"the script takes {case.steps} optimizer steps per rank"))
        if per_step != case.samples_per_step:
            found.append(finding("false", f"rank {rank['rank']} samples per step", str(per_step),
                                 f"the script trains on {case.samples_per_step} samples per step per rank"))
    return found


def judge_unmeasured(report: dict) -> list[dict]:
    """A part of the step the ranks' step logs say they did not measure (their meta line's
    not_measured: the data wait of a loop scalerun does not own) must not read as a number
    in the report: the closing line says "not measured", the JSON and the Ranks table of
    report.md must not say 0 %."""
    run = Path(report["run_dir"])
    found = []
    for rank in (r for r in report.get("ranks", []) if r.get("steps")):
        log = run / "steps" / f"rank-{rank['rank']}.jsonl"
        try:
            meta = json.loads(log.read_text().splitlines()[0])
        except (OSError, IndexError, json.JSONDecodeError):
            continue
        unmeasured = meta.get("not_measured") or {}
        for key in ("data_s", "comm_s"):
            value = rank["steps"].get(key)
            if key in unmeasured and value is not None:
                found.append(finding("false", f"report {key} (JSON, report.md Ranks table)",
                                     f"rank {rank['rank']}: {key} {value}, {key.replace('_s', '_share')} "
                                     f"{rank['steps'].get(key.replace('_s', '_share'))}",
                                     f"the rank's step log says {key} was not measured "
                                     f"({unmeasured[key]}); the launcher's line says so too"))
    return found


def judge_closing(case: Case, report: dict, closing: list[str]) -> list[dict]:
    found = []
    throughput = next((line for line in closing if line.startswith("throughput:")), None)
    match = re.match(r"throughput: ([\d.]+) samples/s on (\d+) rank", throughput or "")
    if match is None:
        found.append(finding("false", "closing throughput", throughput or "(no line)", "the ranks logged steps"))
    elif not case.forms_world:
        found.append(finding("suspect", "closing throughput", throughput,
                             f"adds up {RANKS} ranks that each trained the whole job alone: copies of one "
                             f"run, so the run's own throughput is 1/{RANKS} of this; the line does not say "
                             "so (the one-world verdict comes two lines later)"))
    elif int(match[2]) != RANKS:
        found.append(finding("false", "closing throughput", throughput, f"{RANKS} ranks ran"))
    else:
        rate = (report.get("steps") or {}).get("samples_per_s") or 0.0
        same = abs(float(match[1]) - rate) <= max(1.0, 0.01 * rate)
        found.append(finding("true" if same else "false", "closing throughput", throughput,
                             f"{RANKS} ranks in one world; the report's rate is {rate:.0f} samples/s "
                             "(steps and samples per step checked above)"))
    gpus = next((line for line in closing if line.startswith("GPUs:")), None)
    if gpus is not None:
        found.append(finding("true", "closing GPUs", gpus.split(" in /")[0],
                             "--no-monitor asked for no monitor file (a CPU-only run, which the line "
                             "does not say)"))
    verdict = next((line for line in closing if line.startswith("verdict:")), None)
    first = report.get("verdicts", [{}])[0].get("message") if report.get("verdicts") else None
    if verdict is None:
        found.append(finding("false", "closing verdict", "(no line)", "every launch ends with one"))
    elif first is None and verdict != "verdict: no problem found":
        found.append(finding("false", "closing verdict", verdict, "the report has no verdict"))
    elif first is not None and not verdict.startswith(f"verdict: {first}"):
        found.append(finding("false", "closing verdict", verdict, f"the report's first verdict is: {first}"))
    elif first is None:
        found.append(finding("true", "closing verdict", verdict,
                             "nothing is slowed or wrong in this run" if case.forms_world else
                             "the report has no verdict (but the script forms no world)"))
    else:
        found.append(finding("true", "closing verdict", "(the report's first verdict, judged above)",
                             "it repeats the report's first verdict"))
    return found


# -- the table -----------------------------------------------------------------------------


def row(case: Case, launch: dict) -> list[object]:
    judged = launch["judged"]
    counts = {k: sum(1 for f in judged if f["judged"] == k)
              for k in ("true", "false", "suspect", "measured", "unjudged")}
    return [case.name, launch["launch"], case.adapted, launch["exit_code"], launch["wall_s"],
            "/".join(str(s) for s in launch["steps_per_rank"]) or "-",
            ", ".join(v["topic"] for v in launch["verdicts"]) or "none",
            ", ".join(f"{n} {k}" for k, n in counts.items() if n) or "nothing"]


def listing(results: list[dict]) -> str:
    """Every verdict and judged statement, grouped: one example text and in how many launches."""
    groups: dict[tuple[str, str, str], dict] = {}
    for launch in results:
        for item in launch["judged"]:
            key = (launch["script"], item["judged"], item["what"])
            group = groups.setdefault(key, {"launches": set(), "text": item["text"], "why": item["why"]})
            group["launches"].add(launch["launch"])
    total = {launch["script"]: 0 for launch in results}
    for launch in results:
        total[launch["script"]] += 1
    lines = []
    for (script, judgement, what), group in groups.items():
        lines.append(f"{script}: {judgement.upper()} {what} in {len(group['launches'])}/{total[script]} "
                     f"launch(es): {group['text']}\n    why: {group['why']}")
    return "\n".join(lines) or "no verdict, and nothing false in the closing lines"


@dataclass
class Totals:
    launches: int = 0
    failed: int = 0
    judged: dict[str, int] = field(default_factory=dict)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=5, help="launches of each script")
    parser.add_argument("--smoke", action="store_true", help="1 launch of the DDP tutorial (multigpu_torchrun.py)")
    parser.add_argument("--only", choices=sorted(CASES), action="append", help="this script only (repeatable)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds one launch may take")
    parser.add_argument("--out", type=Path, default=RESULTS / "third_party.json")
    parser.add_argument("--keep", type=Path, help="keep the working folders and run directories here")
    args = parser.parse_args(argv)
    check_copies()
    names = ["ddp-torchrun"] if args.smoke else (args.only or list(CASES))
    launches = 1 if args.smoke else args.launches
    env = environment()
    rows, results, cases, totals = [], [], [], Totals()
    with tempfile.TemporaryDirectory(prefix="third-party-") as temporary:
        folder = args.keep or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            case = CASES[name]
            text, diff = patched(case)
            if diff:
                print(f"{name}: patched at run time (the copy in benchmarks/third_party/ is unchanged):\n{diff}")
            if case.fake_torchvision:
                print(f"{name}: torchvision is not installed: a stand-in torchvision (random digits, "
                      "no download) goes first on PYTHONPATH\n")
            cases.append({"script": name, "source": case.source, "arguments": list(case.args),
                          "adapted": case.adapted, "patch": diff, "expected_steps_per_rank": case.steps,
                          "expected_samples_per_step": case.samples_per_step, "forms_world": case.forms_world})
            for number in range(launches):
                launch_result = launch(case, text, folder, number, args.timeout)
                results.append(launch_result)
                rows.append(row(case, launch_result))
                totals.launches += 1
                totals.failed += launch_result["exit_code"] != 0
                for item in launch_result["judged"]:
                    totals.judged[item["judged"]] = totals.judged.get(item["judged"], 0) + 1
                print(f"  {name} #{number}: exit {launch_result['exit_code']}, {launch_result['wall_s']:.1f} s, "
                      f"verdicts: {', '.join(v['topic'] for v in launch_result['verdicts']) or 'none'}",
                      flush=True)
    print()
    print(render(["script", "launch", "adapted", "exit", "wall s", "steps/rank", "verdict topics", "judged"], rows))
    print("\nverdicts and statements judged (TRUE ones listed too):")
    print(listing(results))
    print(f"\n{totals.launches} launches, {totals.failed} failed; judged: "
          + (", ".join(f"{n} {k}" for k, n in sorted(totals.judged.items())) or "nothing"))
    path = write_report(args.out, "third_party", "public training scripts under `scalerun launch "
                        f"--nproc-per-node {RANKS} --no-monitor` on CPU: exit codes, wall time, verdicts "
                        "and closing lines, each judged true or false for that script",
                        {"cases": cases, "results": results,
                         "totals": {"launches": totals.launches, "failed": totals.failed, **totals.judged}}, env)
    print(f"\nwrote {path}")
    return 1 if totals.failed else 0


if __name__ == "__main__":
    sys.exit(main())
