"""DDP, FSDP, DeepSpeed ZeRO and Horovod behind one wrap(), on 2 and 4 real gloo ranks.

One launch of 2 processes per strategy runs all of that strategy's checks (see
``strategy_ranks.run_checks``); one launch of 4 processes loads every strategy's
2-rank checkpoint. The launches are cached per module, so the 4-rank test reuses the
checkpoints the 2-rank tests wrote.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.ranks import run_ranks
from tests.runtime import strategy_ranks as sr

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
HAS_HOROVOD = importlib.util.find_spec("horovod") is not None
needs_deepspeed = pytest.mark.skipif(
    not HAS_DEEPSPEED, reason="deepspeed is not installed: pip install 'scalerun[deepspeed]'"
)
needs_horovod = pytest.mark.skipif(
    not HAS_HOROVOD, reason="horovod is not installed: scripts/install_horovod.sh"
)



def test_optional_strategies_are_installed() -> None:
    """make test installs both extras (and sets SCALERUN_REQUIRE_EXTRAS=1): there, missing
    ones must fail the suite rather than skip tests quietly. Elsewhere (a GPU node with its
    own torch) they skip with the reason."""
    missing = [name for name, present in (("deepspeed", HAS_DEEPSPEED), ("horovod", HAS_HOROVOD))
               if not present]
    if missing and os.environ.get("SCALERUN_REQUIRE_EXTRAS") != "1":
        pytest.skip(f"{', '.join(missing)} not installed (make extras installs them)")
    assert not missing, f"{', '.join(missing)} not installed: run make extras"


# The course's ds_config.json, verbatim: note the trailing comma DeepSpeed accepts.
COURSE_DS_CONFIG = """{
  "zero_optimization": {
    "stage": 1
  },

  "fp16": {
    "enabled": false,
  }
}
"""
HALF = 4  # micro-batches before the save; accumulation 2 -> 2 optimizer steps

# strategy -> (wrap options, the low precision to train in)
TORCH_STRATEGIES = {
    "ddp": ({}, "fp16"),
    "fsdp": ({}, "bf16"),
    "horovod": ({}, "fp16"),
}
ZERO_STAGES = (1, 2, 3)
# Strategy options that change how gradients travel, and how close to single-process
# SGD the step must stay with them (Horovod's fp16 compression rounds the gradients).
VARIANTS: dict[str, list[tuple[dict, float]]] = {
    "ddp": [({"static_graph": True, "bucket_cap_mb": 0.01}, 1e-5)],
    "fsdp": [({"cpu_offload": True}, 1e-5), ({"reshard_after_forward": False, "blocks": "blocks"}, 1e-5)],
    "horovod": [({"compression": "fp16"}, 1e-3)],
}
EXACT = 1e-5


def torch_checks(strategy: str, directory: Path) -> list[tuple[str, tuple]]:
    options, precision = TORCH_STRATEGIES[strategy]
    return [
        ("one_step", (strategy, options, True)),
        ("one_step", (strategy, options, False)),
        *[("one_step", (strategy, variant, False)) for variant, _ in VARIANTS[strategy]],
        ("resume", (strategy, options, str(directory), HALF)),
        ("low_precision", (strategy, precision, options)),
        ("held_after_backward", (strategy, options)),
        ("errors", (strategy,)),
    ]


def deepspeed_checks(directory: Path, course_config: Path) -> list[tuple[str, tuple]]:
    checks: list[tuple[str, tuple]] = [
        ("one_step", ("deepspeed", {"config": str(course_config)}, False)),
        ("one_step", ("deepspeed", {"zero_stage": 2}, False)),
        ("one_step", ("deepspeed", {"zero_stage": 3}, True)),
    ]
    checks += [("resume", ("deepspeed", {"zero_stage": s}, str(directory / f"zero{s}"), HALF))
               for s in (2, 3)]
    # Threshold 0: ZeRO-3 would otherwise keep this small model's parameters whole.
    whole = {"zero_optimization": {"stage3_param_persistence_threshold": 0}}
    checks += [("held_after_backward", ("deepspeed", {"zero_stage": s, "config": whole}))
               for s in ZERO_STAGES]
    checks += [
        ("low_precision", ("deepspeed", "bf16", {"zero_stage": 1})),
        ("save_sgd", ("deepspeed", {"zero_stage": 2}, str(directory / "sgd"))),
        ("errors", ("deepspeed",)),
    ]
    return checks


_launches: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="module", autouse=True)
def deepspeed_cpu_op_built() -> None:
    """Compile DeepSpeed's CPU communication op before any rank needs it.

    DeepSpeed JIT-compiles it on first use (about a minute on 2 cores, then cached in
    ~/.cache/torch_extensions); inside a launch that would eat the ranks' time limit.
    """
    if HAS_DEEPSPEED:
        build = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
        subprocess.run([sys.executable, "-c", build], capture_output=True, timeout=600, check=True)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("checkpoints")


def launch_two_ranks(strategy: str, root: Path) -> dict[str, Any]:
    """All checks of one strategy in one 2-rank launch (once per test module).

    Returns the results of every rank, the checkpoint folder and, for each checkpoint a
    ``resume`` check wrote, the full weights at the moment of the save.
    """
    if strategy not in _launches:
        directory = root / strategy
        if strategy == "deepspeed":
            config = root / "ds_config.json"
            config.write_text(COURSE_DS_CONFIG)
            checks = deepspeed_checks(directory, config)
        else:
            checks = torch_checks(strategy, directory)
        ranks = run_ranks(2, sr.run_checks, checks)
        saved = {args[2]: ranks[0][f"{i}:resume"]["saved_at"]
                 for i, (name, args) in enumerate(checks) if name == "resume"}
        _launches[strategy] = {"ranks": ranks, "dir": directory, "saved": saved}
    return _launches[strategy]


def results(per_rank: list[dict[str, Any]], name: str) -> list[list[Any]]:
    """For each check called ``name`` (in launch order), the result of every rank."""
    keys = [k for k in per_rank[0] if k.split(":", 1)[1] == name]
    return [[rank[k] for rank in per_rank] for k in keys]


def max_difference(a: dict[str, list], b: dict[str, list]) -> float:
    assert a.keys() == b.keys()
    return max(abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True))


def check_one_step(per_rank: list[dict[str, Any]], cases: list[tuple[bool, float]]) -> None:
    """DDP, FSDP, Horovod and ZeRO match single-process SGD on the global batch.

    ``cases``: for each one_step check in launch order, (clipped, tolerance).
    """
    references = {clip: sr.reference_step(world=2, clip=clip) for clip in (True, False)}
    for (clip, tolerance), ranks in zip(cases, results(per_rank, "one_step"), strict=True):
        for state in ranks:
            assert max_difference(state, references[clip]) < tolerance, f"clip={clip}"


def check_resume(per_rank: list[dict[str, Any]], tolerance: float) -> None:
    """2N steps straight == N + save + load into a fresh run + N (and the same losses)."""
    for ranks in results(per_rank, "resume"):
        for out in ranks:
            assert max_difference(out["got"], out["expected"]) <= tolerance
            assert max_difference(out["expected"], out["saved_at"]) > 1e-3  # the second half trained
            straight, resumed = out["losses_straight"], out["losses_resumed"]
            assert all(math.isclose(a, b, abs_tol=max(tolerance, 1e-12)) for a, b in zip(straight, resumed, strict=True))
            assert (out["step"], out["epoch"], out["batch"]) == (HALF // 2, 0, HALF)
            assert out["extra"] == {"losses": ranks[0]["losses_resumed"][:HALF]}  # rank 0's
            assert out["lr"] == pytest.approx([1e-2 * 0.7 ** (2 * HALF // 2)])


def check_low_precision(per_rank: list[dict[str, Any]], precision: str) -> None:
    for ranks in results(per_rank, "low_precision"):
        assert ranks[0]["after"] == ranks[1]["after"]  # replicas agree after the step
        for out in ranks:
            assert all(math.isfinite(loss) for loss in out["losses"]) and out["changed"]
            assert (out["scaler"] is not None) == (precision == "fp16")


def check_errors(per_rank: list[dict[str, Any]]) -> None:
    messages = results(per_rank, "errors")[0][0]
    assert len(messages) == 4
    assert "bogus_option" in messages[0] and "accepts" in messages[0]
    assert "fp8" in messages[1] and "bf16" in messages[1]
    assert "accumulation=0" in messages[2]
    assert "1 micro-batch(es) into an accumulation cycle of 2" in messages[3]
    assert all("\n" not in m for m in messages)


@pytest.mark.parametrize(
    "strategy",
    ["ddp", "fsdp", pytest.param("horovod", marks=needs_horovod)],
)
def test_torch_strategy_trains_resumes_and_matches_single_process(strategy: str, checkpoints: Path) -> None:
    per_rank = launch_two_ranks(strategy, checkpoints)["ranks"]
    variants = [(False, tolerance) for _, tolerance in VARIANTS[strategy]]
    check_one_step(per_rank, [(True, EXACT), (False, EXACT), *variants])
    check_resume(per_rank, tolerance=0.0)
    check_low_precision(per_rank, TORCH_STRATEGIES[strategy][1])
    check_errors(per_rank)
    held = results(per_rank, "held_after_backward")[0]
    for out in held:
        full = out["model_bytes"]
        share = 1 if strategy != "fsdp" else 2  # FSDP: every rank holds half of everything
        assert out["parameters"] == pytest.approx(full / share, rel=0.05)
        assert out["gradients"] == pytest.approx(full / share, rel=0.05)
        assert out["optimizer"] == pytest.approx(2 * full / share, rel=0.05)  # Adam: two moments


@needs_deepspeed
def test_deepspeed_zero_stages_train_resume_and_shard(checkpoints: Path) -> None:
    per_rank = launch_two_ranks("deepspeed", checkpoints)["ranks"]
    check_one_step(per_rank, [(False, EXACT), (False, EXACT), (True, EXACT)])  # ZeRO-1 (course file), 2, 3
    check_resume(per_rank, tolerance=0.0)
    check_low_precision(per_rank, "bf16")
    check_errors(per_rank)
    held = dict(zip(ZERO_STAGES, results(per_rank, "held_after_backward"), strict=True))
    full = held[1][0]["model_bytes"]
    # ZeRO keeps an fp32 master copy beside Adam's two moments: 12 bytes per parameter,
    # of which each rank holds 1/W; ZeRO-3 shards the parameters too. After the reduce at
    # the end of a cycle DeepSpeed keeps only this rank's gradient slice, at stage 1 too
    # (stage 1 differs in holding whole gradients until then; a snapshot cannot show it).
    expected = {1: (1, 1 / 2, 3 / 2), 2: (1, 1 / 2, 3 / 2), 3: (1 / 2, 1 / 2, 3 / 2)}
    for stage, (params, grads, optimizer) in expected.items():
        for out in held[stage]:
            assert out["parameters"] == pytest.approx(params * full, rel=0.15), stage
            assert out["optimizer"] == pytest.approx(optimizer * full, rel=0.15), stage
            # A rank's gradient slice can be a view into a larger reduce buffer that it
            # keeps alive (rank 1 here: 0.73 of the model); still well below whole.
            assert grads * full * 0.85 <= out["gradients"] <= 0.75 * full, stage


def test_checkpoints_from_two_ranks_load_into_four(checkpoints: Path) -> None:
    """DDP/Horovod (replicated), FSDP (DCP) and ZeRO-3 (universal) load at another world size;
    a checkpoint of the wrong strategy, or one DeepSpeed cannot convert, is a clear error."""
    present = [s for s in ("ddp", "fsdp", "horovod", "deepspeed")
               if s not in ("horovod", "deepspeed") or (HAS_HOROVOD if s == "horovod" else HAS_DEEPSPEED)]
    saved = {d: w for s in present for d, w in launch_two_ranks(s, checkpoints)["saved"].items()}
    loads = [(s, {}, str(checkpoints / s)) for s in present if s != "deepspeed"]
    if HAS_DEEPSPEED:
        loads.append(("deepspeed", {"zero_stage": 3}, str(checkpoints / "deepspeed" / "zero3")))
    mistakes = [("fsdp", {}, str(checkpoints / "ddp"))]
    if HAS_DEEPSPEED:
        mistakes.append(("deepspeed", {"zero_stage": 2}, str(checkpoints / "deepspeed" / "sgd")))
    per_rank = run_ranks(4, sr.run_checks, [("load_elsewhere", args) for args in loads + mistakes])
    outcomes = results(per_rank, "load_elsewhere")
    for (strategy, _, directory), ranks in zip(loads, outcomes, strict=False):
        for out in ranks:
            assert "error" not in out, (strategy, out)
            assert max_difference(out["loaded"], saved[directory]) == 0.0, strategy
            # 4 batches x 4 samples x 2 ranks of epoch 0 were done: 2 batches with 4 ranks.
            assert (out["step"], out["saved_world"], out["epoch"], out["batch"]) == (2, 2, 0, 2)
            assert out["trained"] and all(math.isfinite(x) for x in out["losses"])
    errors = [ranks[0]["error"] for ranks in outcomes[len(loads):]]
    assert "written by strategy 'ddp'" in errors[0] and "strategy='ddp'" in errors[0]
    if HAS_DEEPSPEED:
        assert "ZeRO-2 over 2 rank(s)" in errors[1] and "resume with the saved layout" in errors[1]


def test_checkpoint_folder_is_self_describing(checkpoints: Path) -> None:
    directory = launch_two_ranks("ddp", checkpoints)["dir"]
    pointer = (directory / "latest").read_text().strip()
    meta = json.loads((directory / pointer / "meta.json").read_text())
    assert pointer == "step-00000002"
    assert meta["strategy"] == "ddp" and meta["world_size"] == 2 and meta["step"] == 2
    assert meta["loader"] == {"epoch": 0, "batch": HALF, "batch_size": sr.BATCH,
                              # what a resume at another size is judged by (continuation.py)
                              "accumulation": 2, "global_batch": sr.BATCH * 2 * 2,
                              "sampler": "scalerun", "drop_last": False,
                              "samples": sr.SAMPLES, "shuffle": True, "seed": 3}
    files = sorted(p.name for p in (directory / pointer).iterdir())
    assert files == ["loop.pt", "meta.json", "model.pt", "optimizer.pt", "rank-00000.pt", "rank-00001.pt"]


# -- the DeepSpeed configuration, decided without starting anything -------------------
@pytest.mark.parametrize(
    ("train", "micro", "accumulation", "world", "expected"),
    [
        (None, 32, None, 8, (256, 32, 1)),
        (None, 32, 4, 8, (1024, 32, 4)),
        (256, None, None, 8, (256, 32, 1)),
        (256, 16, None, 8, (256, 16, 2)),
        (256, None, 2, 8, (256, 16, 2)),
        (256, 16, 2, 8, (256, 16, 2)),
    ],
)
def test_deepspeed_batch_sizes_complete_each_other(train, micro, accumulation, world, expected) -> None:
    from scalerun.runtime.strategies.deepspeed_config import resolve_batch

    assert resolve_batch(train, micro, accumulation, world) == expected


@pytest.mark.parametrize(
    ("train", "micro", "accumulation", "world", "message"),
    [
        (256, 16, 4, 8, "train_batch_size=256 but micro-batch 16 x accumulation 4 x 8 ranks = 512"),
        (100, 16, None, 8, "train_batch_size=100 is not a multiple of 128"),
        (4, None, None, 8, "train_batch_size=4 is not a multiple of 8"),
        (None, None, 2, 8, "pass micro_batch_size=<loader batch size>"),
    ],
)
def test_deepspeed_batch_sizes_that_cannot_agree_say_why(train, micro, accumulation, world, message) -> None:
    from scalerun.errors import ScalerunError
    from scalerun.runtime.strategies.deepspeed_config import resolve_batch

    with pytest.raises(ScalerunError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_batch(train, micro, accumulation, world)


def build(user: dict, *, client: bool = True, on_cpu: bool = True, world: int = 2, **settings: Any) -> dict:
    from scalerun.runtime.strategies.base import TrainSettings
    from scalerun.runtime.strategies.deepspeed_config import DeepSpeedOptions, build_config

    stage = settings.pop("zero_stage", None)
    settings.setdefault("micro_batch_size", 8)
    return build_config(user, TrainSettings(**settings), DeepSpeedOptions(zero_stage=stage),
                        world_size=world, on_cpu=on_cpu, client_optimizer=client)


def test_deepspeed_config_is_completed_from_wrap_options() -> None:
    user = {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}
    config = build(user, accumulation=2, clip_grad_norm=1.0, world=4)
    assert config["zero_optimization"] == {"stage": 3}
    assert (config["train_batch_size"], config["gradient_accumulation_steps"]) == (64, 2)
    assert config["gradient_clipping"] == 1.0 and config["zero_allow_untested_optimizer"] is True
    assert build({})["gradient_clipping"] == 0.0  # DeepSpeed's default would clip at 1.0
    assert user == {"zero_optimization": {"stage": 3}, "bf16": {"enabled": True}}  # not edited
    assert build({})["zero_optimization"]["stage"] == 2  # scalerun's default stage
    assert build({}, precision="bf16")["bf16"] == {"enabled": True}
    from_file_optimizer = build({"optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}, client=False)
    assert from_file_optimizer["optimizer"]["params"] == {"lr": 1e-3, "torch_adam": True}  # CPU


@pytest.mark.parametrize(
    ("user", "settings", "message"),
    [
        ({"zero_optimization": {"stage": 1}}, {"zero_stage": 3}, "zero_stage=3.*says stage 1"),
        ({"train_micro_batch_size_per_gpu": 4}, {"micro_batch_size": 8}, "micro_batch_size=8.*=4"),
        ({"gradient_accumulation_steps": 4}, {"accumulation": 2}, "accumulation=2.*=4"),
        ({"fp16": {"enabled": True}}, {"precision": "bf16"}, "precision='bf16'.*enables fp16"),
        ({"gradient_clipping": 0.5}, {"clip_grad_norm": 1.0}, "clip_grad_norm.*gradient_clipping=0.5"),
        ({"optimizer": {"type": "Adam"}}, {}, "keep one of the two"),
        ({}, {"client": False}, "deepspeed needs an optimizer"),
        ({}, {"zero_stage": 4}, "zero_stage=4 is not a ZeRO stage"),
    ],
)
def test_deepspeed_config_conflicts_name_both_sides(user: dict, settings: dict, message: str) -> None:
    from scalerun.errors import ScalerunError

    client = settings.pop("client", True)
    with pytest.raises(ScalerunError, match=message):
        build(user, client=client, **settings)


@needs_deepspeed  # hjson, DeepSpeed's own config parser, comes with it
def test_deepspeed_config_file_is_parsed_as_deepspeed_parses_it(tmp_path: Path) -> None:
    from scalerun.errors import ScalerunError
    from scalerun.runtime.strategies.deepspeed_config import load_config

    course = tmp_path / "ds_config.json"
    course.write_text(COURSE_DS_CONFIG)  # trailing comma, as in the course
    assert load_config(course) == {"zero_optimization": {"stage": 1}, "fp16": {"enabled": False}}
    twice = tmp_path / "twice.json"
    twice.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ScalerunError, match="duplicate key.*train_batch_size"):
        load_config(twice)
    with pytest.raises(ScalerunError, match="does not exist"):
        load_config(tmp_path / "missing.json")


# -- the example, unchanged but for --strategy ------------------------------------------
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "vit" / "train.py"


def run_example(tmp: Path, strategy: str, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, "-m", "scalerun", "launch", "--nproc-per-node", "2", str(EXAMPLE),
        "--model", "tiny", "--samples", "64", "--classes", "4", "--epochs", "1",
        "--batch-size", "8", "--data", str(tmp / "data.hdf5"), "--strategy", strategy,
        "--out", str(tmp / f"{strategy}.pt"), *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_example_trains_the_same_weights_with_every_strategy(tmp_path: Path) -> None:
    """examples/vit/train.py --strategy X: two Adam steps give DDP's weights for every X."""
    strategies = ["ddp", "fsdp"] + (["deepspeed"] if HAS_DEEPSPEED else []) + (
        ["horovod"] if HAS_HOROVOD else [])
    weights = {}
    for strategy in strategies:
        done = run_example(tmp_path, strategy, "--max-steps", "2")
        assert f"[rank0]: {strategy}" in done.stdout  # the wrapped model's one-line description
        assert "val accuracy" in done.stdout and "/13)" in done.stdout  # 20% of 64, each once
        weights[strategy] = torch.load(tmp_path / f"{strategy}.pt", weights_only=True)
    reference = weights["ddp"]
    assert not any(key.startswith("module.") for key in reference)
    for strategy, state in weights.items():
        assert state.keys() == reference.keys()
        worst = max((state[k].float() - reference[k].float()).abs().max().item() for k in reference)
        assert worst < 1e-5, (strategy, worst)


def test_example_resumes_from_its_checkpoint_folder(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    run_example(tmp_path, "fsdp", "--max-steps", "2", "--checkpoint", str(folder))
    assert (folder / "latest").read_text().strip() == "step-00000002"
    done = run_example(tmp_path, "fsdp", "--max-steps", "3", "--checkpoint", str(folder))
    assert f"resumed from {folder / 'step-00000002'}: step 2, epoch 1" in done.stdout
    assert (folder / "latest").read_text().strip() == "step-00000003"


@needs_horovod
def test_horovodrun_itself_starts_a_scalerun_script(tmp_path: Path) -> None:
    """horovodrun --gloo sets HOROVOD_* only: init() and wrap(strategy="horovod") use them."""
    script = tmp_path / "hvd.py"
    script.write_text(
        "import torch, scalerun\n"
        "ctx = scalerun.init()\n"
        "net = torch.nn.Linear(4, 1)\n"
        "model = scalerun.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1), strategy='horovod')\n"
        "x = torch.full((2, 4), float(ctx.rank + 1))\n"
        "model.backward(model(x).sum()); model.step()\n"
        "import horovod.torch as hvd\n"
        "w = net.weight.detach().clone()\n"
        "print('ok', ctx.placement.launcher, ctx.rank, hvd.rank(), hvd.size(),\n"
        "      scalerun.reduce(1), bool(torch.equal(scalerun.reduce(w, 'max'), w)), flush=True)\n"
    )
    horovodrun = Path(sys.executable).with_name("horovodrun")
    result = subprocess.run([str(horovodrun), "-np", "2", "--gloo", "-H", "localhost:2",
                             sys.executable, str(script)], capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok horovod 0 0 2 2 True" in result.stdout
    assert "ok horovod 1 1 2 2 True" in result.stdout


def test_horovod_environment_keeps_the_users_tunables_and_refuses_stale_rendezvous() -> None:
    from scalerun.errors import ScalerunError
    from scalerun.runtime.strategies.horovod import merge_horovod_environment

    wanted = {"HOROVOD_GLOO_IFACE": "hsn0", "HOROVOD_CPU_OPERATIONS": "gloo",
              "HOROVOD_GLOO_RENDEZVOUS_PORT": "4100", "HOROVOD_SIZE": "4"}
    merged = merge_horovod_environment(wanted, {"HOROVOD_GLOO_IFACE": "ib0",
                                                "HOROVOD_SIZE": "4"})
    assert merged == {"HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_RENDEZVOUS_PORT": "4100"}
    with pytest.raises(ScalerunError, match="HOROVOD_GLOO_RENDEZVOUS_PORT=9999"):
        merge_horovod_environment(wanted, {"HOROVOD_GLOO_RENDEZVOUS_PORT": "9999"})


def test_horovod_stall_shutdown_follows_the_hang_timeout_and_the_user_wins() -> None:
    from types import SimpleNamespace

    from scalerun.runtime.strategies.horovod import horovod_environment, merge_horovod_environment

    ctx = SimpleNamespace(placement=SimpleNamespace(master_addr="nid000001", num_nodes=2),
                          node_rank=1, rank=5, world_size=8, local_rank=1, local_world_size=4)
    without = horovod_environment(ctx, 4100, "hsn0")
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" not in without
    assert without["HOROVOD_RANK"] == "5" and without["HOROVOD_CROSS_SIZE"] == "2"
    wanted = horovod_environment(ctx, 4100, "hsn0", hang_timeout=1800.0)
    assert wanted["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "1800"
    assert horovod_environment(ctx, 4100, "hsn0", hang_timeout=0.2)[
        "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] == "1"
    # gloo's rendezvous and operations wait as long as the hang timeout, not Horovod's 30 s
    assert wanted["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "1800"
    assert without["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "86400"  # no hang timeout: a day
    assert horovod_environment(ctx, 4100, "hsn0", hang_timeout=5)["HOROVOD_GLOO_TIMEOUT_SECONDS"] == "30"
    assert "HOROVOD_GLOO_TIMEOUT_SECONDS" not in merge_horovod_environment(
        wanted, {"HOROVOD_GLOO_TIMEOUT_SECONDS": "60"})  # the user's value wins
    kept = merge_horovod_environment(wanted, {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "60"})
    assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" not in kept
