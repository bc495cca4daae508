"""A real SLURM cluster on this one machine, for scalerun's tests and for trying scalerun.

Why: scalerun's SLURM launcher must be checked against the real ``sbatch``/``srun`` (their
quoting, their environment, their exit states), not against our idea of them. Debian's
``slurm-wlm`` runs one ``slurmctld`` and several ``slurmd`` "nodes" side by side when each
node has its own port, and fake GPUs are accepted as character devices, so a multi-node
GPU cluster fits on one laptop-sized machine.

This module decides: the node names (``nid000001``...), their loopback addresses
(127.0.0.11, 127.0.0.12, ...), the config and state folder (``/tmp/scalerun-slurm`` or
``$SCALERUN_CLUSTER_DIR``). It must never touch a non-loopback address, never stop a
process it did not start (daemons are stopped by the pid it recorded, after checking that
pid still runs our config), and never edit ``/etc/slurm``: clients find the cluster
through ``SLURM_CONF``.

Usage::

    python tests/cluster/cluster.py up [--nodes 2] [--gpus-per-node 8]
    export SLURM_CONF=/tmp/scalerun-slurm/etc/slurm.conf
    sinfo; srun -N 2 -n 4 hostname
    python tests/cluster/cluster.py status
    python tests/cluster/cluster.py down
    python tests/cluster/cluster.py up --second   # the test suite's second cluster

Several test sessions may share the cluster: each joins it (starting it if needed) and
leaves at its end; the last one to leave stops a cluster that a session started. A
cluster started with ``up`` stays up until ``down``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

DEFAULT_ROOT = Path(os.environ.get("SCALERUN_CLUSTER_DIR", "/tmp/scalerun-slurm"))
MACHINE_LOCK = Path("/tmp/scalerun-slurm-clusters.lock")
"""One lock for every test cluster of this machine: they share munged and /etc/hosts."""
REGISTRY = Path("/tmp/scalerun-slurm-clusters")
"""One file per cluster that is up (its root), so the last one down stops what they share."""
HOSTS_FILE = Path("/etc/hosts")
HOSTS_MARK = "# scalerun test cluster"
PARTITIONS = ("debug", "standard-g", "small-g")  # debug is the default; the others mimic LUMI
SLURM_TOOLS = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "munged")


class ClusterError(RuntimeError):
    """The test cluster cannot start or answer; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """What the test cluster looks like; everything else is derived from it."""

    root: Path = DEFAULT_ROOT
    """Folder holding config, state, spool, logs and the fake GPU devices."""
    nodes: int = 2
    """Number of slurmd "nodes"."""
    gpus_per_node: int = 8
    """Fake GPUs (gres ``gpu``) declared on every node."""
    cpus_per_node: int = field(default_factory=lambda: os.cpu_count() or 2)
    """CPUs SLURM gives each node: the machine's, so a job holding a whole node holds all of
    them (more makes room for 8 tasks a node, but SLURM's CPU ids then name CPUs that
    do not exist)."""
    memory_mb: int = 8000
    """RealMemory of each node, so memory requests are checked."""
    controller_port: int = 16817
    first_node_port: int = 17001
    job_id_offset: int = 0
    """Added to where the job ids of a start begin: two clusters started together (the
    test suite's two, :func:`second_cluster`) give different ids, so their jobs' per-id
    folders in /tmp and ports derived from the id never meet."""

    def __post_init__(self) -> None:
        if not 1 <= self.nodes <= 200:
            raise ClusterError(f"--nodes {self.nodes}: the test cluster holds 1 to 200 nodes")
        if not 1 <= self.gpus_per_node <= 64:
            raise ClusterError(f"--gpus-per-node {self.gpus_per_node}: use 1 to 64 fake GPUs")

    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def state_file(self) -> Path:
        return self.root / "cluster.json"

    def node_names(self) -> list[str]:
        """LUMI-style names, so node lists look like ``nid[000001-000002]``."""
        return [f"nid{index:06d}" for index in range(1, self.nodes + 1)]

    def node_address(self, index: int) -> str:
        """A loopback address per node: all of 127.0.0.0/8 is local on Linux."""
        return f"127.0.0.{11 + index}"

    def gpu_files(self) -> list[Path]:
        return [self.root / "dev" / f"gpu{index}" for index in range(self.gpus_per_node)]


# --- configuration text (pure) -------------------------------------------------------


def second_cluster(first: ClusterSpec | None = None) -> ClusterSpec:
    """A second cluster beside ``first`` (the default one): same node names, addresses and
    shape, its own folder, controller and node ports, and job ids half the id range away.
    The test suite runs its SLURM tests in two halves, one per cluster, on two workers:
    one cluster runs one 2-node job at a time, and many tests wait on their jobs' queue
    states and signals rather than use the CPUs (tests/slurm_fixture.py)."""
    first = first or ClusterSpec()
    return replace(first, root=first.root.with_name(first.root.name + "-b"),
                   controller_port=first.controller_port + 10,
                   first_node_port=first.first_node_port + 100,
                   job_id_offset=first.job_id_offset + 33_500_000)


def slurm_conf_text(spec: ClusterSpec, first_job_id: int = 1) -> str:
    """Render slurm.conf: root everywhere, no cgroups, no accounting, one port per node.

    ``first_job_id``: where this start's job ids begin. A real cluster never gives a job
    id twice; this one starts afresh many times on one machine, and what a job leaves in
    /tmp under its id (the per-node JIT cache folders, ``/tmp/$USER-scalerun-cache-$SLURM_JOB_ID-node0``)
    would greet the next start's job of the same id as if it were its own."""
    root = spec.root
    lines = [
        "# Written by tests/cluster/cluster.py; regenerated on every 'up'.",
        "ClusterName=scalerun-test",
        f"FirstJobId={first_job_id}",
        f"SlurmctldHost={socket.gethostname()}(127.0.0.1)",
        f"SlurmctldPort={spec.controller_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        # A requeued job may start again only once its step credentials expired (default
        # 120 s): 10 s keeps the preemption tests short (tests/test_slurm_preempt.py).
        "AuthInfo=cred_expire=10",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/affinity",
        "TaskPluginParam=None",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "DefMemPerCPU=500",
        "EnforcePartLimits=ALL",  # refuse impossible jobs at sbatch time, as LUMI does
        "SlurmdParameters=config_overrides",
        "GresTypes=gpu",
        "MpiDefault=none",
        "ReturnToService=2",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin",
        # a job that becomes eligible with time (a requeued one, 10 s after its requeue) waits
        # for the main scheduling loop's next pass, every 60 s by default: 30 s on average of
        # nothing in each requeue test; submits and ends start the loop at once anyway
        "SchedulerParameters=sched_interval=2",
        "KillWait=5",
        "MinJobAge=600",
        "InactiveLimit=0",
        "SlurmdTimeout=60",
        "Waittime=0",
    ]
    for index, name in enumerate(spec.node_names()):
        lines.append(
            f"NodeName={name} NodeHostname={name} NodeAddr={spec.node_address(index)}"
            f" Port={spec.first_node_port + index} CPUs={spec.cpus_per_node}"
            f" RealMemory={spec.memory_mb} Gres=gpu:{spec.gpus_per_node} State=UNKNOWN"
        )
    for partition in PARTITIONS:
        default = "YES" if partition == PARTITIONS[0] else "NO"
        lines.append(
            f"PartitionName={partition} Nodes=ALL Default={default} MaxTime=INFINITE State=UP"
        )
    return "\n".join(lines) + "\n"


def gres_conf_text(spec: ClusterSpec) -> str:
    """Every node declares the same fake device files: SLURM only checks they exist."""
    last = spec.gpus_per_node - 1
    files = f"{spec.root}/dev/gpu[0-{last}]" if last else f"{spec.root}/dev/gpu0"
    return f"NodeName={','.join(spec.node_names())} Name=gpu File={files}\n"


def host_name(node: str) -> str:
    """The machine name a node's tasks see (``hostname``): not its SLURM name, as on clusters
    with aliases or containers, so nothing in scalerun may rely on the two being equal."""
    return f"{node}-host"


def hosts_lines(spec: ClusterSpec) -> list[str]:
    return [
        f"{spec.node_address(index)} {name} {host_name(name)}  {HOSTS_MARK}"
        for index, name in enumerate(spec.node_names())
    ]


# --- machine set-up (I/O) ---------------------------------------------------------------


def require_root() -> None:
    if os.geteuid() != 0:
        raise ClusterError(
            "the SLURM test cluster needs root (apt-get, munge, /etc/hosts, mknod); "
            "run as root, or deselect these tests with -m 'not slurm'"
        )


def ensure_slurm_installed() -> None:
    """Install slurm-wlm and munge from Debian when any tool is missing (about 20 s)."""
    missing = [tool for tool in SLURM_TOOLS if not _which(tool)]
    if not missing:
        return
    require_root()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"],
    ):
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise ClusterError(
                f"{' '.join(command)} failed ({'; '.join(tail)}); SLURM tools missing: "
                f"{', '.join(missing)}; install slurm-wlm and munge by hand"
            )


def _which(tool: str) -> str | None:
    """Find a tool on PATH or in the sbin folders a non-login shell may lack."""
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def munge_works() -> bool:
    encoded = subprocess.run(["munge", "-n"], capture_output=True)
    if encoded.returncode != 0:
        return False
    decoded = subprocess.run(["unmunge"], input=encoded.stdout, capture_output=True)
    return decoded.returncode == 0


def ensure_munge() -> int | None:
    """Start munged when it does not answer; return its pid if we started it."""
    if munge_works():
        return None
    for folder in ("/etc/munge", "/var/lib/munge", "/var/log/munge", "/run/munge"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True, capture_output=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    subprocess.run(["su", "-s", "/bin/sh", "munge", "-c", _which("munged") or "munged"], check=True)
    for _ in range(50):
        if munge_works():
            return int(Path("/run/munge/munged.pid").read_text().strip())
        time.sleep(0.1)
    raise ClusterError(
        "munged started but 'munge -n | unmunge' fails; see /var/log/munge/munged.log"
    )


def ensure_hosts(spec: ClusterSpec) -> None:
    """Make node names resolve to their loopback address; refuse other mappings."""
    text = HOSTS_FILE.read_text()
    known = _hosts_map(text)
    wanted = {alias: spec.node_address(i) for i, name in enumerate(spec.node_names())
              for alias in (name, host_name(name))}
    for name, address in wanted.items():
        if name in known and known[name] != address:
            raise ClusterError(
                f"/etc/hosts maps {name} to {known[name]}, the test cluster needs {address}; "
                f"remove that line"
            )
    missing = [line for line in hosts_lines(spec) if not set(line.split()[1:3]) <= known.keys()]
    if missing:
        HOSTS_FILE.write_text(text.rstrip("\n") + "\n" + "\n".join(missing) + "\n")


def remove_hosts() -> None:
    """Drop the lines ensure_hosts added (and only those)."""
    lines = HOSTS_FILE.read_text().splitlines()
    kept = [line for line in lines if not line.endswith(HOSTS_MARK)]
    if kept != lines:
        HOSTS_FILE.write_text("\n".join(kept) + "\n")


def _hosts_map(text: str) -> dict[str, str]:
    mapping: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        for name in fields[1:]:
            mapping.setdefault(name, fields[0])
    return mapping


def make_fake_gpus(spec: ClusterSpec) -> None:
    """Character devices (like /dev/null: major 1, minor 3); SLURM rejects plain files."""
    for path in spec.gpu_files():
        if not path.is_char_device():
            path.unlink(missing_ok=True)
            os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))


def write_config(spec: ClusterSpec) -> None:
    for sub in ("etc", "state", "spool", "run", "log", "dev"):
        (spec.root / sub).mkdir(parents=True, exist_ok=True)
    # a new range of job ids at every start: tenths of a second since 2026, below SLURM's
    # largest job id (67,043,328); the range comes round again every 77 days
    first_job_id = 1000 + (int((time.time() - 1_767_225_600) * 10) + spec.job_id_offset) % 67_000_000
    spec.conf.write_text(slurm_conf_text(spec, first_job_id))
    (spec.root / "etc" / "gres.conf").write_text(gres_conf_text(spec))


# --- daemons ---------------------------------------------------------------------------------


def _spawn(command: list[str], log: Path) -> int:
    """Start a daemon in the foreground mode (-D), detached from our session."""
    with open(log, "ab") as out:
        process = subprocess.Popen(
            command,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return process.pid


def _runs_our_config(pid: int, conf: Path) -> bool:
    """True when pid is alive (not a zombie) and its command line names our slurm.conf."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z" and str(conf).encode() in cmdline


def client_env(spec: ClusterSpec) -> dict[str, str]:
    """The environment a client (sbatch, srun, sinfo) needs to reach this cluster."""
    return {**os.environ, "SLURM_CONF": str(spec.conf)}


def node_states(spec: ClusterSpec) -> dict[str, str]:
    done = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%N %t"],
        env=client_env(spec),
        capture_output=True,
        text=True,
        timeout=10,
    )
    if done.returncode != 0:
        return {}
    return dict(line.split() for line in done.stdout.splitlines() if line.strip())


SERVING = frozenset({"idle", "mix", "alloc", "comp"})
"""Node states of a node that takes jobs: idle, or busy with another session's jobs."""


def wait_idle(spec: ClusterSpec, timeout_s: float = 60.0, *, busy_ok: bool = False) -> None:
    """Wait until every node is idle; with ``busy_ok`` (a session joining a cluster that
    others use) until every node serves, idle or running their jobs."""
    wanted = SERVING if busy_ok else {"idle"}
    deadline = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(spec)
        if len(states) == spec.nodes and all(s.rstrip("*") in wanted for s in states.values()):
            return
        time.sleep(0.3)
    raise ClusterError(
        f"nodes not {'serving' if busy_ok else 'idle'} after {timeout_s:.0f} s (sinfo: "
        f"{states or 'no answer'}); see the logs in {spec.root}/log"
    )


@dataclass(kw_only=True)
class ClusterState:
    """What `up` started, so that `down` stops exactly that."""

    spec: dict
    daemons: dict[str, int]
    munged_pid: int | None = None
    owner: str = "cli"
    """cli (stays up until `down`) or session (the last test session stops it)."""

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))

    @classmethod
    def load(cls, path: Path) -> ClusterState | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


def _spec_from_state(state: ClusterState) -> ClusterSpec:
    fields = {**state.spec, "root": Path(state.spec["root"])}
    return ClusterSpec(**fields)


def is_up(spec: ClusterSpec) -> bool:
    state = ClusterState.load(spec.state_file)
    if state is None or _spec_from_state(state) != spec:
        return False
    return all(_runs_our_config(pid, spec.conf) for pid in state.daemons.values())


# --- sharing: several pytest sessions (and a `make cluster-up`) may use one cluster --------


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """One up/down/join/leave at a time on this machine, of any of its clusters (they
    share munged and the /etc/hosts lines)."""
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(MACHINE_LOCK, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _registry_file(root: Path) -> Path:
    return REGISTRY / str(root.resolve()).strip("/").replace("/", "%")


def _other_clusters_up(root: Path) -> list[Path]:
    """Roots of the other clusters of this machine that run (registered, or at the two
    default places, which a cluster started before the registry existed may use)."""
    registered = [Path(p.read_text()) for p in REGISTRY.glob("*")] if REGISTRY.is_dir() else []
    candidates = {*registered, DEFAULT_ROOT, second_cluster().root} - {root}
    up_roots = []
    for other in sorted(candidates):
        state = ClusterState.load(other / "cluster.json")
        if state is not None and is_up(_spec_from_state(state)):
            up_roots.append(other)
    return up_roots


def live_users(root: Path) -> list[int]:
    """Pids of the test sessions using the cluster; files of dead sessions are dropped."""
    folder = root / "users"
    alive = []
    for path in folder.glob("*") if folder.is_dir() else []:
        if path.name.isdigit() and Path(f"/proc/{path.name}").exists():
            alive.append(int(path.name))
        else:
            path.unlink(missing_ok=True)
    return sorted(alive)


def join(spec: ClusterSpec, pid: int) -> bool:
    """Start the cluster if needed and count ``pid`` as a user; True when this call started it."""
    with _locked(spec.root):
        started = _up(spec, owner="session")
        (spec.root / "users").mkdir(exist_ok=True)
        (spec.root / "users" / str(pid)).touch()
    return started


def leave(spec: ClusterSpec, pid: int) -> None:
    """Stop counting ``pid``; the last user stops a cluster that a session started."""
    with _locked(spec.root):
        (spec.root / "users" / str(pid)).unlink(missing_ok=True)
        state = ClusterState.load(spec.state_file)
        if state is not None and state.owner == "session" and not live_users(spec.root):
            _down(spec.root)


def up(spec: ClusterSpec) -> bool:
    """Start the cluster for a person (it stays up until `down`); False if it was up."""
    with _locked(spec.root):
        return _up(spec, owner="cli")


def down(root: Path = DEFAULT_ROOT, force: bool = False) -> None:
    """Stop the cluster, unless test sessions still use it (``force`` stops it anyway)."""
    with _locked(root):
        users = live_users(root)
        if users and not force:
            raise ClusterError(
                f"test sessions (pids {', '.join(map(str, users))}) use the cluster; "
                "wait for them, or pass --force"
            )
        _down(root)


def _up(spec: ClusterSpec, owner: str) -> bool:
    """Start the cluster (installing SLURM if needed); False if it was already up."""
    state = ClusterState.load(spec.state_file)
    if is_up(spec) and state is not None:
        if owner == "cli" and state.owner != "cli":  # a person wants it kept after the tests
            replace(state, owner="cli").save(spec.state_file)
        wait_idle(spec, busy_ok=True)  # other sessions may be running jobs on it
        return False
    require_root()
    users = live_users(spec.root)
    if users:
        raise ClusterError(
            f"a test cluster of another shape is in use by pids {', '.join(map(str, users))}; "
            "wait for them"
        )
    _down(spec.root)
    ensure_slurm_installed()
    munged_pid = ensure_munge()
    ensure_hosts(spec)
    for sub in ("state", "spool", "run"):
        shutil.rmtree(spec.root / sub, ignore_errors=True)
    write_config(spec)
    make_fake_gpus(spec)
    log = spec.root / "log"
    slurmctld = [_which("slurmctld") or "slurmctld", "-D", "-f", str(spec.conf)]
    daemons = {"slurmctld": _spawn(slurmctld, log / "slurmctld.stdout")}
    for name in spec.node_names():
        daemons[f"slurmd-{name}"] = _spawn(
            _slurmd_command(spec, name), log / f"slurmd-{name}.stdout"
        )
    state = ClusterState(
        spec={**dataclasses.asdict(spec), "root": str(spec.root)},
        daemons=daemons,
        munged_pid=munged_pid,
        owner=owner,
    )
    state.save(spec.state_file)
    REGISTRY.mkdir(exist_ok=True)
    _registry_file(spec.root).write_text(str(spec.root))
    wait_idle(spec)
    return True


def _slurmd_command(spec: ClusterSpec, name: str) -> list[str]:
    """slurmd for one node, in its own UTS namespace so that `hostname` in a task names its
    node's machine; that name differs from the SLURM node name on purpose (see host_name:
    torchrun's c10d picks who hosts its store by host name unless told)."""
    in_own_uts = ["unshare", "--uts", "--", "/bin/sh", "-c", 'hostname "$0" && exec "$@"',
                  host_name(name)]
    return [*in_own_uts, _which("slurmd") or "slurmd", "-D", "-N", name, "-f", str(spec.conf)]


def _stop_pid(pid: int, conf: Path, grace_s: float = 10.0) -> None:
    if not _runs_our_config(pid, conf):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _runs_our_config(pid, conf):
        _reap(pid)
        time.sleep(0.1)
    if _runs_our_config(pid, conf):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)


def _reap(pid: int) -> None:
    """Collect our own child's exit status so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _down(root: Path) -> None:
    """Cancel jobs, stop the daemons; when no other cluster of this machine runs, also
    munged (if a start of ours started it) and the hosts lines."""
    state = ClusterState.load(root / "cluster.json")
    if state is None:
        return
    spec = _spec_from_state(state)
    if state.daemons.get("slurmctld") and _runs_our_config(state.daemons["slurmctld"], spec.conf):
        subprocess.run(
            ["scancel", "--user", "root"], env=client_env(spec), capture_output=True, timeout=10
        )
    # Nodes first, controller last, so no node is marked down while jobs are cancelled.
    for _name, pid in sorted(state.daemons.items(), key=lambda item: item[0] == "slurmctld"):
        _stop_pid(pid, spec.conf)
    others = _other_clusters_up(root)
    if others:  # munged and the hosts lines serve them: the first one stops them later
        heir = ClusterState.load(others[0] / "cluster.json")
        if heir is not None and heir.munged_pid is None and state.munged_pid:
            replace(heir, munged_pid=state.munged_pid).save(others[0] / "cluster.json")
    else:
        if state.munged_pid and _is_munged(state.munged_pid):
            os.kill(state.munged_pid, signal.SIGTERM)
        remove_hosts()
    spec.state_file.unlink(missing_ok=True)
    _registry_file(root).unlink(missing_ok=True)


def _is_munged(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "munged"
    except OSError:
        return False


def status(root: Path = DEFAULT_ROOT) -> str:
    state = ClusterState.load(root / "cluster.json")
    if state is None:
        return f"down (no {root}/cluster.json)"
    spec = _spec_from_state(state)
    alive = {name: _runs_our_config(pid, spec.conf) for name, pid in state.daemons.items()}
    users = live_users(root)
    lines = [
        f"SLURM_CONF={spec.conf}",
        f"owner: {state.owner}; test sessions using it: {users or 'none'}",
    ]
    lines += [
        f"{name}: pid {state.daemons[name]} {'running' if ok else 'DEAD'}"
        for name, ok in alive.items()
    ]
    lines += [f"{node}: {s}" for node, s in node_states(spec).items()]
    return "\n".join(lines)


def check_python_on_nodes(spec: ClusterSpec, python: str, timeout_s: float = 60.0) -> None:
    """Fail early and clearly when a node cannot run the project's Python with scalerun."""
    command = [
        "srun",
        f"--nodes={spec.nodes}",
        "--ntasks-per-node=1",
        "--time=1",
        python,
        "-c",
        "import scalerun, sys; print(sys.executable)",
    ]
    done = subprocess.run(
        command, env=client_env(spec), capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise ClusterError(
            f"the cluster nodes cannot run {python} with scalerun ({done.stderr.strip()}); "
            f"run 'make test' (it installs the project into .venv) first"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["up", "down", "status"])
    parser.add_argument("--root", type=Path, default=None,
                        help=f"config and state folder (default {DEFAULT_ROOT})")
    parser.add_argument("--second", action="store_true",
                        help="the second cluster the test suite uses: its own folder, ports "
                             "and job ids (see second_cluster)")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpus-per-node", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--force", action="store_true", help="down: even while tests use it")
    args = parser.parse_args(argv)
    try:
        spec = ClusterSpec(
            root=args.root or DEFAULT_ROOT,
            nodes=args.nodes,
            gpus_per_node=args.gpus_per_node,
            cpus_per_node=args.cpus_per_node,
        )
        if args.second:
            spec = second_cluster(spec)
        if args.action == "up":
            started = up(spec)
            print(("started" if started else "already up") + f"; export SLURM_CONF={spec.conf}")
            print(status(spec.root))
        elif args.action == "down":
            down(spec.root, force=args.force)
            print("down")
        else:
            print(status(spec.root))
    except ClusterError as error:
        print(f"cluster {args.action}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
