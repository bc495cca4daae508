"""Shared test plumbing: the SLURM test cluster plugin (started only for ``slurm`` tests)."""

pytest_plugins = ["tests.slurm_fixture"]
