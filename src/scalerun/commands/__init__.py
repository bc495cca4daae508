"""The CLI's edge: every flag is declared here (and in ``cli.py``), nowhere below.

- ``<name>.py`` for each ``scalerun <name>`` subcommand: ``add_parser(subparsers)`` declares
  its flags, ``run(args) -> int`` does the work (``cli.py`` wires them together);
- ``flags.py``: the flags more than one command takes (``--site``, ``--sysfs``,
  ``--hyperthreads``), each declared once;
- ``rank_doctor.py``, ``node_sampler.py``, ``horovod_env.py``: the ``python -m`` entry
  modules that launchers and scripts start (a doctor rank, a node's sampler, Horovod's
  build variables), each with ``main(argv=None)``; they parse flags and call the module
  that does the work.
"""
