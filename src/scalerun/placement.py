"""Who am I: turn a launcher's environment into one :class:`Placement`.

This module decides, for the current process, its global rank, local rank, world size,
node rank, node count and the rendezvous address and port, from the variables that
torchrun, SLURM (srun), Open MPI, MPICH/PMI or DeepSpeed's launcher set. It is the one
place that reads those variables; launchers, job scripts and checks ask it. The job
around the ranks (scheduler, job id, node name, restarts) is :mod:`scalerun.job`'s, and
:func:`detect` hands it on as :attr:`Placement.job`.

It must never write the environment or probe hardware: exporting ``RANK`` and friends
is a separate, explicit step (:meth:`Placement.to_env`). Required values are read
strictly: a rank or world size is never guessed, and an inconsistent environment raises
:class:`~scalerun.errors.PlacementError` with a one-line message naming the variable.

Launchers are tried in an explicit order (see :data:`DETECTORS`): torchrun first,
because a torchrun started inside an ``sbatch`` script also sees the batch task's SLURM
variables; DeepSpeed's launcher next for the same reason; then an ``srun`` step; then MPI
launchers (Cray's srun also sets ``PMI_RANK``, hence after SLURM); a single process last.
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import hostlist

from scalerun.errors import PlacementError
from scalerun.job import Job, detect_job

DEFAULT_MASTER_PORT = 29500
# Ports derived from a job id land here: above the well-known and registered service
# ports most sites use, below Linux's default ephemeral range (32768-60999), so a port
# the kernel hands out to some client socket never collides with our rendezvous.
JOB_PORT_RANGE = (20000, 32000)
LOCALHOST = "127.0.0.1"


@dataclass(frozen=True, kw_only=True)
class Placement:
    """Where this process sits in the job; the answer of :func:`detect`."""

    rank: int
    """Global rank, 0 <= rank < world_size."""
    local_rank: int
    """Rank among the processes of this node; picks the GPU."""
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str | None
    """Rendezvous host; None where the launcher gives no way to know it (multi-node MPI)."""
    master_port: int
    launcher: str
    """Which launcher set the variables: torchrun, deepspeed, horovod, slurm, openmpi, pmi,
    env (RANK/WORLD_SIZE exported by hand) or single."""
    hosts: tuple[str, ...] = ()
    """The job's nodes in order, where the launcher tells them."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """For each field, the variable (or rule) it came from, for ``--explain`` output."""
    job: Job = field(default_factory=Job)
    """The scheduler's job around the ranks (:func:`scalerun.job.detect_job`), whichever
    launcher started them: a torchrun inside a SLURM job is still that job."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def to_env(self) -> dict[str, str]:
        """The torchrun-style variables that libraries read (torch, DeepSpeed, HF)."""
        env = {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "GROUP_RANK": str(self.node_rank),
            "MASTER_PORT": str(self.master_port),
        }
        if self.master_addr is not None:
            env["MASTER_ADDR"] = self.master_addr
        return env


AGENT_LAUNCHERS = frozenset({"torchrun", "deepspeed"})
"""Launchers whose ranks are children of a Python agent: one that may be killed outright
(its ranks then end with it, :mod:`scalerun.runtime.init`), and that takes any non-zero
exit of a rank for a failure to restart (:mod:`scalerun.runtime.preempt`)."""

#: Identity variables: a differing value already in the environment is a stale export
#: (every task of an srun step would get the same rank), never a choice to respect.
STRICT_VARIABLES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK"})


def split_exports(
    wanted: Mapping[str, str], environ: Mapping[str, str]
) -> tuple[dict[str, str], dict[str, str]]:
    """(variables to add, wanted values the user already set otherwise and keeps).

    The user's values win, except a differing RANK, WORLD_SIZE or LOCAL_RANK, which
    raises :class:`PlacementError`. Shared by ``scalerun.init()`` and ``scalerun exec``.
    """
    added = {name: value for name, value in wanted.items() if name not in environ}
    differing = {
        name: value
        for name, value in wanted.items()
        if name in environ and environ[name].strip() != value
    }
    for name in sorted(STRICT_VARIABLES & differing.keys()):
        raise PlacementError(
            f"{name}={environ[name]} in the environment disagrees with the launcher's "
            f"{differing[name]}; unset {name} (a stale value would give every rank the same one)"
        )
    return added, differing


# ---------------------------------------------------------------------------
# Strict readers of single variables
# ---------------------------------------------------------------------------


def _int(environ: Mapping[str, str], name: str, *, minimum: int = 0) -> int:
    """Read an integer variable strictly; the message names it and the fix."""
    raw = environ.get(name)
    if raw is None:
        raise PlacementError(f"{name} is not set; start the job with its launcher or export {name}")
    try:
        value = int(raw.strip())
    except ValueError:
        raise PlacementError(
            f"{name}={raw!r} is not an integer; unset it or give a whole number"
        ) from None
    if value < minimum:
        raise PlacementError(f"{name}={value} must be >= {minimum}; fix or unset {name}")
    return value


def _first_int(environ: Mapping[str, str], *names: str, minimum: int = 0) -> tuple[int, str]:
    """The first of ``names`` that is set, read strictly, with the name it came from."""
    for name in names:
        if name in environ:
            return _int(environ, name, minimum=minimum), name
    raise PlacementError(f"none of {', '.join(names)} is set; start the job with its launcher")


def _check_rank(rank: int, rank_var: str, size: int, size_var: str) -> None:
    if rank >= size:
        raise PlacementError(
            f"{rank_var}={rank} is not below {size_var}={size}; the variables come from "
            "different jobs or steps: unset the stale ones"
        )


def _port(environ: Mapping[str, str]) -> tuple[int, str]:
    """Master port: explicit value, else derived from the job id, else torch's default."""
    if "MASTER_PORT" in environ:
        port = _int(environ, "MASTER_PORT", minimum=1)
        if port > 65535:
            raise PlacementError(f"MASTER_PORT={port} is not a TCP port; use 1024-65535")
        return port, "MASTER_PORT"
    job_id = detect_job(environ).job_id
    if job_id:
        return master_port_for_job(job_id), "derived from SLURM_JOB_ID"
    return DEFAULT_MASTER_PORT, "default"


def master_port_for_job(job_id: str) -> int:
    """A port fixed by the job id, so every rank of the job computes the same one.

    Two jobs that share a node get different ports (unlike a port taken from the job
    id's last digits, which collides for job ids 1000 apart): the id is hashed and
    mapped onto :data:`JOB_PORT_RANGE`.
    """
    digest = hashlib.sha256(job_id.strip().encode()).digest()
    low, high = JOB_PORT_RANGE
    return low + int.from_bytes(digest[:4], "big") % (high - low)


def job_rendezvous(environ: Mapping[str, str]) -> str:
    """``host:port`` of rank 0 for a whole job: the first node and a port fixed by the job id.

    Used in a batch script (outside any srun step, where :func:`detect` rightly sees no
    ranks) for torchrun's ``--rdzv-endpoint``; MASTER_ADDR/MASTER_PORT set by the user win.
    """
    job = detect_job(environ)
    if not job.node_list or not job.job_id:
        raise PlacementError(
            "SLURM_JOB_NODELIST and SLURM_JOB_ID are not set: --rendezvous works only inside a "
            "SLURM job (a batch script or salloc shell)"
        )
    host = environ.get("MASTER_ADDR") or expand_hosts(job.node_list)[0]
    port = environ.get("MASTER_PORT") or str(master_port_for_job(job.job_id))
    return f"{host}:{port}"


# ---------------------------------------------------------------------------
# Host lists
# ---------------------------------------------------------------------------


def expand_hosts(nodelist: str) -> list[str]:
    """Expand a SLURM host list (``nid[005527-005530]``, ``rack[1-2]-node[01-04]``).

    python-hostlist implements SLURM's own grammar, including several bracket groups in
    one name, which ad-hoc regexes (LUMI's ``get-master.py``) get wrong.
    """
    try:
        return hostlist.expand_hostlist(nodelist.strip())
    except hostlist.BadHostlist as error:
        raise PlacementError(
            f"node list {nodelist!r} cannot be expanded ({error}); pass a SLURM host list "
            "such as nid[001-004]"
        ) from None


def expand_tasks_per_node(spec: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand ``SLURM_TASKS_PER_NODE`` (``8(x4)``, ``2,1``, ``4(x2),3``) to one count a node."""
    counts: list[int] = []
    for part in spec.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise PlacementError(
                f"{variable}={spec!r} is not of the form 8(x4) or 2,1; unset it"
            )
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


# ---------------------------------------------------------------------------
# One reader per launcher; each returns None when its launcher is not the one
# ---------------------------------------------------------------------------

Detector = Callable[[Mapping[str, str]], "Placement | None"]


def _from_torchrun(environ: Mapping[str, str]) -> Placement | None:
    """torchrun / torch elastic: it sets TORCHELASTIC_RUN_ID and the full variable set."""
    if "TORCHELASTIC_RUN_ID" not in environ:
        return None
    return _from_rank_variables(environ, launcher="torchrun")


def _from_deepspeed(environ: Mapping[str, str]) -> Placement | None:
    """DeepSpeed's launcher (``deepspeed train.py``): RANK plus CROSS_RANK/CROSS_SIZE."""
    if "CROSS_RANK" not in environ or "RANK" not in environ:
        return None
    return _from_rank_variables(environ, launcher="deepspeed")


def _from_rank_variables(environ: Mapping[str, str], *, launcher: str) -> Placement:
    """Common reader of the torchrun-style RANK/LOCAL_RANK/WORLD_SIZE variables."""
    rank = _int(environ, "RANK")
    world_size = _int(environ, "WORLD_SIZE", minimum=1)
    _check_rank(rank, "RANK", world_size, "WORLD_SIZE")
    local_rank = _int(environ, "LOCAL_RANK")
    local_world_size, lws_var = _first_int(
        environ, "LOCAL_WORLD_SIZE", "LOCAL_SIZE", minimum=1
    )
    _check_rank(local_rank, "LOCAL_RANK", local_world_size, lws_var)
    num_nodes = max(1, world_size // local_world_size)
    node_rank, node_var = (
        _first_int(environ, "GROUP_RANK", "CROSS_RANK", "NODE_RANK")
        if any(k in environ for k in ("GROUP_RANK", "CROSS_RANK", "NODE_RANK"))
        else (rank // local_world_size, "RANK // LOCAL_WORLD_SIZE")
    )
    port, port_src = _port(environ)
    return Placement(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=environ.get("MASTER_ADDR", LOCALHOST),
        master_port=port,
        launcher=launcher,
        sources={
            "rank": "RANK",
            "local_rank": "LOCAL_RANK",
            "world_size": "WORLD_SIZE",
            "local_world_size": lws_var,
            "node_rank": node_var,
            "master_addr": "MASTER_ADDR" if "MASTER_ADDR" in environ else "default",
            "master_port": port_src,
        },
    )


def _is_slurm_step(environ: Mapping[str, str]) -> bool:
    """True inside a task of an ``srun`` step, False in a batch script or ``salloc`` shell.

    A batch script or salloc shell has the job's variables (and the batch script even
    SLURM_PROCID=0), but only a task launched by srun has a step id and a step task count.
    Treating the shell as rank 0 of SLURM_NTASKS would hang waiting for peers that never
    start.
    """
    has_step = "SLURM_STEP_ID" in environ or "SLURM_STEPID" in environ
    return has_step and "SLURM_PROCID" in environ and "SLURM_STEP_NUM_TASKS" in environ


def _from_slurm(environ: Mapping[str, str]) -> Placement | None:
    """An ``srun`` task: SLURM_PROCID/LOCALID/NODEID and the step's node list."""
    if not _is_slurm_step(environ):
        return None
    rank = _int(environ, "SLURM_PROCID")
    world_size, size_var = _first_int(
        environ, "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", minimum=1
    )
    _check_rank(rank, "SLURM_PROCID", world_size, size_var)
    node_rank = _int(environ, "SLURM_NODEID")
    num_nodes, nodes_var = _first_int(
        environ, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", minimum=1
    )
    _check_rank(node_rank, "SLURM_NODEID", num_nodes, nodes_var)
    hosts, hosts_var = _slurm_hosts(environ, num_nodes, nodes_var)
    local_rank = _int(environ, "SLURM_LOCALID")
    local_world_size, lws_src = _slurm_local_world_size(environ, node_rank, world_size, num_nodes)
    _check_rank(local_rank, "SLURM_LOCALID", local_world_size, lws_src)
    port, port_src = _port(environ)
    master = environ.get("MASTER_ADDR") or hosts[0]
    return Placement(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=master,
        master_port=port,
        launcher="slurm",
        hosts=tuple(hosts),
        sources={
            "rank": "SLURM_PROCID",
            "local_rank": "SLURM_LOCALID",
            "world_size": size_var,
            "local_world_size": lws_src,
            "node_rank": "SLURM_NODEID",
            "num_nodes": nodes_var,
            "master_addr": "MASTER_ADDR" if "MASTER_ADDR" in environ else f"first of {hosts_var}",
            "master_port": port_src,
        },
    )


def _slurm_hosts(
    environ: Mapping[str, str], num_nodes: int, nodes_var: str
) -> tuple[list[str], str]:
    """The step's hosts in order; they must be at least as many as the node count."""
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        if environ.get(name):
            hosts = expand_hosts(environ[name])
            if len(hosts) < num_nodes:
                raise PlacementError(
                    f"{name}={environ[name]!r} names {len(hosts)} hosts but "
                    f"{nodes_var}={num_nodes}; the variables come from different jobs"
                )
            return hosts, name
    raise PlacementError(
        "SLURM_STEP_NODELIST and SLURM_JOB_NODELIST are not set; run inside an srun step"
    )


def _slurm_local_world_size(
    environ: Mapping[str, str], node_rank: int, world_size: int, num_nodes: int
) -> tuple[int, str]:
    """Tasks on this node, from the step's (else the job's) tasks-per-node list."""
    for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        if environ.get(name):
            counts = expand_tasks_per_node(environ[name], name)
            if node_rank >= len(counts):
                raise PlacementError(
                    f"{name}={environ[name]!r} lists {len(counts)} nodes but "
                    f"SLURM_NODEID={node_rank}; unset the stale variable"
                )
            return counts[node_rank], name
    if world_size % num_nodes:
        raise PlacementError(
            f"cannot tell tasks on this node: {world_size} tasks on {num_nodes} nodes and "
            "SLURM_STEP_TASKS_PER_NODE is not set"
        )
    return world_size // num_nodes, "tasks / nodes"


#: MPI-style launchers: (rank, size, local rank, local size) variables. They number
#: ranks node by node (by-slot mapping, their default) and name no rendezvous host.
MPI_VARIABLES: dict[str, tuple[str, str, str, str]] = {
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    # MPICH / Intel MPI (hydra) and Cray PMI
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}


def _mpi_reader(launcher: str) -> Detector:
    """The detector of one MPI-style launcher of :data:`MPI_VARIABLES`."""
    rank_var, size_var, local_rank_var, local_size_var = MPI_VARIABLES[launcher]

    def read(environ: Mapping[str, str]) -> Placement | None:
        if rank_var not in environ:
            return None
        return _from_mpi(environ, launcher=launcher, rank_var=rank_var, size_var=size_var,
                         local_rank_var=local_rank_var, local_size_var=local_size_var)

    return read


def _from_mpi(
    environ: Mapping[str, str],
    *,
    launcher: str,
    rank_var: str,
    size_var: str,
    local_rank_var: str,
    local_size_var: str,
) -> Placement:
    """MPI launchers number ranks node by node (by-slot mapping, their default)."""
    rank = _int(environ, rank_var)
    world_size = _int(environ, size_var, minimum=1)
    _check_rank(rank, rank_var, world_size, size_var)
    local_rank = _int(environ, local_rank_var) if local_rank_var in environ else rank
    local_world_size = (
        _int(environ, local_size_var, minimum=1) if local_size_var in environ else world_size
    )
    _check_rank(local_rank, local_rank_var, local_world_size, local_size_var)
    num_nodes = max(1, -(-world_size // local_world_size))
    port, port_src = _port(environ)
    # MPI gives no rendezvous host: one node can use loopback, several need MASTER_ADDR.
    master = environ.get("MASTER_ADDR") or (LOCALHOST if num_nodes == 1 else None)
    return Placement(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        local_world_size=local_world_size,
        node_rank=rank // local_world_size,
        num_nodes=num_nodes,
        master_addr=master,
        master_port=port,
        launcher=launcher,
        sources={
            "rank": rank_var,
            "world_size": size_var,
            "local_rank": local_rank_var,
            "local_world_size": local_size_var,
            "master_addr": "MASTER_ADDR" if "MASTER_ADDR" in environ else "single node",
            "master_port": port_src,
        },
    )


def _from_env_variables(environ: Mapping[str, str]) -> Placement | None:
    """RANK and WORLD_SIZE exported by hand (course scripts, ``scalerun exec``, Accelerate)."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    local = dict(environ)
    local.setdefault("LOCAL_RANK", environ["RANK"])
    local.setdefault("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])
    return _from_rank_variables(local, launcher="env")


def _single(environ: Mapping[str, str]) -> Placement:
    """No launcher: one process, rendezvous on loopback."""
    port, port_src = _port(environ)
    return Placement(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=environ.get("MASTER_ADDR", LOCALHOST),
        master_port=port,
        launcher="single",
        sources={"rank": "no launcher found", "master_port": port_src},
    )


#: Tried in this order; the first that recognises its launcher wins.
DETECTORS: tuple[tuple[str, Detector], ...] = (
    ("torchrun", _from_torchrun),  # may run inside an sbatch script: before SLURM
    ("deepspeed", _from_deepspeed),  # same reason
    ("horovod", _mpi_reader("horovod")),  # horovodrun may also run inside an sbatch script
    ("slurm", _from_slurm),  # only inside an srun step, never a batch or salloc shell
    ("openmpi", _mpi_reader("openmpi")),
    ("pmi", _mpi_reader("pmi")),  # Cray's srun sets PMI_RANK too: after SLURM
    ("env", _from_env_variables),  # RANK/WORLD_SIZE exported by a wrapper script
)


def detect(environ: Mapping[str, str] | None = None) -> Placement:
    """The placement of this process, read from ``environ`` (``os.environ`` when None).

    Raises :class:`PlacementError` when the recognised launcher's variables are
    inconsistent; never guesses a world size.
    """
    env = os.environ if environ is None else environ
    job = detect_job(env)
    for _name, reader in DETECTORS:
        placement = reader(env)
        if placement is not None:
            return replace(placement, job=job)
    return replace(_single(env), job=job)


def launcher_name(environ: Mapping[str, str] | None = None) -> str:
    """Which launcher started this process, without reading any value strictly."""
    env = os.environ if environ is None else environ
    checks = {
        "torchrun": "TORCHELASTIC_RUN_ID" in env,
        "deepspeed": "CROSS_RANK" in env and "RANK" in env,
        "slurm": _is_slurm_step(env),
        **{name: variables[0] in env for name, variables in MPI_VARIABLES.items()},
        "env": "RANK" in env and "WORLD_SIZE" in env,
    }
    return next((name for name, _ in DETECTORS if checks[name]), "single")


#: Where a bare local rank can be read when no launcher is recognised (a wrapper that
#: exports only LOCAL_RANK, an MPI that sets only its local id), in this order.
LOCAL_RANK_VARIABLES = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def local_rank_only(environ: Mapping[str, str]) -> tuple[int, str] | None:
    """(local rank, variable) from :data:`LOCAL_RANK_VARIABLES`, read strictly; None when
    none is set. For ``scalerun bind``, which binds one rank of a node and needs no world."""
    for name in LOCAL_RANK_VARIABLES:
        if name in environ:
            return _int(environ, name), name
    return None


def on_one_node(local_rank: int, local_world_size: int, *, source: str) -> Placement:
    """A placement known only by its local rank and ranks per node (``scalerun bind``'s
    flags): one node, the local numbers standing for the global ones."""
    if not 0 <= local_rank < local_world_size:
        raise PlacementError(
            f"local rank {local_rank} is not below ranks per node {local_world_size}; "
            "fix --local-rank or --ranks-per-node"
        )
    return Placement(rank=local_rank, local_rank=local_rank, world_size=local_world_size,
                     local_world_size=local_world_size, node_rank=0, num_nodes=1,
                     master_addr=LOCALHOST, master_port=DEFAULT_MASTER_PORT, launcher=source,
                     sources={"local_rank": source, "local_world_size": source})


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name as the scheduler knows it (:attr:`Job.node_name`), else the host name.

    SLURM's name is what ``--exclude`` and ``--nodelist`` take, and it stays unique where
    host names repeat or differ from it (containers, aliases, test clusters).
    """
    env = os.environ if environ is None else environ
    return detect_job(env).node_name or socket.gethostname()


#: Where a bare global rank can be read before any placement is (``scalerun.print`` before
#: ``init()``), in this order.
RANK_VARIABLES = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def is_rank_zero(environ: Mapping[str, str]) -> bool:
    """Whether the first of :data:`RANK_VARIABLES` that is set says rank 0 (True where none
    is: a single process). Lenient, unlike :func:`detect`: it only decides who prints."""
    for name in RANK_VARIABLES:
        if name in environ:
            return environ[name].strip() == "0"
    return True
