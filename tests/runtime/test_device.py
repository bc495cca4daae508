"""Device choice from visibility: the table of the cases the course runs into."""

from __future__ import annotations

import pytest

from scalerun.errors import PlacementError
from scalerun.runtime.device import choose_device

CASES = [
    # (name, local_rank, local_world_size, gpus seen, environ, expected device)
    ("cpu only", 3, 4, 0, {}, "cpu"),
    ("sees all 8 (course scripts)", 5, 8, 8, {"ROCR_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}, "cuda:5"),
    ("one GPU per task", 5, 8, 1, {"ROCR_VISIBLE_DEVICES": "5"}, "cuda:0"),
    ("one GPU per task, cuda", 2, 4, 1, {"CUDA_VISIBLE_DEVICES": "2"}, "cuda:0"),
    ("hidden GPUs", 1, 2, 0, {"CUDA_VISIBLE_DEVICES": ""}, "cpu"),
    ("single process on a GPU box", 0, 1, 4, {}, "cuda:0"),
    ("two GPUs per task", 1, 2, 2, {"CUDA_VISIBLE_DEVICES": "2,3"}, "cuda:1"),
]


@pytest.mark.parametrize(("name", "local_rank", "lws", "gpus", "environ", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_choose_device(name, local_rank, lws, gpus, environ, expected) -> None:
    choice = choose_device(local_rank=local_rank, local_world_size=lws, gpu_count=gpus,
                           environ=environ)
    assert choice.name == expected
    assert choice.reason


def test_too_few_visible_gpus_is_an_error_naming_the_fix() -> None:
    with pytest.raises(PlacementError) as error:
        choose_device(local_rank=5, local_world_size=8, gpu_count=4,
                      environ={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    message = str(error.value)
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3" in message and "--gpus-per-task=1" in message
