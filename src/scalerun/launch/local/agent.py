"""Run a local job: the ranks, their output, how they ended.

On one node without restarts scalerun starts and watches the ranks itself
(:mod:`scalerun.launch.local.direct`). Otherwise process management is torch's own
(``torch.distributed.run`` / elastic agent): it restarts, stops the other ranks when one
fails and tails their output. scalerun adds
what users of the course otherwise do by hand: flags checked before anything starts
(more ranks than GPUs under NCCL included), rank-prefixed output, and a final line that
names the rank that failed and how. It sets no thread count: torchrun's blanket
``OMP_NUM_THREADS=1`` is left out, and each rank's plan gives it one per core it owns.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

from scalerun.errors import LaunchError
from scalerun.launch.leftovers import become_subreaper, end_leftovers
from scalerun.launch.local import direct, start, tail, warm
from scalerun.launch.local.failures import exit_code_of, failure_message
from scalerun.launch.local.job import PREFIX_VARIABLE, LocalJob, rank_command
from scalerun.launch.observe import run_observed
from scalerun.launch.prefix import fill_node, short_node
from scalerun.placement import node_name
from scalerun.plan.launch import rank_environment
from scalerun.redact import redact_words, secret_values


def run_local(job: LocalJob, environ: MutableMapping[str, str] | None = None) -> int:
    """Run the ranks to completion; returns 0, or the failed rank's exit code.

    The agent's environment (``os.environ`` unless given) gets the plan's variables first:
    torch elastic hands its own environment to every rank it starts."""
    env = os.environ if environ is None else environ
    if job.check_gpus:
        check_ranks_fit_gpus(job, env)
    env.update(rank_environment(job.env, env))
    if PREFIX_VARIABLE in env:  # on several nodes the prefix names this one
        env[PREFIX_VARIABLE] = fill_node(env[PREFIX_VARIABLE], short_node(node_name(env)))
    become_subreaper()  # what the ranks start is handed to this process when they end
    if job.observe is not None:
        return _observed(job)
    try:
        code, failure = _run(job)
    finally:
        _save_warm_cache(job)
        end_leftovers()
    if failure:
        print(failure, file=sys.stderr, flush=True)
    return code


def _after_ranks(job: LocalJob) -> None:
    """Once the ranks ended (and the sampler with them): the warm caches saved, and what
    the ranks left running stopped (:mod:`scalerun.launch.leftovers`)."""
    try:
        _save_warm_cache(job)
    finally:
        end_leftovers()


def _save_warm_cache(job: LocalJob) -> None:
    """The warm JIT caches of a program without ``init()``, whose ranks cannot save them:
    from the first node only, as a SLURM job saves (each node's launcher would otherwise
    replace the whole copy in turn)."""
    if job.plan.exec_bind and job.plan.request.local.node_rank == 0:
        from scalerun.runtime.warm import save_for_node

        save_for_node(os.environ, "scalerun launch")


def _observed(job: LocalJob) -> int:
    """The launch with its run directory, node sampler, straggler watch and closing summary."""
    observe, plan = job.observe, job.plan
    assert observe is not None
    if plan.nodes > 1 and not observe.run_dir_given:
        print(f"scalerun launch: --nnodes {plan.nodes} without --run-dir: this node's ranks write to "
              f"{observe.run_dir}, on this machine only; for one report of the whole job give every "
              "node the same --run-dir on a shared file system", file=sys.stderr, flush=True)
    return run_observed(observe, {"launcher": "local", "nproc_per_node": plan.procs_per_node,
                                  "nnodes": plan.nodes, "node_rank": plan.request.local.node_rank,
                                  "run_dir_given": observe.run_dir_given, "script": plan.program.script,
                                  "script_args": list(plan.program.args)},
                        os.environ, lambda: _run(job),
                        first_node=plan.request.local.node_rank == 0,
                        after_ranks=lambda: _after_ranks(job))


def _run(job: LocalJob) -> tuple[int, str | None]:
    """Run the ranks: (exit code, the failure line or None). One node without restarts:
    scalerun starts and watches them (:mod:`.direct`, no torch in the launcher); else
    torch elastic's agent."""
    if direct.applies(job, os.environ):
        if job.verbose:
            show_torchrun(job.direct_argv if job.direct_argv is not None else job.argv,
                          " (its agent's work done by scalerun)")
        return direct.run(job)
    return _run_agent(job)


def show_torchrun(argv: Sequence[str], note: str = "") -> None:
    """``--verbose``: the torchrun command of the launch, secrets masked."""
    shown = redact_words(list(argv), secret_values(os.environ))
    print("scalerun launch: torchrun " + " ".join(shown) + note, file=sys.stderr)


def _run_agent(job: LocalJob) -> tuple[int, str | None]:
    """Run torch elastic's agent: (exit code, the failure line or None)."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    if not job.verbose:
        # elastic logs each stop and failure at length; scalerun prints one line instead
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    tail.install()  # [rankN]: lines stay whole when ranks print at once
    # a program that does not call init(): the agent applies each rank's plan as it starts it,
    # or the warm starter's child does (restarts are forked from the same starter)
    plain = job.direct_argv is not None
    starter = direct.warm_starter(job.plan.request.local, rank_command(job.plan, agent_binds=plain),
                                  job.nproc_per_node * (1 + job.max_restarts), here=True)
    try:
        with start.ranks_ending_with_agent(starter, child_binds=plain and starter is not None) as hooked:
            if not hooked and starter is not None:  # this torch starts ranks another way: no warm start
                warm.say("this torch's agent does not start its ranks through subprocess.Popen")
                starter.close(kill=True)
                starter = None
            with start.bound_ranks(plain and starter is None) as binds:
                direct_start = (binds or starter is not None) and job.direct_argv is not None
                argv = list(job.direct_argv if direct_start and job.direct_argv is not None else job.argv)
                if job.verbose:
                    show_torchrun(argv)
                try:
                    run_agent(torchrun.parse_args(argv))
                except ChildFailedError as error:
                    return exit_code_of(error.failures), failure_message(error.failures)
    finally:
        if starter is not None:
            starter.close()
    return 0, None


def check_ranks_fit_gpus(job: LocalJob, environ: Mapping[str, str]) -> None:
    """More ranks than this node's GPUs cannot form an NCCL group: one line, before any
    process starts, from the same GPU count and rule the ranks' plans use."""
    from scalerun.errors import TopologyError
    from scalerun.plan.gpu import plan_gpu
    from scalerun.this_rank import read_topology, sysfs_root

    try:
        gpus = read_topology(sysfs_root(None, environ)).gpus
    except TopologyError:  # no readable /sys: each rank checks again with torch's count
        return
    verdict = plan_gpu(local_rank=0, local_world_size=job.nproc_per_node, gpus=gpus,
                       environ=environ, backend=job.plan.request.backend)
    if verdict.too_many_ranks:
        raise LaunchError(verdict.error or "more ranks than GPUs")


def choose_rendezvous(args: Any) -> None:
    """Pick the rendezvous for torchrun's parsed arguments (its namespace), in place: on one node without
    restarts scalerun's loopback store (``launch/rendezvous.py``), with restarts torch's
    c10d on a free port (what torchrun's ``--standalone`` does); anything else as given."""
    import uuid

    from torch.distributed import run as torchrun

    one_node = args.rdzv_backend == "static" and not args.rdzv_endpoint and (
        args.master_port is None and torchrun.parse_min_max_nnodes(args.nnodes)[1] == 1)
    if not (args.standalone or one_node):
        return
    args.rdzv_id = str(uuid.uuid4())
    if args.max_restarts:
        args.rdzv_backend, args.rdzv_endpoint = "c10d", "localhost:0"
        return
    from scalerun.launch.local import rendezvous

    rendezvous.register()
    args.standalone = False  # torchrun would overwrite the backend with c10d
    args.rdzv_backend, args.rdzv_endpoint = rendezvous.BACKEND, f"{rendezvous.LOOPBACK}:0"


def run_agent(args: Any) -> None:
    """torchrun's ``run``, without its ``OMP_NUM_THREADS=1`` for every rank: the ranks'
    plans set one thread per core each rank owns (the user's own value still wins)."""
    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    choose_rendezvous(args)
    if args.master_port is None:
        args.master_port = 29500
    placeholder = "OMP_NUM_THREADS" not in os.environ
    if placeholder:  # torchrun sets (and logs) its default only where the variable is unset
        os.environ["OMP_NUM_THREADS"] = "1"
    try:
        config, cmd, cmd_args = torchrun.config_from_args(args)
    finally:
        if placeholder:
            del os.environ["OMP_NUM_THREADS"]
    elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
