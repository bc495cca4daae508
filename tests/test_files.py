"""Files scalerun writes (job scripts, run.json, run directories): atomic, with the user's
umask, never world-writable."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

WRITE_UNDER_UMASK = """
import os, sys
from pathlib import Path
os.umask(int(sys.argv[1], 8))
from scalerun.files import make_dirs, write_text_atomic
base = Path(sys.argv[2])
make_dirs(base / "run" / "sub")
write_text_atomic(base / "run" / "job.sbatch", "#!/bin/bash\\n", executable=True)
write_text_atomic(base / "run" / "run.json", "{}\\n")
"""


@pytest.mark.parametrize(("umask", "script", "data", "folder"), [
    ("022", 0o755, 0o644, 0o755),
    ("077", 0o700, 0o600, 0o700),
    ("000", 0o775, 0o664, 0o775),  # even then nothing scalerun writes is world-writable
])
def test_files_follow_the_umask(umask: str, script: int, data: int, folder: int, tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    subprocess.run([sys.executable, "-c", WRITE_UNDER_UMASK, umask, str(tmp_path)], env=env,
                   check=True, timeout=60)

    def mode(path: Path) -> int:
        return stat.S_IMODE(path.stat().st_mode)

    run = tmp_path / "run"
    assert (mode(run / "job.sbatch"), mode(run / "run.json")) == (script, data)
    assert (mode(run), mode(run / "sub")) == (folder, folder)
    assert not list(run.glob(".*.tmp"))
