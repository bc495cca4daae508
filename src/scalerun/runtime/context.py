"""The context ``scalerun.init()`` returns: what a training loop needs to know."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from scalerun.placement import Placement
    from scalerun.plan.rank import RankPlan


@dataclass(frozen=True, kw_only=True)
class Context:
    """This rank's place in the job and the device and backend it was given."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    device: torch.device
    backend: str
    placement: Placement
    device_reason: str = ""
    bound_cpus: tuple[int, ...] | None = None
    """CPUs scalerun bound this rank to, or None where it left affinity alone."""
    exported_env: dict[str, str] = field(default_factory=dict)
    """Variables ``init()`` set because the launcher had not (never the user's own)."""
    plan: RankPlan | None = None
    """The rank plan every decision above came from (``scalerun env`` shows the same)."""

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the one rank that prints and writes files."""
        return self.rank == 0
