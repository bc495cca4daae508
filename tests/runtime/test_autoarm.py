"""The hooks reach a rank whose script never imports scalerun: the boot folder's
``sitecustomize`` arms them once torch is imported, hands over to the interpreter's own
``sitecustomize``, and never breaks the script. Real interpreters, started as ``scalerun
exec`` starts a rank (the boot folder first on ``PYTHONPATH``, a run directory)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.commands.exec_ import step_hooks_env
from scalerun.runtime.autoarm import BOOT_DIR, python_path_with_boot

RUN = "/runs/r1"


@pytest.mark.parametrize(("environ", "expected"), [
    ({variables.RUN_DIR: RUN}, str(BOOT_DIR)),
    ({variables.RUN_DIR: RUN, "PYTHONPATH": "/mine:/theirs"}, f"{BOOT_DIR}:/mine:/theirs"),
    ({variables.RUN_DIR: RUN, "PYTHONPATH": f"{BOOT_DIR}:/mine"}, None),  # already first
    ({variables.RUN_DIR: RUN, variables.STEP_HOOKS: "0"}, None),  # turned off
    ({variables.RUN_DIR: RUN, variables.STEP_HOOKS: "1"}, str(BOOT_DIR)),
    ({"PYTHONPATH": "/mine"}, None),  # no run directory: no step log to write
])
def test_python_path_with_boot(environ: dict, expected: str | None) -> None:
    assert python_path_with_boot(environ) == expected
    assert step_hooks_env(environ) == ({"PYTHONPATH": expected} if expected else {})


def python(code: str, tmp_path: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RANK", "WORLD_SIZE")}
    env.update({variables.RUN_DIR: str(tmp_path / "run"), "PYTHONPATH": str(BOOT_DIR),
                "OMP_NUM_THREADS": "1", **extra})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)


ARMED = "import sys; from scalerun.runtime import loophooks; print('armed', loophooks._hooks is not None)"


def test_armed_once_torch_is_imported_and_not_before(tmp_path: Path) -> None:
    done = python(f"import sys; print('torch' in sys.modules); import torch; {ARMED}", tmp_path)
    assert done.stdout.split() == ["False", "armed", "True"], done.stderr
    done = python("import sys; print('torch' in sys.modules, 'scalerun.runtime.loophooks' in sys.modules)",
                  tmp_path)
    assert done.stdout.split() == ["False", "False"], done.stderr  # no torch: nothing loaded


def test_the_interpreters_own_sitecustomize_still_runs(tmp_path: Path) -> None:
    theirs = tmp_path / "site"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS'] = 'ran'\n")
    code = f"import os, torch; print(os.environ.get('THEIRS')); {ARMED}"
    done = python(code, tmp_path, PYTHONPATH=f"{BOOT_DIR}{os.pathsep}{theirs}")
    assert done.stdout.split() == ["ran", "armed", "True"], done.stderr


def test_off_when_the_user_says_so(tmp_path: Path) -> None:
    done = python(f"import torch; {ARMED}", tmp_path, **{variables.STEP_HOOKS: "0"})
    assert done.stdout.split() == ["armed", "False"], done.stderr


def test_a_broken_scalerun_is_one_line_and_the_script_runs(tmp_path: Path) -> None:
    """A scalerun that fails on import (here one that raises, first on the path): the
    script runs, and stderr has one line about the hooks, no traceback."""
    boot = tmp_path / "boot"
    (boot / "scalerun").mkdir(parents=True)
    (boot / "sitecustomize.py").write_text((BOOT_DIR / "sitecustomize.py").read_text())
    (boot / "scalerun" / "__init__.py").write_text("raise RuntimeError('broken install')\n")
    done = python("print('script ran')", tmp_path, PYTHONPATH=str(boot))
    assert done.stdout.strip() == "script ran", done.stderr
    assert done.stderr.strip() == ("scalerun: no step log hooks in this process "
                                   "(RuntimeError: broken install)")
