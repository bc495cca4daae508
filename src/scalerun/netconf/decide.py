"""The one place that decides a rank's communication and cache environment.

Inputs are data (the node's topology, the rank's binding, the site profile, the
library versions, the user's environment); the output is a list of
:class:`~scalerun.netconf.settings.Setting`. Its one caller is
:func:`scalerun.plan.rank.plan_rank`: launchers export the plan, ``scalerun env``
prints it, ``scalerun doctor`` checks against it. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from string import Template

from scalerun import variables
from scalerun.job import detect_job
from scalerun.netconf.caches import cache_settings
from scalerun.netconf.gpu_direct import gdr_setting
from scalerun.netconf.interfaces import InterfaceChoice, choose_interfaces
from scalerun.netconf.settings import Setting, respect_user
from scalerun.topology.model import Nic


@dataclass(frozen=True, kw_only=True)
class RankFacts:
    """What the rank plan (:mod:`scalerun.plan.rank`) decided about one rank."""

    threads: int | None = None
    """The rank's compute threads, decided by :mod:`scalerun.plan.rank`; None: leave unset."""
    nic: str | None = None
    """The NIC nearest the rank's GPU, from the topology."""
    gpu_vendor: str | None = None
    """"amd", "nvidia" or None for a CPU-only rank."""
    loader_workers: int = 0
    num_nodes: int = 1
    cpu_compute: bool = False
    """The rank computes on the CPU (gloo): its heap churns every step."""
    world_size: int = 1


#: glibc's malloc thresholds for CPU ranks, fixed (see :func:`malloc_setting`).
MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
MALLOC_TRIM_THRESHOLD = 128 * 1024 * 1024
MALLOC_TUNABLES = (f"glibc.malloc.mmap_threshold={MALLOC_MMAP_THRESHOLD}:"
                   f"glibc.malloc.trim_threshold={MALLOC_TRIM_THRESHOLD}")


def malloc_setting(rank: RankFacts, environ: Mapping[str, str]) -> Setting | None:
    """Fixed malloc thresholds for a rank that computes on the CPU.

    Why: glibc adapts its thresholds as large tensors come and go, then gives the top of
    the heap back to the kernel at the end of each step, and the next step faults it in
    again: measured 260-3,300 minor page faults per step in scalerun's DDP loop against
    0-150 in the hand-written one, 0.5-6 % of the step in system time
    (``benchmarks/overhead.py``). Fixed thresholds keep up to 128 MiB of freed memory per
    rank instead. Left alone where the user tuned malloc (``MALLOC_*``) and off with
    ``SCALERUN_MALLOC=0``; ``scalerun.init`` also applies it to its own running process.
    """
    tuned = any(name.startswith("MALLOC_") and name.endswith("_") for name in environ)
    if not rank.cpu_compute or tuned or environ.get(variables.MALLOC, "1") == "0":
        return None
    return Setting("GLIBC_TUNABLES", MALLOC_TUNABLES, "default",
                   "fixed malloc thresholds: a CPU rank's heap is not trimmed and faulted in "
                   "again every step")


def accelerate_cpu_setting(rank: RankFacts) -> Setting | None:
    """``ACCELERATE_USE_CPU=1`` for ranks of a world that compute on the CPU.

    Why: Accelerate forms a CPU world (gloo) only when told, as ``accelerate launch --cpu``
    does; without it every rank says "DistributedType.NO, Num processes: 1" and trains the
    whole job alone, N copies racing on one output folder (issue 29). Only Accelerate
    reads it; the user's own value wins."""
    if not rank.cpu_compute or rank.world_size < 2:
        return None
    return Setting("ACCELERATE_USE_CPU", "1", "default",
                   "Accelerate joins CPU ranks into one world only when told (accelerate launch --cpu sets it)")


@dataclass(frozen=True)
class Decision:
    """The settings for one rank plus the interface choice behind them."""

    settings: tuple[Setting, ...]
    interfaces: InterfaceChoice | None


def decide_environment(
    *,
    rank: RankFacts,
    nics: Sequence[Nic] = (),
    site_interfaces: Sequence[str] = (),
    site_task_env: Mapping[str, str] | None = None,
    site_gdr_level: str | None = None,
    site: str = "",
    rocm_version: str | None = None,
    environ: Mapping[str, str],
) -> Decision:
    """Every variable scalerun would set for this rank, with its source and reason."""
    settings: list[Setting] = []
    interfaces = None
    if rank.num_nodes > 1 or site_interfaces:
        interfaces = choose_interfaces(nics, site_interfaces=site_interfaces, nearest=rank.nic)
        settings += _interface_settings(interfaces)
    if rank.gpu_vendor:
        settings.append(Setting("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "default",
                                "GPU numbers follow PCI bus order, as ROCm and the topology do"))
    gdr = gdr_setting(rank.gpu_vendor, rocm_version, site_gdr_level, site)
    if gdr:
        settings.append(gdr)
    settings += _collective_error_settings(rank, environ)
    if rank.threads:
        settings.append(Setting("OMP_NUM_THREADS", str(rank.threads), "topology",
                                f"one thread per core of the rank's CPU share ({rank.threads})"))
    if rank.loader_workers > 0:
        settings.append(Setting("TOKENIZERS_PARALLELISM", "false", "default",
                                "tokenizer threads inside loader workers oversubscribe the cores"))
    settings += _cache_settings(rank, environ)
    settings += [s for s in [malloc_setting(rank, environ), accelerate_cpu_setting(rank)] if s is not None]
    settings = _apply_site(settings, site_task_env or {}, environ)
    return Decision(tuple(respect_user(settings, environ)), interfaces)


NCCL_ERROR_HANDLING = (
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING", "1",
     f"a collective that outlives the process-group timeout ({variables.TIMEOUT}) aborts the "
     "communicator and ends the rank, and the launcher the job; torch elastic gives its "
     "workers the same, so ranks behave alike under srun and torchrun"),
    ("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT", "0",
     "collectives stay asynchronous (blocking waits cost a CPU sync each); the timeout is "
     "enforced by torch's NCCL watchdog instead"),
)
"""(torch >= 2.2 name, the older name, value, reason). scalerun needs torch >= 2.4, which
reads the TORCH_NCCL_ spelling first; a value the user set under the old one is kept."""


def _collective_error_settings(rank: RankFacts, environ: Mapping[str, str]) -> list[Setting]:
    """NCCL/RCCL ranks (a GPU): how a timed-out collective ends. Gloo needs nothing: its
    operations fail by themselves at the process-group timeout."""
    if not rank.gpu_vendor:
        return []
    settings = []
    for name, old, value, reason in NCCL_ERROR_HANDLING:
        if old in environ and name not in environ:  # torch would read ours before the user's
            settings.append(Setting(old, environ[old], "user",
                                    f"already set by you under the name torch < 2.2 read ({reason})"))
        else:
            settings.append(Setting(name, value, "default", reason))
    return settings


def _interface_settings(choice: InterfaceChoice) -> list[Setting]:
    if not choice.names:
        return []
    why = f"{choice.reason}: {choice.ifname}"
    return [
        Setting("NCCL_SOCKET_IFNAME", choice.ifname, "site" if choice.kind == "site" else "topology", why),
        Setting("GLOO_SOCKET_IFNAME", choice.ifname, "site" if choice.kind == "site" else "topology", why),
    ]


def _cache_settings(rank: RankFacts, environ: Mapping[str, str]) -> list[Setting]:
    """MIOpen caches on AMD GPUs; Triton with any GPU; TorchInductor everywhere; torch
    extensions (DeepSpeed's and Horovod's JIT ops) in SLURM jobs, whose home folder is shared
    by every node (on one machine torch's own folder in the home is the right one)."""
    wanted = {"TORCHINDUCTOR_CACHE_DIR"}
    if detect_job(environ).scheduler:
        wanted.add("TORCH_EXTENSIONS_DIR")
    if rank.gpu_vendor:
        wanted.add("TRITON_CACHE_DIR")
    if rank.gpu_vendor == "amd":
        wanted |= {"MIOPEN_USER_DB_PATH", "MIOPEN_USER_DB", "MIOPEN_CUSTOM_CACHE_DIR"}
    return [s for s in cache_settings(environ) if s.name in wanted]


def _apply_site(
    settings: list[Setting], site_task_env: Mapping[str, str], environ: Mapping[str, str]
) -> list[Setting]:
    """The site's per-task variables replace scalerun's defaults of the same name.

    ``${USER}``-style references are filled from the rank's environment, as the shell
    would in a job script. A value naming a variable that is not set here (``${SLURM_NODEID}``
    outside a SLURM job) is left out, and scalerun's default of that name, if any, stays:
    kept as written, it would be a folder literally named ``/tmp/${USER}-miopen-cache-...``
    that every rank then creates and uses.
    """
    site = [Setting(name, Template(value).safe_substitute(environ), "site",
                    "site profile [task_env]")
            for name, value in site_task_env.items()
            if all(ref in environ for ref in Template(value).get_identifiers())]
    names = {s.name for s in site}
    kept = [s for s in settings if s.name not in names]
    return _one_miopen_folder(kept, site) + site


MIOPEN_VARIABLES = ("MIOPEN_USER_DB_PATH", "MIOPEN_USER_DB", "MIOPEN_CUSTOM_CACHE_DIR")


def _one_miopen_folder(settings: list[Setting], site: list[Setting]) -> list[Setting]:
    """MIOpen's variables share the site's folder when the site names one for any of them,
    so that the old and new spellings never point at two different caches."""
    folder = next((s.value for s in site if s.name in MIOPEN_VARIABLES), None)
    if folder is None:
        return settings
    return [
        replace(s, value=folder, source="site", reason="the site's MIOpen cache folder")
        if s.name in MIOPEN_VARIABLES else s
        for s in settings
    ]
