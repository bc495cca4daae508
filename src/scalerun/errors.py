"""Error types users see.

Every error a user can cause (a wrong flag, a broken environment variable, a missing
file) is one of these. The CLI prints them as one line with no traceback; the message
says what was asked, what the machine has and what to change. Internal invariants use
``assert`` instead.
"""

from __future__ import annotations


class ScalerunError(Exception):
    """A mistake in the user's input or environment, explained in one line."""


class PlacementError(ScalerunError):
    """The launcher environment (SLURM, torchrun, MPI variables) is inconsistent."""


class TopologyError(ScalerunError):
    """The node description (sysfs tree, tool output) cannot be read or makes no sense."""


class SiteError(ScalerunError):
    """A site profile is missing or broken."""


class LaunchError(ScalerunError):
    """A launch request cannot be carried out (bad flags, missing script, failed rank)."""


class TorchMissingError(ScalerunError):
    """This Python has no torch, and what was asked runs ranks here (the launcher side,
    which only writes and submits them, needs none)."""
