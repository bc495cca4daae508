"""``scalerun sites``: list the site profiles found, or show one as scalerun reads it.

Why: a profile decides partitions, cores per GPU, binds and environment of every job;
users must be able to see which file wins (project, user or shipped) and what it says
after ``extends`` is applied, before anything is submitted, and which of the site's images
``--container NAME`` can name.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from scalerun.sites import SiteProfile, find_sites, load_site, site_folders

NAME = "sites"


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        NAME,
        help="list site profiles, or show one",
        description="List the site profiles of the project, user and shipped folders, or show one.",
    )
    p.add_argument("action", nargs="?", default="list", metavar="list|show|NAME",
                   help="list the profiles (default), or show one: show NAME, or NAME alone")
    p.add_argument("name", nargs="?", help="profile to show (a name or a .toml path)")
    p.add_argument("--json", action="store_true", help="print the profile as JSON")
    p.set_defaults(func=run)
    return p


def list_sites() -> str:
    """One line per profile name: the file that wins, then the ones it hides."""
    folders = site_folders()
    lines = ["searched: " + ", ".join(f"{f.label} {f.path}" for f in folders)]
    seen: set[str] = set()
    for entry in find_sites(folders):
        profile = load_site(str(entry.path)) if entry.name not in seen else None
        status = "" if profile else "  (hidden by the one above)"
        description = f"  {profile.description}" if profile else ""
        lines.append(f"{entry.name:<12} {entry.label:<8} {entry.path}{description}{status}")
        seen.add(entry.name)
    return "\n".join(lines)


def show_site(name: str, as_json: bool) -> str:
    profile = load_site(name)
    data = dataclasses.asdict(profile)
    if as_json:
        return json.dumps(data, indent=2)
    lines = [f"# {profile.name}: {profile.description}", f"# from {profile.source}"]
    lines += image_lines(profile)
    lines += _toml_lines(data, prefix="")
    return "\n".join(lines)


def image_lines(profile: SiteProfile) -> list[str]:
    """The site's images as ``--container NAME`` takes them, the default one first."""
    box = profile.container
    if not box.images:
        return []
    lines = ["# images (--container NAME):"]
    for name in sorted(box.images, key=lambda name: name != box.default_image):
        mark = "  (default: the site's recommended image)" if name == box.default_image else ""
        lines.append(f"#   {name:<14} {box.images[name]}{mark}")
    return lines


def _toml_lines(table: dict, prefix: str) -> list[str]:
    """The profile as TOML-like text: scalar keys first, then one [section] per table."""
    skip = {"source", "description"} if not prefix else set()
    scalars = [
        f"{key} = {json.dumps(value)}"
        for key, value in table.items()
        if not isinstance(value, dict) and key not in skip and value not in (None, "")
    ]
    lines = ([f"\n[{prefix}]"] if prefix and scalars else []) + scalars
    for key, value in table.items():
        if isinstance(value, dict):
            lines += _toml_lines(value, f"{prefix}.{key}" if prefix else key)
    return lines


def run(args: argparse.Namespace) -> int:
    from scalerun.errors import SiteError

    action, name = args.action, args.name
    if action not in ("list", "show"):  # scalerun sites lumi-g: show it
        if name:
            raise SiteError(f"scalerun sites {action} {name}: give list, show NAME, or NAME alone")
        action, name = "show", action
    if action == "show" or name:
        if not name:
            raise SiteError(
                "scalerun sites show needs a profile name, e.g. scalerun sites show lumi-g"
            )
        print(show_site(name, args.json))
    else:
        print(list_sites())
    return 0
