"""DeepSpeed ZeRO 1-3 and Horovod stopped mid-epoch at 2 ranks continue at 1 and 4 ranks.

The same global batch throughout (the accumulation makes up for the world size): the
resumed run must end where the uninterrupted 2-rank run ends, within fp32 rounding.
Why that tolerance: the runs differ only in the order of fp32 sums (over ranks, then
over micro-batches); measured, the final weights differ by at most 1.5e-8 (|w| up to
about 1) and the losses by 6e-8. The two resumed steps move the weights by more than
1e-3 (asserted), so a sample seen twice, a step lost or optimizer state left behind
would be far above ``WEIGHTS_ATOL`` (1e-6, about 8 fp32 ulps at 1.0).

Covered: 2 -> 1 for ZeRO-1, 2, 3 and Horovod; 2 -> 4 for ZeRO-3 (the stage that shards
the parameters too; ZeRO-1 and 2 share DeepSpeed's other optimizer, covered at 2 -> 1)
and Horovod. Four ranks on two cores are slow; ZeRO-1 and 2 at 2 -> 4 were measured by
hand with the same numbers (docs/strategies.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.runtime import resize_ranks as rr
from tests.runtime.test_strategies import HAS_DEEPSPEED, HAS_HOROVOD, max_difference

WEIGHTS_ATOL, LOSS_RTOL = 1e-6, 1e-5
CASES: dict[str, tuple[str, dict]] = {
    "zero1": ("deepspeed", {"zero_stage": 1}),
    "zero2": ("deepspeed", {"zero_stage": 2}),
    "zero3": ("deepspeed", {"zero_stage": 3}),
    "horovod": ("horovod", {}),
}
RESUMED_AT = {4: ("zero3", "horovod"), 1: ("zero1", "zero2", "zero3", "horovod")}
BLOCKED = "zero2-unwritable"  # a copy of zero2 whose universal folder cannot be written
RANKS_TIMEOUT_S = 600  # up to 4 processes starting DeepSpeed engines on 2 shared cores

pytestmark = [
    pytest.mark.skipif(not (HAS_DEEPSPEED and HAS_HOROVOD),
                       reason="needs deepspeed and horovod (make extras)"),
    # The first test pays for the module's three launches: about 5 minutes on 2 busy cores.
    pytest.mark.timeout(1200),
]


def cases(names: tuple[str, ...]) -> list[rr.Case]:
    return [(name, *CASES[name.removesuffix("-unwritable")]) for name in names]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The 2-rank runs, then the resumes: at 4 ranks first, so that the conversion to
    DeepSpeed's universal checkpoint happens there, with ranks waiting on rank 0."""
    root = tmp_path_factory.mktemp("resized")
    with rr.PreloadedRanks() as ranks:  # DeepSpeed and Horovod imported once, not by each rank
        two = ranks.run(2, rr.straight_and_stopped, cases(tuple(CASES)), str(root),
                        timeout_s=RANKS_TIMEOUT_S)
        blocked = root / BLOCKED
        shutil.copytree(root / "zero2", blocked)
        # Stands in for a read-only checkpoint folder (the tests run as root, who writes anyway).
        (blocked / "step-00000004" / "universal").write_text("not a folder\n")
        at: dict[int, list[dict[str, Any]]] = {}
        converted: dict[int, dict[str, int]] = {}
        for world, names in RESUMED_AT.items():
            extra = (BLOCKED,) if world == 4 else ()
            at[world] = ranks.run(world, rr.resumed, cases(names + extra), str(root),
                                  timeout_s=RANKS_TIMEOUT_S)
            converted[world] = {name: universal_inode(root / name) for name in ("zero1", "zero2", "zero3")
                                if universal_inode(root / name)}
    return {"two": two, "at": at, "converted": converted}


def universal_inode(folder: Path) -> int:
    converted = folder / "step-00000004" / "universal" / "deepspeed"
    return converted.stat().st_ino if converted.is_dir() else 0


@pytest.mark.parametrize(("world", "name"), [(w, n) for w, names in RESUMED_AT.items() for n in names])
def test_resumed_at_another_world_size_ends_where_the_uninterrupted_run_ends(
    runs: dict[str, Any], world: int, name: str
) -> None:
    saved = runs["two"][0][name]
    straight = saved["straight"]
    assert runs["two"][1][name]["straight"]["weights"] == straight["weights"]  # replicas agree
    assert saved["first"] == straight["losses"][: rr.STOP]  # same world size: bit for bit
    assert max_difference(saved["stopped_at"], straight["weights"]) > 1e-3  # the rest trained
    for out in (rank[name] for rank in runs["at"][world]):
        assert "error" not in out, out
        # Step 4 of 6, one step of 16 samples into epoch 1: batches of 4 samples x world.
        assert out["position"] == (rr.STOP, 1, rr.GLOBAL // (rr.BATCH * world))
        assert out["accumulation"] == rr.GLOBAL // (rr.BATCH * world)
        assert max_difference(out["weights"], straight["weights"]) <= WEIGHTS_ATOL
        assert out["losses"] == pytest.approx(straight["losses"][rr.STOP:], rel=LOSS_RTOL)


def test_deepspeed_converts_once_and_every_rank_hears_why_it_could_not(runs: dict[str, Any]) -> None:
    """The universal checkpoint written at the 4-rank resume is the one the 1-rank resume
    loads (not converted again); a conversion that fails on rank 0 is every rank's one-line
    error (before, the ranks waiting for rank 0 got gloo's "connection closed by peer")."""
    assert runs["converted"][4]["zero3"] == runs["converted"][1]["zero3"]
    assert set(runs["converted"][1]) == {"zero1", "zero2", "zero3"}
    errors = {rank[BLOCKED].get("error") for rank in runs["at"][4]}
    assert len(errors) == 1, errors
    (error,) = errors
    assert error is not None and "\n" not in error
    assert "cannot write DeepSpeed's universal checkpoint" in error and "copy the checkpoint" in error
