"""Site profiles (data files) and their loader.

``load_site("lumi-g")`` returns a validated :class:`SiteProfile`; ``find_sites`` lists
the files of the project, user and shipped folders (see :mod:`scalerun.sites.store`).
The shipped profiles are the ``*.toml`` files next to this module.
"""

from __future__ import annotations

from scalerun.sites.choice import (
    DEFAULT_SITE,
    resolve_site,
    site_name,
)
from scalerun.sites.profile import (
    ContainerDefaults,
    ModulesSpec,
    NetworkSpec,
    NodeSpec,
    SiteProfile,
    SlurmDefaults,
)
from scalerun.sites.store import Folder, SiteEntry, find_sites, load_site, site_folders

__all__ = [
    "DEFAULT_SITE",
    "resolve_site",
    "site_name",
    "ContainerDefaults",
    "Folder",
    "ModulesSpec",
    "NetworkSpec",
    "NodeSpec",
    "SiteEntry",
    "SiteProfile",
    "SlurmDefaults",
    "find_sites",
    "load_site",
    "site_folders",
]
