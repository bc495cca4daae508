"""How a DeepSpeed config file given to ``scalerun launch`` reaches the script and its ranks.

Why: the LUMI course starts DeepSpeed scripts as ``ds_visualtransformer.py --deepspeed
--deepspeed_config ds_config.json``; those scripts read the two flags with
``deepspeed.add_config_arguments`` and give the parsed namespace to
``deepspeed.initialize(args=args)``. ``--deepspeed-config FILE``
(:mod:`scalerun.commands.launch_flags`) does what that pair does:

- the script gets DeepSpeed's own ``--deepspeed --deepspeed_config FILE`` appended to its
  arguments, so course scripts run unchanged (nothing is appended when the arguments
  already name that file; a different file there is refused);
- every rank gets ``SCALERUN_DEEPSPEED_CONFIG=FILE``, which ``scalerun.wrap(strategy=
  "deepspeed")`` uses when the code names no config, and which ``scalerun doctor`` reads
  to tell which DeepSpeed ops the run needs.

Pure: the file was read and made absolute at the edge, before this is asked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from scalerun import variables
from scalerun.errors import LaunchError

SWITCH = "--deepspeed"
"""``deepspeed.add_config_arguments``' flag that turns DeepSpeed on in the script."""
CONFIG_FLAGS = ("--deepspeed_config", "--deepscale_config")
"""The script flags that name a DeepSpeed config (the second is DeepSpeed's old name)."""


def named_config(script_args: Sequence[str]) -> str | None:
    """The config file the script's own arguments name (``--deepspeed_config X`` or
    ``--deepspeed_config=X``), or None."""
    for index, word in enumerate(script_args):
        for flag in CONFIG_FLAGS:
            if word == flag and index + 1 < len(script_args):
                return script_args[index + 1]
            if word.startswith(f"{flag}="):
                return word.split("=", 1)[1]
    return None


def script_arguments(config: str | None, script_args: Sequence[str]) -> tuple[str, ...]:
    """The script's arguments with DeepSpeed's pair appended, unless they already name
    ``config``; naming another file is refused (which one would DeepSpeed use?)."""
    if config is None:
        return tuple(script_args)
    named = named_config(script_args)
    if named is None:
        return (*script_args, SWITCH, CONFIG_FLAGS[0], config)
    if not _same_file(named, config):
        raise LaunchError(
            f"--deepspeed-config {config} but the script's arguments name {named}; keep one"
        )
    return tuple(script_args)


def _same_file(named: str, config: str) -> bool:
    return Path(os.path.abspath(named)) == Path(config)


def rank_env(config: str | None) -> dict[str, str]:
    """What every rank gets: the config's path, for ``wrap`` and the doctor."""
    return {} if config is None else {variables.DEEPSPEED_CONFIG: config}
