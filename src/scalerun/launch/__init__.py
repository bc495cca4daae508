"""Launchers: local processes (torch elastic), srun steps, sbatch scripts, containers."""
