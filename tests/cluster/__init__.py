"""The SLURM test cluster (``python tests/cluster/cluster.py up|down|status``)."""
