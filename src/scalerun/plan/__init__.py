"""The plan: what every rank of a job gets, decided once, as data.

- :mod:`.binding`: CPU sets of a node's ranks from its topology (the planner);
- :mod:`.gpu`: a rank's device and backend, and whether the ranks fit the GPUs;
- :mod:`.rank`: one rank's whole plan (GPU, CPUs, NIC, threads, environment, reasons);
- :mod:`.job`: a SLURM job's resources, mode, container and srun/sbatch options, from a
  typed request and a site profile (flag over site over default).

Everything here is pure: no file, process or environment is read or written. The one
edge that reads this machine and asks the planner is :mod:`scalerun.this_rank`.
"""
