"""DeepSpeed's C++/CUDA ops as the doctor sees them: ``ds_report``'s table, and which ops a
config needs.

Why: DeepSpeed builds the ops it was not installed with the first time they are used
(just-in-time, 1-2 minutes each), on every node whose ``TORCH_EXTENSIONS_DIR`` does not
hold them yet, and several ranks building into one shared home folder race. The course
prebuilds its ops (``DS_BUILD_FUSED_ADAM=1 ... pip install deepspeed``) and checks them
with ``ds_report``. The doctor reads the same table through DeepSpeed's own API (op
builders' ``is_compatible``, ``git_version_info.installed_ops``) and tells before
training which op of the run's config would be compiled, and where.

:func:`ops_needed` is the pure rule (config in, op names out); :func:`read_deepspeed` is
the edge that imports DeepSpeed and looks at the node. Nothing here changes the process,
builds an op, or imports DeepSpeed at import time.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from scalerun import variables

SHM_COMM = "deepspeed_shm_comm"
"""The shared-memory collective op DeepSpeed's comm layer builds on CPU accelerators."""
OFFLOAD_DEVICES = ("cpu", "nvme")
PLACEHOLDERS = frozenset({"deepspeed_not_implemented"})
"""Builders DeepSpeed lists that are not ops (ds_report shows them; the doctor does not)."""


@dataclass(frozen=True, kw_only=True)
class OpState:
    """One row of ``ds_report``'s op table, plus whether this node already built it."""

    name: str
    prebuilt: bool
    """Compiled into the installed DeepSpeed (ds_report's "installed [YES]")."""
    compatible: bool
    """The node can JIT-build it (ds_report's "compatible [OKAY]")."""
    cached: bool = False
    """A JIT build is already in this node's ``TORCH_EXTENSIONS_DIR``: loaded, not rebuilt."""
    builder: str = ""
    """The op builder's class name, for the command that builds it ahead of time."""
    build_var: str = ""
    """The ``DS_BUILD_*`` variable that prebuilds it at ``pip install deepspeed``."""


@dataclass(frozen=True, kw_only=True)
class DeepSpeedFacts:
    """What one node's DeepSpeed can do, and what the run's config asks of it."""

    version: str
    accelerator: str
    """DeepSpeed's accelerator name: cuda (also ROCm), cpu, ..."""
    ninja: bool
    """JIT builds need ninja."""
    extensions_dir: str
    """Where JIT builds go and are looked up (``TORCH_EXTENSIONS_DIR`` or torch's default)."""
    ops: tuple[OpState, ...] = ()
    config: str | None = None
    """The run's DeepSpeed config file (``$SCALERUN_DEEPSPEED_CONFIG``), if one is named."""
    needs: tuple[str, ...] = ()
    """The ops that config makes DeepSpeed load (:func:`ops_needed`)."""
    error: str | None = None
    """Why the config could not be read."""
    unread: bool = False
    """Installed, but not imported: the quick check of a launch that names no DeepSpeed
    config leaves it (importing DeepSpeed costs 1.5 s of CPU per node, and more on a shared
    file system, in every job)."""

    def op(self, name: str) -> OpState | None:
        return next((op for op in self.ops if op.name == name), None)


def deepspeed_from_dict(data: Mapping[str, Any]) -> DeepSpeedFacts:
    """Rebuild from the JSON form (``--json`` output, recorded runs)."""
    names = {f.name for f in fields(DeepSpeedFacts)}
    values = {key: value for key, value in data.items() if key in names}
    values["ops"] = tuple(OpState(**op) for op in values.get("ops", ()))
    values["needs"] = tuple(values.get("needs", ()))
    return DeepSpeedFacts(**values)


# ---------------------------------------------------------------------------
# The pure rule: which ops a config makes DeepSpeed load
# ---------------------------------------------------------------------------


def _offloaded(zero: Mapping[str, Any], key: str) -> str | None:
    section = zero.get(key)
    if not isinstance(section, Mapping):
        return None
    device = str(section.get("device", "none")).lower()
    return device if device in OFFLOAD_DEVICES else None


def optimizer_ops(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The op DeepSpeed builds for the config's ``optimizer`` section (engine.py's choice)."""
    section = config.get("optimizer")
    if not isinstance(section, Mapping):
        return ()
    kind = str(section.get("type", "")).lower()
    params = section.get("params") or {}
    offload = _offloaded(config.get("zero_optimization") or {}, "offload_optimizer") is not None
    if kind in ("adam", "adamw"):
        if params.get("torch_adam"):
            return ()
        return ("cpu_adam",) if offload else ("fused_adam",)
    return {
        "lamb": ("fused_lamb",),
        "lion": ("cpu_lion",) if offload else ("fused_lion",),
        "adagrad": ("cpu_adagrad",) if offload else (),
    }.get(kind, ())


def ops_needed(config: Mapping[str, Any], accelerator: str) -> tuple[str, ...]:
    """The ops DeepSpeed loads for ``config`` on ``accelerator``, in a fixed order.

    Adam/AdamW: fused_adam, or cpu_adam with the optimizer offloaded (none with
    ``torch_adam``); Lamb: fused_lamb; Lion: fused_lion/cpu_lion; Adagrad offloaded:
    cpu_adagrad; an offload to NVMe: async_io; a CPU accelerator: the shared-memory
    collective op, which DeepSpeed's comm layer builds whatever the config says.
    """
    zero = config.get("zero_optimization") or {}
    needs = list(optimizer_ops(config))
    if "nvme" in (_offloaded(zero, "offload_optimizer"), _offloaded(zero, "offload_param")):
        needs.append("async_io")
    if accelerator == "cpu":
        needs.append(SHM_COMM)
    return tuple(dict.fromkeys(needs))


# ---------------------------------------------------------------------------
# The edge: DeepSpeed on this node
# ---------------------------------------------------------------------------


def extensions_dir(environ: Mapping[str, str]) -> str:
    """Where torch's JIT builds live: ``TORCH_EXTENSIONS_DIR``, else torch's default root
    and the ``py311_cpu``/``cu121``/``rocm60`` folder torch names after its build."""
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return environ["TORCH_EXTENSIONS_DIR"]
    import torch
    from torch.utils.cpp_extension import get_default_build_root

    if torch.version.hip is not None:
        flavour = "rocm" + torch.version.hip.replace(".", "")
    elif torch.version.cuda is not None:
        flavour = "cu" + torch.version.cuda.replace(".", "")
    else:
        flavour = "cpu"
    python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
    return os.path.join(get_default_build_root(), f"{python}_{flavour}")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DeepSpeed logs its accelerator choice and prints probe warnings while importing:
    keep them out of the doctor's report."""
    logger = logging.getLogger("DeepSpeed")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            yield
    finally:
        logger.setLevel(level)


def _op_state(builder: Any, prebuilt: bool, folder: str) -> OpState:
    try:
        compatible = bool(builder.is_compatible(False))
    except Exception:  # noqa: BLE001 - a probe that fails means "cannot build here", as ds_report says
        compatible = False
    name = builder.name
    return OpState(name=name, prebuilt=prebuilt, compatible=compatible,
                   cached=(Path(folder) / name / f"{name}.so").is_file(),
                   builder=type(builder).__name__, build_var=getattr(builder, "BUILD_VAR", ""))


def op_table(folder: str) -> tuple[str, str, bool, tuple[OpState, ...]]:
    """(version, accelerator, ninja, ops) as ``ds_report`` shows them, through DeepSpeed's API."""
    with _quiet():
        import deepspeed
        from deepspeed.accelerator import get_accelerator
        from deepspeed.git_version_info import accelerator_name, installed_ops
        from deepspeed.ops.op_builder.all_ops import ALL_OPS
        from torch.utils.cpp_extension import is_ninja_available

        accelerator = get_accelerator()._name
        built_here = accelerator_name == accelerator  # ops built for another accelerator do not count
        ops = tuple(_op_state(builder, built_here and bool(installed_ops.get(name)), folder)
                    for name, builder in sorted(ALL_OPS.items()) if name not in PLACEHOLDERS)
        return deepspeed.__version__, accelerator, bool(is_ninja_available()), ops


def _config_needs(path: str | None, accelerator: str) -> tuple[tuple[str, ...], str | None]:
    if not path:
        return (), None
    from scalerun.errors import ScalerunError
    from scalerun.runtime.strategies.deepspeed_config import load_config

    try:
        return ops_needed(load_config(path), accelerator), None
    except ScalerunError as error:
        return (), str(error)


def read_deepspeed(environ: Mapping[str, str], *, quick: bool = False) -> DeepSpeedFacts | None:
    """This node's DeepSpeed, or None where it is not installed (nothing is imported then).
    ``quick`` (a job's first step): imported only when the launch names a DeepSpeed config,
    else :attr:`DeepSpeedFacts.unread`."""

    if importlib.util.find_spec("deepspeed") is None:
        return None
    if quick and not environ.get(variables.DEEPSPEED_CONFIG):
        return DeepSpeedFacts(version="", accelerator="", ninja=False, extensions_dir="", unread=True)
    folder = extensions_dir(environ)
    version, accelerator, ninja, ops = op_table(folder)
    config = environ.get(variables.DEEPSPEED_CONFIG) or None
    needs, error = _config_needs(config, accelerator)
    return DeepSpeedFacts(version=version, accelerator=accelerator, ninja=ninja,
                          extensions_dir=folder, ops=ops, config=config, needs=needs, error=error)
