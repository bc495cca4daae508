"""``torchrun`` whose ranks start warm: ``python -m scalerun.launch.local.elastic_run ARGS`` is
``python -m torch.distributed.run ARGS`` with this node's ranks forked from one starter.

Why: SLURM's torchrun mode runs one torch elastic agent per node (the course's
``srun ... python -m torch.distributed.run``); each agent started every rank with ``exec``,
so each imported torch on its own. Here the agent is torch's own, unchanged (its
rendezvous, restarts and stops), and only its ``Popen`` is the warm starter's
(:func:`scalerun.launch.local.start.ranks_ending_with_agent`); restarts are forked from the
same starter, which is forked from this process once it has imported torch (one import of
torch per node, not one for the agent and one for the starter). The job script names it
in place of ``torch.distributed.run`` (:mod:`scalerun.launch.slurm.render`) for ``--start
warm``, the default.

Its own words come first and start with ``--scalerun-``: ``--scalerun-preload=MOD[,MOD]``
(``--preload``) and ``--scalerun-binds`` (the ranks run a program without ``init()``: each
applies its CPU set, memory node and variables itself, as ``scalerun exec --bind`` in front
of it did). ``--no-python python -c CODE`` (the job's check) starts warm too. Anything
the starter cannot fork starts as torchrun would start it, with one line saying why.
"""

from __future__ import annotations

import sys

OWN_PREFIX = "--scalerun-"


def own_words(argv: list[str]) -> tuple[tuple[str, ...], bool, list[str]]:
    """(the preloads, whether the ranks bind themselves, torchrun's arguments)."""
    preload: tuple[str, ...] = ()
    binds = False
    while argv and argv[0].startswith(OWN_PREFIX):
        word = argv.pop(0)
        if word.startswith("--scalerun-preload="):
            preload = tuple(name for name in word.split("=", 1)[1].split(",") if name)
        elif word == "--scalerun-binds":
            binds = True
        else:
            raise SystemExit(f"scalerun.launch.local.elastic_run: error: unknown option {word}")
    return preload, binds, argv


def main(argv: list[str] | None = None) -> None:
    from torch.distributed import run as torchrun

    from scalerun.launch.local import start
    from scalerun.launch.local.direct import warm_starter
    from scalerun.plan.request import LocalOptions

    preload, binds, rest = own_words(list(sys.argv[1:] if argv is None else argv))
    args = torchrun.parse_args(rest)
    command = [args.training_script, *args.training_script_args] if args.no_python else [
        sys.executable, "-u", *(["-m"] if args.module else []), args.training_script]
    # forked from this process, which imported torch for the agent: one import per node
    starter = warm_starter(LocalOptions(start="warm", preload=preload), command, forks(args), here=True)
    try:
        with start.ranks_ending_with_agent(starter, child_binds=binds) as hooked:
            if binds and not hooked:  # this torch starts ranks some other way: exec binds them
                args = torchrun.parse_args(with_exec_bind(rest, args))
            torchrun.run(args)
    finally:
        if starter is not None:
            starter.close()


def forks(args: object) -> int:
    """How many ranks this node's starter may fork: torchrun's ``--nproc-per-node`` (many
    where it is a word such as ``gpu``) times one plus its restarts."""
    count = str(getattr(args, "nproc_per_node", "1"))
    return (int(count) if count.isdigit() else 2) * (1 + int(getattr(args, "max_restarts", 0) or 0))


def with_exec_bind(rest: list[str], args: object) -> list[str]:
    """torchrun's arguments with ``scalerun exec --bind`` in front of the program."""
    script = args.training_script
    at = len(rest) - 1 - len(args.training_script_args)
    assert rest[at] == script
    options = [word for word in rest[:at] if word not in ("-m", "--module")]
    module = ["-m"] if args.module else []
    return [*options, "--no-python", sys.executable, "-m", "scalerun", "exec", "--bind", "--",
            sys.executable, "-u", *module, *rest[at:]]


if __name__ == "__main__":
    main()
