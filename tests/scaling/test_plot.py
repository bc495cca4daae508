"""``scaling.png`` is a PNG of the promised size, written whole; with nothing to plot, one line."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from scalerun.scaling.batches import ScalingError
from scalerun.scaling.model import ModelInputs, predict_all
from scalerun.scaling.plot import DPI, HEIGHT_IN, WIDTH_IN, write_plot
from tests.scaling.test_results import result

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from the IHDR chunk, which a PNG must start with."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_SIGNATURE
    length, kind = struct.unpack(">I4s", head[8:16])
    assert kind == b"IHDR" and length == 13
    return struct.unpack(">II", head[16:24])


def rows():
    from scalerun.scaling.results import scaling_rows

    return scaling_rows([result(1, 100.0), result(2, 180.0), result(4, 300.0), result(8, None)])


@pytest.mark.parametrize("with_model", [False, True])
def test_plot_is_a_png_of_the_expected_size(tmp_path: Path, with_model: bool) -> None:
    predictions = predict_all(ModelInputs(busbw_gbs=10.0, grad_bytes=10**8, base_ranks=1, base_data_s=0.0,
                                          base_compute_s=0.2, mode="strong"), [1, 2, 4, 8, 16, 32, 64]) \
        if with_model else []
    path = write_plot(tmp_path / "out" / "scaling.png", rows(), predictions)
    assert png_size(path) == (int(WIDTH_IN * DPI), int(HEIGHT_IN * DPI)) == (1000, 400)
    assert [p.name for p in path.parent.iterdir()] == ["scaling.png"]  # no temporary left


def test_one_size_still_plots(tmp_path: Path) -> None:
    from scalerun.scaling.results import scaling_rows

    path = write_plot(tmp_path / "scaling.png", scaling_rows([result(2, 50.0)]))
    assert png_size(path) == (1000, 400)


def test_nothing_finished_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScalingError, match="no size of the study finished"):
        write_plot(tmp_path / "scaling.png", [])
