"""A warm copy of the per-node JIT caches, kept from one job to the next.

Why: the course puts MIOpen's, Triton's and TorchInductor's caches in node-local ``/tmp``
(one folder per job and node, :mod:`scalerun.netconf.caches`), because a cache on a
shared file system is slow and breaks under many ranks. So every job starts them cold,
and a cold first step costs the whole compilation again (measured here on CPU with
``torch.compile``: 40 s cold against 9 s from a restored copy; on MI250X minutes have been
reported). This module keeps a copy in a persistent folder (the site's
``[runtime] warm_cache``, ``~/.cache/scalerun/jit`` by default):

- **keyed** by what makes a compiled kernel usable: the GPU (vendor and PCI device id,
  or ``cpu``), torch's build (its distribution version names CUDA or ROCm, ``2.6.0+rocm6.2``)
  and :data:`LAYOUT`, this module's own layout. A copy made for another key is never
  looked at;
- **restored** by the first rank of each node, under the node's cache lock, before any
  rank compiles (the others wait on the lock and find it done);
- **saved back** by one node at the end of the job: the node's folders (what was restored
  plus what the job added), written beside the copy and renamed over it, so a reader sees
  the old copy or the new one, never half of one; within a size cap, evicting the copies
  used least recently;
- **checked**: a manifest lists every file with its size and SHA-256. A copy whose
  manifest is missing, foreign (another key or layout) or does not match its files is
  discarded with one line, never loaded.

Nothing here imports torch (the key's torch version is read from its metadata), so the
launcher side can save without it.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from scalerun import variables
from scalerun.files import file_sha256
from scalerun.netconf.settings import Setting
from scalerun.topology.sysfs import PCI_DIR

LAYOUT = 1
"""The layout of a copy (its folders and manifest); a copy of another layout is foreign."""
MANIFEST = "manifest.json"
FILES = "files"
"""``<key>/files/<folder>/...``: one folder per cache (``inductor``, ``triton``, ``miopen``)."""
RESTORED_MARK = ".scalerun-warm-restored"
"""In a node's cache root: the copy was restored there (the other ranks skip it), and
what a later save needs (the copy's folder, key, cap, and the node's cache folders)."""
LOCK = ".scalerun-cache.lock"
"""In a node's cache root: the lock the node's ranks take to restore the copy once."""
COPIES_LOCK = ".lock"
"""In the warm copies' folder: shared while a restore checks and reads a copy, exclusive
while a save replaces one or evicts, so a reader never sees a copy change under it."""
SKIPPED = (LOCK, RESTORED_MARK, "locks")
"""Names never copied: lock files and the mark (inductor keeps its lock files in ``locks``)."""
DEFAULT_CAP_BYTES = 10 * 1024**3


@dataclass(frozen=True)
class WarmCache:
    """Where the warm copies live, which one is this job's, and how much may be kept."""

    root: Path
    key: str
    cap_bytes: int = DEFAULT_CAP_BYTES

    @property
    def folder(self) -> Path:
        return self.root / self.key


@dataclass(frozen=True)
class Outcome:
    """What a restore or a save did, as one line for the job log."""

    files: int
    size: int
    line: str


def cache_key(gpu: str, torch_version: str) -> str:
    """``<gpu>-torch<version>-layout<N>``, in characters any file system takes."""
    raw = f"{gpu or 'cpu'}-torch{torch_version or 'unknown'}-layout{LAYOUT}"
    return re.sub(r"[^A-Za-z0-9._+-]", "_", raw)


def torch_version() -> str:
    """torch's distribution version without importing it (``2.13.0+cpu``); "" without torch."""
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return ""


def gpu_identity(vendor: str | None, pci: str | None, sysfs_root: Path = Path("/")) -> str:
    """``amd-740c``-style: the vendor and the PCI device id of the rank's GPU, which names
    its architecture (a kernel built for one runs on every GPU with that id); ``cpu``."""
    if not vendor:
        return "cpu"
    try:
        device = (sysfs_root / PCI_DIR / str(pci) / "device").read_text().strip()
    except OSError:
        return vendor
    return f"{vendor}-{device.removeprefix('0x')}"


# --- restore -------------------------------------------------------------------------------


def restore(warm: WarmCache, targets: Mapping[str, Path], node_root: Path) -> Outcome | None:
    """Fill the node's cache folders ``targets`` (name -> folder) from the warm copy, once
    per node: the first caller restores under the node's lock, later ones return None.

    A copy that fails its manifest is removed (with one line), and the folders stay empty.
    """
    node_root.mkdir(parents=True, exist_ok=True)
    with _locked(node_root / LOCK):
        mark = node_root / RESTORED_MARK
        if recorded(node_root) == (warm, dict(targets)):
            return None
        outcome = _restore_locked(warm, targets)
        mark.write_text(json.dumps({"root": str(warm.root), "key": warm.key,
                                    "cap_bytes": warm.cap_bytes, "files": outcome.files,
                                    "targets": {k: str(v) for k, v in targets.items()}}) + "\n")
    return outcome


def recorded(node_root: Path) -> tuple[WarmCache, dict[str, Path]] | None:
    """The copy and folders the node's caches were restored for (its mark), or None."""
    try:
        mark = json.loads((node_root / RESTORED_MARK).read_text())
        warm = WarmCache(Path(mark["root"]), str(mark["key"]), int(mark["cap_bytes"]))
        return warm, {str(k): Path(v) for k, v in dict(mark["targets"]).items()}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _restore_locked(warm: WarmCache, targets: Mapping[str, Path]) -> Outcome:
    """Check the copy and copy the files its manifest lists (nothing else: a link or a file
    the manifest does not name is never loaded), under the copies' shared lock; a copy that
    fails the check is removed under the exclusive lock, if it still fails then (a save may
    have replaced it meanwhile)."""
    if not warm.folder.is_dir():
        return Outcome(0, 0, f"warm JIT cache: none yet for {warm.key} in {warm.root}; "
                             "this job starts cold and saves one at its end")
    with _locked(warm.root / COPIES_LOCK, shared=True):
        problem = check_copy(warm)
        if not problem:
            return _copy_listed(warm, targets)
    with _locked(warm.root / COPIES_LOCK):
        problem = check_copy(warm) if warm.folder.is_dir() else None
        if problem:
            shutil.rmtree(warm.folder, ignore_errors=True)
            return Outcome(0, 0, f"warm JIT cache {warm.folder} discarded, never loaded: {problem}")
    return _restore_locked(warm, targets)  # replaced by a save meanwhile: the new copy, checked


def _copy_listed(warm: WarmCache, targets: Mapping[str, Path]) -> Outcome:
    listed = json.loads((warm.folder / MANIFEST).read_text())["files"]
    files = size = 0
    for relative in listed:
        name, _, rest = relative.partition("/")
        if name not in targets or not rest:
            continue
        target = targets[name] / rest
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(warm.folder / FILES / relative, target)
        files, size = files + 1, size + target.stat().st_size
    os.utime(warm.folder)  # used now: the last to be evicted
    return Outcome(files, size, f"warm JIT cache: restored {files} file(s), "
                                f"{_mib(size)} from {warm.folder}")


def check_copy(warm: WarmCache) -> str | None:
    """Why the copy must not be loaded, or None: manifest, key, layout, every file's hash."""
    try:
        manifest = json.loads((warm.folder / MANIFEST).read_text())
    except (OSError, ValueError) as error:
        return f"no readable {MANIFEST} ({error.__class__.__name__})"
    if not isinstance(manifest, dict):
        return f"{MANIFEST} is not an object"
    if manifest.get("key") != warm.key or manifest.get("layout") != LAYOUT:
        return (f"it was made for {manifest.get('key')!r} (layout {manifest.get('layout')}), "
                f"not {warm.key!r}")
    listed = manifest.get("files")
    if not isinstance(listed, dict):
        return f"{MANIFEST} lists no files"
    present = {str(p.relative_to(warm.folder / FILES)) for p in _files(warm.folder / FILES)}
    if present != set(listed):
        extra, missing = sorted(present - set(listed)), sorted(set(listed) - present)
        return f"its files differ from the manifest ({len(extra)} extra, {len(missing)} missing)"
    for relative, entry in listed.items():
        path = warm.folder / FILES / relative
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("size") \
                or file_sha256(path) != entry.get("sha256"):
            return f"{relative} does not match its recorded size and SHA-256"
    return None


# --- save ----------------------------------------------------------------------------------


def save(warm: WarmCache, targets: Mapping[str, Path]) -> Outcome:
    """Save the node's folders as the new copy for ``warm.key``, atomically, then evict
    the least recently used copies until all of them fit in ``warm.cap_bytes``."""
    sources = {name: folder for name, folder in targets.items() if folder.is_dir()}
    listed = {f"{name}/{p.relative_to(folder)}": p
              for name, folder in sources.items() for p in _files(folder)}
    size = sum(p.stat().st_size for p in listed.values())
    if not listed:
        return Outcome(0, 0, "warm JIT cache: nothing compiled on this node, nothing saved")
    if size > warm.cap_bytes:
        return Outcome(0, 0, f"warm JIT cache not saved: {_mib(size)} is more than the cap of "
                             f"{_mib(warm.cap_bytes)} (the site's [runtime] warm_cache_gb)")
    warm.root.mkdir(parents=True, exist_ok=True)
    with _locked(warm.root / COPIES_LOCK):
        if _unchanged(warm, listed):
            os.utime(warm.folder)
            return Outcome(0, 0, f"warm JIT cache: nothing new for {warm.key}")
        staging = warm.root / f".new-{warm.key}-{os.getpid()}"
        old = warm.root / f".old-{warm.key}-{os.getpid()}"
        try:
            _stage(staging, listed, warm.key)
            if warm.folder.exists():
                os.rename(warm.folder, old)
            try:
                os.rename(staging, warm.folder)
            except OSError:
                if old.exists():  # the old copy back: a failed save loses nothing
                    os.rename(old, warm.folder)
                raise
        finally:  # what a save that failed half-way wrote (a full disk) is not left behind
            shutil.rmtree(staging, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)
        evicted = evict(warm.root, warm.cap_bytes, keep=warm.key)
    note = f"; evicted {', '.join(evicted)} (least recently used)" if evicted else ""
    return Outcome(len(listed), size, f"warm JIT cache: saved {len(listed)} file(s), "
                                      f"{_mib(size)} to {warm.folder}{note}")


def _stage(staging: Path, listed: Mapping[str, Path], key: str) -> None:
    """The new copy beside the old one: its files and its manifest."""
    shutil.rmtree(staging, ignore_errors=True)
    manifest: dict[str, object] = {"key": key, "layout": LAYOUT, "saved": time.time(), "files": {}}
    for relative, path in listed.items():
        target = staging / FILES / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        manifest["files"][relative] = {"size": target.stat().st_size,  # type: ignore[index]
                                       "sha256": file_sha256(target),
                                       "mtime_ns": path.stat().st_mtime_ns}
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _unchanged(warm: WarmCache, listed: Mapping[str, Path]) -> bool:
    """The copy holds exactly these files already. A file whose size and modification
    time match the manifest's is taken as unchanged without hashing it (a restore keeps
    the times), so a launch whose node cache is large and already saved stays quick."""
    try:
        manifest = json.loads((warm.folder / MANIFEST).read_text())
        recorded = manifest["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    if not isinstance(recorded, dict) or set(recorded) != set(listed):
        return False
    for relative, path in listed.items():
        entry, stat = recorded[relative], path.stat()
        if not isinstance(entry, dict) or entry.get("size") != stat.st_size:
            return False
        if entry.get("mtime_ns") != stat.st_mtime_ns and entry.get("sha256") != file_sha256(path):
            return False
    return True


def copies(root: Path) -> list[tuple[str, int, float]]:
    """Every copy under ``root``: (key, bytes, last used), most recently used first."""
    if not root.is_dir():
        return []
    found = [(folder.name, sum(p.stat().st_size for p in _files(folder)), folder.stat().st_mtime)
             for folder in root.iterdir() if folder.is_dir() and not folder.name.startswith(".")]
    return sorted(found, key=lambda item: -item[2])


def evict(root: Path, cap_bytes: int, keep: str) -> list[str]:
    """Remove the least recently used copies (never ``keep``) until all fit the cap."""
    found = copies(root)
    total = sum(size for _, size, _ in found)
    evicted = []
    for key, size, _ in reversed(found):
        if total <= cap_bytes:
            break
        if key == keep:
            continue
        shutil.rmtree(root / key, ignore_errors=True)
        total -= size
        evicted.append(key)
    return evicted


# --- helpers -------------------------------------------------------------------------------


def _files(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and \
                not any(part in SKIPPED for part in path.relative_to(folder).parts):
            yield path


def _mib(size: int) -> str:
    return f"{size / 1024**2:.1f} MiB"


class _locked:
    """An exclusive (or shared) ``flock`` on ``path`` for the ``with`` block (the file is kept)."""

    def __init__(self, path: Path, shared: bool = False) -> None:
        self.path, self.shared = path, shared

    def __enter__(self) -> None:
        if self.shared:  # a reader of a copy it may not write (a project's read-only folder)
            try:
                self.handle = open(self.path, "a")
            except OSError:
                self.handle = open(self.path)
            fcntl.flock(self.handle, fcntl.LOCK_SH)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        self.handle.close()


# --- what a job's variables say ----------------------------------------------------------


def warm_of(environ: Mapping[str, str], gpu: str) -> WarmCache | None:
    """The job's warm copy from its variables (the plan sets them from the site and
    ``--no-warm-cache``), or None where it is off."""
    root = environ.get(variables.WARM_CACHE, "").strip()
    if not root or root == "off":
        return None
    try:
        cap = float(environ.get(variables.WARM_CACHE_GB, "") or DEFAULT_CAP_BYTES / 1024**3)
    except ValueError:
        cap = DEFAULT_CAP_BYTES / 1024**3
    return WarmCache(Path(os.path.expanduser(root)), cache_key(gpu, torch_version()),
                     int(cap * 1024**3))


def targets_of(settings: Iterable[Setting]) -> dict[str, Path]:
    """The per-job cache folders a warm copy fills: name (``inductor``, ``triton``,
    ``miopen``) -> folder, from the decided settings. The user's own folders are theirs
    and left alone; torch extensions are kept per node across jobs already."""
    from scalerun.netconf.caches import CACHE_VARIABLES, KEPT_ACROSS_JOBS

    folder_of = {name: folder for name, folder, _ in CACHE_VARIABLES}
    return {folder_of[s.name]: Path(s.value) for s in settings
            if s.name in folder_of and s.name not in KEPT_ACROSS_JOBS and s.source != "user"}
