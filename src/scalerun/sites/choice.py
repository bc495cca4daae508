"""Which site profile a command uses: the one rule behind the ``--site`` flag.

Why: ``--site`` used to be declared by three parsers and resolved twice with different
defaults (the local profile on the launch side, no profile on the rank side). Now every
command declares it with :func:`scalerun.commands.flags.add_site_argument` and resolves
it with :func:`resolve_site`: the flag, else ``$SCALERUN_SITE`` (exported by scalerun's
job scripts so that ranks plan with the launch's site), else the shipped ``local``
profile, which holds no site knowledge at all. Flags are the CLI's business: nothing
here imports argparse.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from scalerun import variables
from scalerun.sites.profile import SiteProfile
from scalerun.sites.store import load_site

DEFAULT_SITE = "local"


def site_name(flag: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The site's name: the flag, else ``$SCALERUN_SITE``, else ``local``."""
    env = os.environ if environ is None else environ
    return flag or env.get(variables.SITE, "").strip() or DEFAULT_SITE


def resolve_site(flag: str | None, environ: Mapping[str, str] | None = None) -> SiteProfile:
    """The validated profile: the flag's; else the one the launch froze for its ranks
    (``$SCALERUN_SITE_FILE``, in the run directory); else the one :func:`site_name` names."""
    env = os.environ if environ is None else environ
    frozen = env.get(variables.SITE_FILE, "").strip()
    if not flag and frozen:
        return load_site(frozen)
    return load_site(site_name(flag, env))
