"""Where site profiles are found, and how one refines another.

Why: sites ship with scalerun, but a user needs their own account and a project may
pin its own partition, without copying the whole LUMI profile. Profiles are looked up
in three folders, first match wins:

1. ``./.scalerun/sites/`` in the current project folder;
2. ``$XDG_CONFIG_HOME/scalerun/sites/`` (``~/.config/scalerun/sites/`` by default);
3. the profiles shipped in this package (``lumi-g``, ``lumi-c``, ``nvidia``, ``local``).

A profile may say ``extends = "lumi-g"``: it then starts from the ``lumi-g`` found in the
folders *after* its own (so a user's ``lumi-g.toml`` can extend the shipped ``lumi-g``),
tables are merged key by key and lists are replaced.

This module reads files only; it never reads hardware or SLURM.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from scalerun.errors import SiteError
from scalerun.redact import is_secret_name
from scalerun.sites.profile import SiteProfile, build

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SHIPPED = Path(__file__).parent
PROJECT_SUBDIR = Path(".scalerun") / "sites"


@dataclass(frozen=True)
class Folder:
    """One place profiles are read from, with a label users see in ``scalerun sites``."""

    label: str
    path: Path


@dataclass(frozen=True)
class SiteEntry:
    """A profile file found in one of the folders."""

    name: str
    path: Path
    layer: int
    """Index of its folder in the search order (0 wins)."""
    label: str


def site_folders(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> list[Folder]:
    """The folders searched, in order: project, user, shipped."""
    env = os.environ if environ is None else environ
    config_home = Path(
        env.get("XDG_CONFIG_HOME") or Path(env.get("HOME", "~")).expanduser() / ".config"
    )
    return [
        Folder("project", (cwd or Path.cwd()) / PROJECT_SUBDIR),
        Folder("user", config_home / "scalerun" / "sites"),
        Folder("shipped", SHIPPED),
    ]


def find_sites(folders: list[Folder]) -> list[SiteEntry]:
    """Every profile file in every folder, in search order (shadowed ones included)."""
    entries = []
    for layer, folder in enumerate(folders):
        if folder.path.is_dir():
            entries += [
                SiteEntry(p.stem, p, layer, folder.label)
                for p in sorted(folder.path.glob("*.toml"))
            ]
    return entries


FROZEN_KEY = "scalerun site profile"
"""The marker of a frozen profile (:func:`freeze`), and its format's version."""


def freeze(profile: SiteProfile) -> str:
    """The merged, validated profile as JSON: what a launch hands its ranks, so that they plan
    with exactly the profile it planned with, wherever they run (:func:`load_site` reads it)."""
    table = _without_none({k: v for k, v in asdict(profile).items() if k != "source"})
    for section in ("env", "task_env"):  # a secret's value stays out of the run directory:
        for name in table.get(section, {}):  # the ranks have it in their environment, which
            if is_secret_name(name):  # this reference reads (a job's from its submitter)
                table[section][name] = "${" + name + "}"
    return json.dumps({FROZEN_KEY: 1, "source": profile.source, "profile": table}, indent=1) + "\n"


def _without_none(value: Any) -> Any:
    """TOML has no null: a value that was never set is left out, as in the file it came from."""
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list | tuple):
        return [_without_none(v) for v in value]
    return value


def _thawed(path: Path) -> SiteProfile:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SiteError(f"{path}: not a frozen site profile ({error})") from None
    if not isinstance(data, dict) or data.get(FROZEN_KEY) != 1:
        raise SiteError(f"{path}: not a frozen site profile; give a profile name or a .toml path")
    return replace(build(SiteProfile, data["profile"], file=path), source=str(data.get("source", path)))


def load_site(name: str, folders: list[Folder] | None = None) -> SiteProfile:
    """The profile called ``name`` (or the file at path ``name``: a ``.toml`` profile, or a
    profile a launch froze as ``.json``), validated."""
    folders = site_folders() if folders is None else folders
    if name.endswith(".json"):
        if not Path(name).is_file():
            raise SiteError(f"site file {name} does not exist; give a profile name or a .toml path")
        return _thawed(Path(name))
    if name.endswith(".toml") or os.sep in name:
        path = Path(name)
        if not path.is_file():
            raise SiteError(f"site file {name} does not exist; give a profile name or a .toml path")
        return _profile(_read(path), path, folders, layer=-1)
    entry = _find(name, folders, below=-1)
    return _profile(_read(entry.path), entry.path, folders, layer=entry.layer)


def _find(name: str, folders: list[Folder], below: int) -> SiteEntry:
    """The first profile ``name`` in a folder after index ``below``."""
    entries = find_sites(folders)
    for entry in entries:
        if entry.name == name and entry.layer > below:
            return entry
    known = sorted({entry.name for entry in entries})
    where = ", ".join(str(folder.path) for folder in folders[below + 1 :])
    raise SiteError(f"no site profile {name!r} in {where}; known: {', '.join(known) or 'none'}")


def _profile(table: dict[str, Any], path: Path, folders: list[Folder], layer: int) -> SiteProfile:
    merged = _resolve_extends(table, path, folders, layer)
    merged.setdefault("name", path.stem)
    if merged["name"] != path.stem and layer >= 0:
        raise SiteError(
            f"{path}: name: {merged['name']!r} differs from the file name {path.stem!r}"
        )
    return replace(build(SiteProfile, merged, file=path), source=str(path))


def _resolve_extends(
    table: dict[str, Any], path: Path, folders: list[Folder], layer: int
) -> dict[str, Any]:
    """Merge the chain of ``extends`` under ``table`` (the base first, this file last).

    The base is looked up only in folders after this file's, so a chain cannot loop.
    """
    base_name = table.get("extends")
    if base_name is None:
        return dict(table)
    if not isinstance(base_name, str):
        raise SiteError(f"{path}: extends: expected a profile name string, got {base_name!r}")
    try:
        base = _find(base_name, folders, below=layer)
    except SiteError as error:
        raise SiteError(f"{path}: extends: {error}") from None
    base_table = _resolve_extends(_read(base.path), base.path, folders, base.layer)
    base_table.pop("name", None)
    return merge_tables(base_table, table)


def merge_tables(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Tables merge key by key; any other value (lists included) is replaced."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = merge_tables(merged[key], value)
        else:
            merged[key] = value
    return merged


def _read(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise SiteError(f"{path}: not valid TOML: {error}") from None
    except OSError as error:
        raise SiteError(f"{path}: cannot be read: {error.strerror}") from None
