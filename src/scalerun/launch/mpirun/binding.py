"""Which CPUs mpirun binds each rank to: this node's binding plan, read once at the launch.

Why here: under Open MPI a rank does not bind itself (``scalerun.init()`` leaves binding
to a launcher that binds, as under srun), so mpirun must bind each rank to the CPUs the
plan gives it. The plan is the one every rank's own plan comes from
(:func:`scalerun.this_rank.plan_this_node`: this machine's CPUs, the site's reserved
cores, ``--hyperthreads``), read here on the node the ranks run on.

Where a rank would not bind itself under torchrun either, mpirun binds nothing:
``SCALERUN_BIND=0``, a node the plan does not fit (more ranks than cores: they would
share CPUs), or a node that cannot be read. The reason goes into ``--dry-run``'s output.
"""

from __future__ import annotations

from collections.abc import Mapping

from scalerun import variables
from scalerun.errors import ScalerunError
from scalerun.launch.mpirun.job import NodeBinding
from scalerun.plan.launch import LaunchPlan


def node_binding(plan: LaunchPlan, environ: Mapping[str, str]) -> NodeBinding:
    """Each local rank's CPUs from this node's plan, or no binding and why."""
    from scalerun.this_rank import plan_this_node

    if environ.get(variables.BIND, "1").strip() == "0":
        return NodeBinding((), f"none: {variables.BIND}=0")
    request = plan.request
    try:
        _, node = plan_this_node(plan.procs_per_node, site=request.site,
                                 hyperthreads=request.hyperthreads, environ=environ)
    except ScalerunError as error:
        return NodeBinding((), f"none: no binding plan for this node ({error})")
    if not node.fits:
        return NodeBinding((), "none: " + "; ".join(node.binding.warnings or ("the plan does not fit",)))
    how = "; ".join((*node.binding.reasons, f"reserved: {node.reserved.reason}"))
    return NodeBinding(tuple(rank.cpus for rank in node.binding.ranks),
                       f"this node's plan ({how})")
