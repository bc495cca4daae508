"""Per-node JIT caches on node-local storage: MIOpen, Triton, TorchInductor, torch extensions.

MIOpen keeps compiled kernels in an SQLite database under ``$HOME`` by default; many ranks
on a shared file system then lock each other out or corrupt it. The course puts one
cache per node in ``/tmp``; a known LUMI failure is several torchrun ranks creating (or
one deleting) that folder at once. Here the folder is created once per node, before
ranks use it, with ``mkdir -p`` semantics and a lock, and never deleted by a rank.

A SLURM job's folders are named by its id, so no later job uses them: the job script
removes them on every node once its ranks have ended (:func:`remove_job_caches`), after
the warm copy took what they held. Left there, every job would leave its caches, and the
warm copy it restored, in ``/tmp`` (on LUMI a RAM disk) until someone cleans the node.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import shutil
from collections.abc import Mapping
from pathlib import Path

from scalerun.job import detect_job
from scalerun.netconf.settings import Setting

CACHE_VARIABLES = (
    ("MIOPEN_USER_DB_PATH", "miopen", "MIOpen's performance database (ROCm < 6.x spelling)"),
    ("MIOPEN_USER_DB", "miopen", "MIOpen's performance database (newer spelling)"),
    ("MIOPEN_CUSTOM_CACHE_DIR", "miopen", "MIOpen's compiled-kernel cache"),
    ("TRITON_CACHE_DIR", "triton", "Triton's compiled kernels (torch.compile)"),
    ("TORCHINDUCTOR_CACHE_DIR", "inductor", "TorchInductor's generated code"),
    ("TORCH_EXTENSIONS_DIR", "torch_extensions",
     "ops DeepSpeed and Horovod compile at run time (on a shared home, ranks race to build them)"),
)
KEPT_ACROSS_JOBS = frozenset({"TORCH_EXTENSIONS_DIR"})
"""Built once per node and reused by the next job there: a build takes minutes, and the
ops do not change between jobs (MIOpen's and Triton's caches stay per job: they hold
tuning results of one job's shapes, and a corrupt one must not outlive it)."""


def cache_root(environ: Mapping[str, str], *, base: str = "/tmp") -> str:
    """One folder per user, job and node on node-local storage."""
    user = _user(environ)
    job = detect_job(environ)
    node = 0 if job.node_index is None else job.node_index
    return f"{base}/{user}-scalerun-cache-{job.job_id or 'local'}-node{node}"


def _user(environ: Mapping[str, str]) -> str:
    return environ.get("USER") or environ.get("LOGNAME") or _login_name()


def _login_name() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without a passwd entry (some containers)
        return str(os.getuid())


def cache_settings(environ: Mapping[str, str], *, base: str = "/tmp") -> list[Setting]:
    """The cache variables, under :func:`cache_root` (per job and node), or per user and
    node for those :data:`KEPT_ACROSS_JOBS`."""
    root = cache_root(environ, base=base)
    kept = f"{base}/{_user(environ)}-scalerun-cache"
    return [
        Setting(name, f"{kept if name in KEPT_ACROSS_JOBS else root}/{folder}", "default",
                f"{why}, per node on local storage")
        for name, folder, why in CACHE_VARIABLES
    ]


def create_cache_dirs(settings: list[Setting]) -> list[Path]:
    """Create the cache folders once per node, safe when every rank calls it at once.

    ``mkdir(exist_ok=True)`` under an exclusive lock: the first rank creates, the others
    find the folders ready; nobody deletes a folder another rank may be using.
    """
    folders = sorted({Path(s.value) for s in settings if s.name in {v for v, _, _ in CACHE_VARIABLES}})
    if not folders:
        return []
    parent = folders[0].parent
    parent.mkdir(parents=True, exist_ok=True)
    with open(parent / ".scalerun-cache.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for folder in folders:
            folder.mkdir(parents=True, exist_ok=True)
    return folders


def remove_job_caches(environ: Mapping[str, str], *, base: str = "/tmp") -> Path | None:
    """Remove this node's folders of this SLURM job (:func:`cache_root`), once no rank of
    the job runs on the node; the folder removed, or None.

    Only a job's own: a launch outside SLURM shares ``...-local-node0`` with the user's
    other launches, and the folders :data:`KEPT_ACROSS_JOBS` are for the next job."""
    if not detect_job(environ).scheduler:
        return None
    root = Path(cache_root(environ, base=base))
    if not root.is_dir():
        return None
    shutil.rmtree(root, ignore_errors=True)
    return root
