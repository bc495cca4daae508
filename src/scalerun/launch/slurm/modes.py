"""The SLURM backend's modes, in a module of their own: the backend's front
(:mod:`scalerun.launch.slurm`) names them without loading the job, script and submit
modules, which a local launch never needs (issue 20's lean launch)."""

MODES = ("srun", "torchrun")
"""``--mode`` values of a SLURM launch; the first is the default."""
