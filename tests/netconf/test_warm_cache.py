"""The warm JIT-cache copy: keyed, checked, restored once per node, saved atomically."""

from __future__ import annotations

import fcntl
import json
import multiprocessing
import os
import shutil
import threading
from pathlib import Path

import pytest

from scalerun import variables
from scalerun.netconf.settings import Setting
from scalerun.netconf.warm_cache import (
    COPIES_LOCK,
    LAYOUT,
    MANIFEST,
    WarmCache,
    cache_key,
    copies,
    gpu_identity,
    recorded,
    restore,
    save,
    targets_of,
    warm_of,
)


def node_folders(root: Path) -> dict[str, Path]:
    return {"inductor": root / "inductor", "miopen": root / "miopen"}


def compiled(folders: dict[str, Path], **files: str) -> None:
    """Files as a job's compilations leave them: ``name/rel/path=content``."""
    for spec, content in files.items():
        name, _, relative = spec.partition("__")
        path = folders[name] / relative.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)


def test_a_saved_copy_restores_into_another_jobs_folders(tmp_path: Path) -> None:
    warm = WarmCache(tmp_path / "warm", cache_key("cpu", "2.13.0+cpu"))
    first = node_folders(tmp_path / "job1")
    compiled(first, inductor__fxgraph__ab__entry="graph", miopen__gfx90a_db="kernels")
    (first["inductor"] / "locks").mkdir()
    (first["inductor"] / "locks" / "x.lock").write_text("")  # never copied
    saved = save(warm, first)
    assert (saved.files, saved.line.startswith("warm JIT cache: saved 2 file(s)")) == (2, True)

    second = node_folders(tmp_path / "job2")
    outcome = restore(warm, second, tmp_path / "job2")
    assert outcome is not None and outcome.files == 2, outcome
    assert (second["inductor"] / "fxgraph/ab/entry").read_text() == "graph"
    assert (second["miopen"] / "gfx90a_db").read_text() == "kernels"
    assert not (second["inductor"] / "locks").exists()
    assert recorded(tmp_path / "job2") == (warm, second)


def test_only_the_first_rank_of_a_node_restores(tmp_path: Path) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "old"), inductor__a="1")
    save(warm, node_folders(tmp_path / "old"))
    node = tmp_path / "node"
    assert restore(warm, node_folders(node), node) is not None
    assert restore(warm, node_folders(node), node) is None


def _restore_in_process(warm_root: str, node: str, results: multiprocessing.Queue) -> None:
    outcome = restore(WarmCache(Path(warm_root), "k"), node_folders(Path(node)), Path(node))
    results.put(None if outcome is None else outcome.files)


def test_ranks_restoring_at_once_restore_once_and_find_every_file(tmp_path: Path) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "old"), **{f"inductor__f{i}": "x" * 1000 for i in range(200)})
    save(warm, node_folders(tmp_path / "old"))
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    node = tmp_path / "node"
    ranks = [context.Process(target=_restore_in_process, args=(str(warm.root), str(node), results))
             for _ in range(4)]
    for rank in ranks:
        rank.start()
    outcomes = [results.get(timeout=120) for _ in ranks]
    for rank in ranks:
        rank.join(60)
    assert sorted(outcomes, key=str) == [200, None, None, None]
    assert len(list((node / "inductor").iterdir())) == 200


@pytest.mark.parametrize("damage", ["manifest", "content", "extra file", "foreign key"])
def test_a_damaged_or_foreign_copy_is_discarded_never_loaded(tmp_path: Path, damage: str) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "old"), inductor__a="good", inductor__b="good")
    save(warm, node_folders(tmp_path / "old"))
    files = warm.folder / "files"
    if damage == "manifest":
        (warm.folder / MANIFEST).write_text("{not json")
    elif damage == "content":
        (files / "inductor" / "a").write_text("evil")  # same size, other bytes
    elif damage == "extra file":
        (files / "inductor" / "planted").write_text("x")
    else:
        manifest = json.loads((warm.folder / MANIFEST).read_text())
        (warm.folder / MANIFEST).write_text(json.dumps({**manifest, "key": "rocm-other"}))
    node = tmp_path / "node"
    outcome = restore(warm, node_folders(node), node)
    assert outcome is not None and outcome.files == 0
    assert outcome.line.startswith(f"warm JIT cache {warm.folder} discarded, never loaded: ")
    assert "\n" not in outcome.line
    assert not warm.folder.exists()
    assert not (node / "inductor" / "a").exists()


def test_a_save_keeps_what_was_restored_and_adds_what_is_new(tmp_path: Path) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "j1"), inductor__a="1")
    save(warm, node_folders(tmp_path / "j1"))
    node = node_folders(tmp_path / "j2")
    restore(warm, node, tmp_path / "j2")
    assert save(warm, node).line == "warm JIT cache: nothing new for k"
    compiled(node, inductor__b="2")
    assert save(warm, node).files == 2
    manifest = json.loads((warm.folder / MANIFEST).read_text())
    assert sorted(manifest["files"]) == ["inductor/a", "inductor/b"]
    assert (manifest["key"], manifest["layout"]) == ("k", LAYOUT)
    assert not [p for p in warm.root.iterdir() if p.name.startswith(".new-")]


def test_the_cap_evicts_the_least_recently_used_copy(tmp_path: Path) -> None:
    root = tmp_path / "warm"
    for number, key in enumerate(["old", "recent"]):
        folders = node_folders(tmp_path / key)
        compiled(folders, inductor__blob="x" * 4000)
        save(WarmCache(root, key, cap_bytes=100_000), folders)
        os.utime(root / key, (1000 + number, 1000 + number))
    folders = node_folders(tmp_path / "new")
    compiled(folders, inductor__blob="y" * 4000)
    outcome = save(WarmCache(root, "new", cap_bytes=9000), folders)
    assert "evicted old (least recently used)" in outcome.line
    assert [key for key, _, _ in copies(root)] == ["new", "recent"]


def test_a_cache_larger_than_the_cap_is_not_saved(tmp_path: Path) -> None:
    folders = node_folders(tmp_path / "j")
    compiled(folders, inductor__blob="x" * 5000)
    outcome = save(WarmCache(tmp_path / "warm", "k", cap_bytes=1000), folders)
    assert outcome.files == 0 and "is more than the cap" in outcome.line
    assert not (tmp_path / "warm" / "k").exists()


def test_the_key_names_gpu_torch_build_and_layout(tmp_path: Path) -> None:
    assert cache_key("amd-740c", "2.6.0+rocm6.2") == f"amd-740c-torch2.6.0+rocm6.2-layout{LAYOUT}"
    assert cache_key("", "2.13.0+cpu").startswith("cpu-torch2.13.0+cpu")
    assert "/" not in cache_key("nvidia/x", "1 2")
    device = tmp_path / "sys/bus/pci/devices/0000:c1:00.0"
    device.mkdir(parents=True)
    (device / "device").write_text("0x740c\n")
    assert gpu_identity("amd", "0000:c1:00.0", tmp_path) == "amd-740c"
    assert gpu_identity("nvidia", "0000:99:00.0", tmp_path) == "nvidia"
    assert gpu_identity(None, None, tmp_path) == "cpu"


def test_the_variables_turn_it_on_off_and_cap_it() -> None:
    assert warm_of({}, "cpu") is None
    assert warm_of({variables.WARM_CACHE: "off"}, "cpu") is None
    warm = warm_of({variables.WARM_CACHE: "~/jit", variables.WARM_CACHE_GB: "0.5"}, "cpu")
    assert warm is not None and warm.cap_bytes == 512 * 1024**2
    assert warm.root == Path(os.path.expanduser("~/jit"))


def test_the_users_own_folders_and_kept_extensions_are_left_alone() -> None:
    settings = [Setting("TORCHINDUCTOR_CACHE_DIR", "/tmp/u-job/inductor", "default", ""),
                Setting("TRITON_CACHE_DIR", "/home/u/triton", "user", ""),
                Setting("TORCH_EXTENSIONS_DIR", "/tmp/u/ext", "default", ""),
                Setting("OMP_NUM_THREADS", "7", "topology", "")]
    assert targets_of(settings) == {"inductor": Path("/tmp/u-job/inductor")}


def test_a_file_rewritten_in_place_is_saved_again(tmp_path: Path) -> None:
    """Same size, new bytes and a new time: not taken for the saved file."""
    warm = WarmCache(tmp_path / "warm", "k")
    folders = node_folders(tmp_path / "j")
    compiled(folders, inductor__a="old!")
    save(warm, folders)
    path = folders["inductor"] / "a"
    path.write_text("new!")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert save(warm, folders).files == 1
    assert (warm.folder / "files" / "inductor" / "a").read_text() == "new!"


def test_only_the_files_the_manifest_lists_are_loaded(tmp_path: Path) -> None:
    """A link planted in the copy, or a file under a name never saved (``locks``), passes
    the manifest check (neither is a file it counts) but is not restored either."""
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "old"), inductor__a="good")
    save(warm, node_folders(tmp_path / "old"))
    secret = tmp_path / "secret"
    secret.write_text("not a cache")
    (warm.folder / "files" / "inductor" / "link").symlink_to(secret)
    (warm.folder / "files" / "inductor" / "locks").mkdir()
    (warm.folder / "files" / "inductor" / "locks" / "planted").write_text("x")
    node = tmp_path / "node"
    outcome = restore(warm, node_folders(node), node)
    assert outcome is not None and outcome.files == 1
    assert sorted(p.name for p in (node / "inductor").iterdir()) == ["a"]


def test_a_restore_waits_while_a_save_replaces_the_copy(tmp_path: Path) -> None:
    """The copies' lock: a save holds it exclusively, a restore shares it, so a restore
    never checks one copy and reads another (nor discards the copy a save just wrote)."""
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "old"), inductor__a="1")
    save(warm, node_folders(tmp_path / "old"))
    done: list = []
    with open(warm.root / COPIES_LOCK, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a save of another job, under way
        reader = threading.Thread(target=lambda: done.append(
            restore(warm, node_folders(tmp_path / "node"), tmp_path / "node")))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not done
    reader.join(30)
    assert done and done[0].files == 1


def test_a_save_that_fails_half_way_keeps_the_old_copy_and_leaves_nothing(tmp_path: Path,
                                                                          monkeypatch) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    compiled(node_folders(tmp_path / "j1"), inductor__a="1")
    save(warm, node_folders(tmp_path / "j1"))
    compiled(node_folders(tmp_path / "j2"), inductor__a="1", inductor__b="2", inductor__c="3")
    copied = []

    def full_disk(source, target, **kwargs):
        if copied:
            raise OSError(28, "No space left on device")
        copied.append(source)
        return real_copy(source, target, **kwargs)

    real_copy = shutil.copy2
    monkeypatch.setattr(shutil, "copy2", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save(warm, node_folders(tmp_path / "j2"))
    monkeypatch.undo()
    assert sorted(p.name for p in warm.root.iterdir()) == [COPIES_LOCK, "k"]  # no .new-/.old- left
    assert sorted(json.loads((warm.folder / MANIFEST).read_text())["files"]) == ["inductor/a"]
    real_rename = os.rename

    def install_fails(source, target):
        if Path(source).name.startswith(".new-"):
            raise OSError(39, "Directory not empty")
        return real_rename(source, target)

    monkeypatch.setattr(os, "rename", install_fails)
    with pytest.raises(OSError, match="not empty"):
        save(warm, node_folders(tmp_path / "j2"))
    monkeypatch.undo()
    assert sorted(p.name for p in warm.root.iterdir()) == [COPIES_LOCK, "k"]  # the old copy back
    node = tmp_path / "node"
    assert restore(warm, node_folders(node), node).files == 1


def test_a_manifest_with_malformed_entries_is_saved_over_not_a_traceback(tmp_path: Path) -> None:
    warm = WarmCache(tmp_path / "warm", "k")
    folders = node_folders(tmp_path / "j")
    compiled(folders, inductor__a="1")
    save(warm, folders)
    manifest = json.loads((warm.folder / MANIFEST).read_text())
    for files in ({"inductor/a": 5}, ["inductor/a"]):
        (warm.folder / MANIFEST).write_text(json.dumps({**manifest, "files": files}))
        assert save(warm, folders).files == 1  # not taken as unchanged: saved again
        assert json.loads((warm.folder / MANIFEST).read_text())["files"]["inductor/a"]["size"] == 1
