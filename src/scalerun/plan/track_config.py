"""The run's configuration as experiment trackers show it (``--track``).

Why the plan writes it: the configuration a tracker should show next to the numbers
(the command, how many nodes, ranks and GPUs, the site, the variables every rank was
given) is decided here, once, for every backend. Rank 0, which sends it, sees only its
own environment, where the plan's variables are mixed with everything else the shell
had; so the plan writes them to ``RUN_DIR/track-config.json`` and rank 0 reads that file.

Secrets never leave: a variable whose name says it is a secret is shown as ``***``, and
the value of such a variable is masked wherever it appears in another value or in the
command (:mod:`scalerun.redact`). Pure: no file is read or written here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from scalerun.plan.request import LaunchRequest
from scalerun.redact import redact_data, redact_mapping, secret_values


def track_config(request: LaunchRequest, *, site: str, nodes: int, gpus_per_node: int,
                 procs_per_node: int, env: Mapping[str, str]) -> dict[str, Any]:
    """What each tracker gets as the run's parameters, secrets masked: the values of secret
    variables among ``env`` and of the launcher's own (``request.secret_env``), wherever they
    appear (a script argument too), and a value after a secret-named option."""
    secrets = (*secret_values(env), *(value for _, value in request.secret_env))
    program = request.program
    config = {
        "command": " ".join(request.command_line) if request.command_line else None,
        "script": program.script,
        "script_args": list(program.args),
        "nodes": nodes,
        "nproc_per_node": procs_per_node,
        "world_size": nodes * procs_per_node,
        "gpus_per_node": gpus_per_node,
        "site": site,
        "backend": request.backend,
        "env": redact_mapping(env, secrets),
    }
    return redact_data(config, secrets)


def track_config_text(config: Mapping[str, Any]) -> str:
    """``RUN_DIR/track-config.json``'s text."""
    return json.dumps(config, indent=2, sort_keys=True) + "\n"
