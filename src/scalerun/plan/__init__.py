"""The plan: what every rank of a launch gets, decided once, as data.

- :mod:`.request`: a launch as the user asked for it (:class:`~.request.LaunchRequest`),
  one request for every backend;
- :mod:`.launch`: :func:`~.launch.plan_launch`, a request and a site profile in, every
  rank's variables and command out (:class:`~.launch.LaunchPlan`);
- :mod:`.rank`: one rank's whole plan (GPU, CPUs, NIC, threads, environment, reasons);
- :mod:`.binding`: CPU sets of a node's ranks from its topology;
- :mod:`.gpu`: a rank's device and backend, and whether the ranks fit the GPUs;
- :mod:`.deepspeed`: how a DeepSpeed config file reaches the script and its ranks;
- :mod:`.knobs`: the tuned defaults (``--knob``) every rank reads;
- :mod:`.track_config`: the run's configuration as experiment trackers show it.

What a backend adds of its own (a SLURM job's resources and script) lives with the
backend, in :mod:`scalerun.launch`; the ``SCALERUN_*`` names the plan shares with the
launchers and the ranks are spelled in :mod:`scalerun.variables`.

Everything here is pure: no file, process or environment is read or written. The one
edge that reads this machine and asks the planner is :mod:`scalerun.this_rank`.
"""
