"""The job report stands on its own: it reads step logs with the runtime's reader and
draws its pages with scalerun.pages, never through the scaling study."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import scalerun.report


def test_no_report_module_imports_the_scaling_study() -> None:
    names = [f"scalerun.report.{m.name}" for m in pkgutil.iter_modules(scalerun.report.__path__)]
    code = (f"import importlib, sys\nfor name in {names!r}: importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith('scalerun.scaling')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
    assert "scalerun.report.render" in names and "scalerun.report.steps" in names
