"""The prefix of a rank's output lines, spelled once for every backend.

Why: the lines of many ranks meet in one console or job log, so each carries the rank it
came from. On one node that is torchrun's ``[rank3]: `` (local launches keep it; mpirun's
lines match it). On several nodes the rank alone does not say where a line was printed
(torch issue 75087): a traceback of rank 37 sends users to the job's node list to work
out which machine it was. There the node's short name follows the rank,
``[rank37 nid005530]: ``, as ``srun --label`` marks every line with its task.

The node is the scheduler's name where there is one (SLURM's node name, which
``--exclude`` takes), else the host name, cut at the first dot. This module only spells
prefixes and templates (the SLURM backend fills one with its task's variables in bash,
:data:`scalerun.launch.slurm.render.SRUN_PREFIX`); it reads no environment and starts
nothing.
"""

from __future__ import annotations

RANK_FIELD = "${rank}"
"""torch elastic fills this in its ``TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``."""
NODE_FIELD = "${node}"
"""scalerun fills this in a template before torch elastic reads it (torch has no node field)."""


def short_node(name: str) -> str:
    """``nid005530`` for ``nid005530.lumi.csc``: the name users see in SLURM's lists."""
    return name.strip().split(".", 1)[0]


def rank_prefix(rank: int | str, node: str | None = None) -> str:
    """``[rank3]: `` on one node; ``[rank3 b2]: `` with the (short) node name of a run on
    several. ``rank`` and ``node`` may be template fields or shell expansions."""
    return f"[rank{rank} {node}]: " if node else f"[rank{rank}]: "


def elastic_template(several_nodes: bool) -> str:
    """torch elastic's prefix template: its ``[rank${rank}]: ``, with ``${node}`` on several
    nodes (filled by :func:`fill_node` where the agent runs)."""
    return rank_prefix(RANK_FIELD, NODE_FIELD if several_nodes else None)


def fill_node(template: str, node: str) -> str:
    """The template with this node's short name in place of ``${node}``."""
    return template.replace(NODE_FIELD, short_node(node))
