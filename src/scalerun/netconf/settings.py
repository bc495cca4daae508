"""One decided environment variable and where it came from."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    """A variable scalerun wants set, and why; the user's own value always wins."""

    name: str
    value: str
    source: str
    """"site", "topology", "default", "rocm", ... or "user" when the environment had it."""
    reason: str


def respect_user(settings: Iterable[Setting], environ: Mapping[str, str]) -> list[Setting]:
    """Replace each decision the user already made by the user's value, marked as such."""
    final = []
    for setting in settings:
        if setting.name in environ:
            final.append(
                Setting(
                    setting.name,
                    environ[setting.name],
                    "user",
                    f"already set by you (scalerun would use {setting.value!r}: {setting.reason})",
                )
            )
        else:
            final.append(setting)
    return final


def as_env(settings: Iterable[Setting]) -> dict[str, str]:
    """The variables to export, user values included (exporting them again is harmless)."""
    return {setting.name: setting.value for setting in settings}
