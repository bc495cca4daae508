"""Study sizes, batch arithmetic, ``{per_rank_batch}`` substitution, and bad requests in one line."""

from __future__ import annotations

import pytest

from scalerun.errors import ScalerunError
from scalerun.scaling.batches import (
    PLACEHOLDER,
    ScalingError,
    StudyRequest,
    batches_for,
    describe_request,
    substitute,
)

ARGS = ("--batch-size", PLACEHOLDER)


def request(**fields) -> StudyRequest:
    return StudyRequest(**{"script": "train.py", "script_args": ARGS, "ranks": (1, 2, 4), "batch": 64,
                           **fields})


@pytest.mark.parametrize(
    ("mode", "batch", "ranks", "per_rank", "total"),
    [
        ("strong", 64, 1, 64, 64),
        ("strong", 64, 4, 16, 64),
        ("strong", 96, 8, 12, 96),
        ("weak", 32, 1, 32, 32),
        ("weak", 32, 8, 32, 256),
        ("strong", None, 8, None, None),
        ("weak", None, 8, None, None),
    ],
)
def test_batches_for(mode, batch, ranks, per_rank, total) -> None:
    assert batches_for(mode, batch, ranks) == (per_rank, total)


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, [("ranks-1", 1, 1, 64, 64), ("ranks-2", 2, 1, 32, 64), ("ranks-4", 4, 1, 16, 64)]),
        ({"mode": "weak", "batch": 16}, [("ranks-1", 1, 1, 16, 16), ("ranks-2", 2, 1, 16, 32),
                                         ("ranks-4", 4, 1, 16, 64)]),
        ({"ranks": None, "nodes": (1, 2), "gpus_per_node": 8, "batch": 256},
         [("nodes-1", 8, 1, 32, 256), ("nodes-2", 16, 2, 16, 256)]),
        ({"ranks": (4, 8, 16), "gpus_per_node": 8, "batch": 128},
         [("ranks-4", 4, 1, 32, 128), ("ranks-8", 8, 1, 16, 128), ("ranks-16", 16, 2, 8, 128)]),
        ({"script_args": (), "batch": None}, [("ranks-1", 1, 1, None, None), ("ranks-2", 2, 1, None, None),
                                              ("ranks-4", 4, 1, None, None)]),
    ],
)
def test_sizes(fields, expected) -> None:
    sizes = request(**fields).sizes
    assert [(s.label, s.ranks, s.nodes, s.per_rank_batch, s.global_batch) for s in sizes] == expected


@pytest.mark.parametrize(
    ("args", "per_rank", "expected"),
    [
        (["--batch-size", PLACEHOLDER], 16, ["--batch-size", "16"]),
        (["--batch-size={per_rank_batch}"], 16, ["--batch-size=16"]),
        (["--bs", "{per_rank_batch}x{per_rank_batch}"], 4, ["--bs", "4x4"]),
        (["--name", "{other}", "--fmt", "{}", "--x", "per_rank_batch"], 8,
         ["--name", "{other}", "--fmt", "{}", "--x", "per_rank_batch"]),
        (["--batch-size", "{PER_RANK_BATCH}"], 8, ["--batch-size", "{PER_RANK_BATCH}"]),
        (["a b", "$HOME", "'q'", PLACEHOLDER], 2, ["a b", "$HOME", "'q'", "2"]),
        ([PLACEHOLDER], None, [PLACEHOLDER]),
        ([], 3, []),
    ],
)
def test_substitute(args, per_rank, expected) -> None:
    assert substitute(args, per_rank) == expected


def test_substitute_leaves_its_input_alone() -> None:
    args = ("--batch-size", PLACEHOLDER)
    substitute(args, 4)
    assert args == ("--batch-size", PLACEHOLDER)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ranks": ()}, "--ranks is empty"),
        ({"ranks": None}, "one of the two"),
        ({"nodes": (1, 2), "gpus_per_node": 8}, "one of the two"),
        ({"ranks": (4, 2, 8)}, "--ranks 4,2,8 is not in increasing order; give 2,4,8"),
        ({"ranks": (1, 2, 2, 4)}, "repeats 2"),
        ({"ranks": (0, 1)}, "at least 1"),
        ({"ranks": (-2, 1)}, "at least 1"),
        ({"ranks": None, "nodes": (2, 1), "gpus_per_node": 8}, "--nodes 2,1 is not in increasing order"),
        ({"ranks": None, "nodes": (1, 2)}, "--nodes needs --gpus-per-node"),
        ({"ranks": None, "nodes": (1,), "gpus_per_node": 0}, "--gpus-per-node 0"),
        ({"ranks": (1, 2, 12), "gpus_per_node": 8}, "--ranks 12 spans nodes of 8 GPUs"),
        ({"ranks": (1, 2, 4, 16), "max_ranks": 8, "max_ranks_source": "this node's 8 GPUs"},
         "--ranks 16 needs 16 ranks but this node's 8 GPUs hold(s) at most 8"),
        ({"ranks": None, "nodes": (1, 2, 4), "gpus_per_node": 8, "max_ranks": 16, "batch": 128},
         "--nodes 4 needs 32 ranks"),
        ({"batch": 90}, "--batch 90 does not divide into 4 ranks (strong scaling splits the global "
                        "batch); use a multiple of 4, e.g. 88 or 92"),
        ({"ranks": (1, 2, 3), "batch": 64}, "use a multiple of 6, e.g. 60 or 66"),
        ({"ranks": (4, 8), "batch": 4}, "use a multiple of 8, e.g. 8"),
        ({"batch": 0}, "--batch 0 must be a positive"),
        ({"script_args": ("--epochs", "1")}, "no script argument contains {per_rank_batch}"),
        ({"batch": None}, "no --batch N was given"),
        ({"mode": "fast"}, "--mode fast: choose strong or weak"),
        ({"steps": 0}, "--steps 0 must be at least 1"),
        ({"warmup_steps": -1}, "--warmup-steps -1"),
        ({"steps": 10, "warmup_steps": 10}, "leaves no steady step of --steps 10"),
        ({"script": " "}, "no training script"),
    ],
)
def test_bad_requests_give_one_line(fields, message) -> None:
    with pytest.raises(ScalingError) as caught:
        request(**fields)
    text = str(caught.value)
    assert message in text
    assert "\n" not in text
    assert isinstance(caught.value, ScalerunError)


def test_weak_scaling_does_not_need_a_dividing_batch() -> None:
    assert [s.per_rank_batch for s in request(mode="weak", batch=7).sizes] == [7, 7, 7]


def test_lists_become_tuples() -> None:
    made = StudyRequest(script="t.py", script_args=["--bs", PLACEHOLDER], ranks=[1, 2], batch=8)
    assert made.ranks == (1, 2) and made.script_args == ("--bs", PLACEHOLDER)


def test_describe_request_shows_the_batches() -> None:
    lines = describe_request(request(steps=20))
    assert lines[0] == "strong scaling of train.py at 1 rank, 2 ranks, 4 ranks"
    assert lines[1] == "per-rank batch 64, 32, 16; global batch 64, 64, 64"
    assert lines[2] == "20 steps per run, first 5 step(s) of each run are warm-up"
