"""Site profiles: what a cluster's nodes and SLURM set-up look like, as validated data.

Why: the course job scripts hard-code LUMI facts (partition names, 7 cores and 60 GB per
GCD, reserved cores, ``hsn*`` interfaces, container binds, per-node MIOpen caches). Here
those facts live in TOML files, one per site, so that a new cluster is a new file, not
new code, and a mistake in a file is reported on load with the file, the key and what
is wrong.

This module decides the shape of a profile (:class:`SiteProfile`) and checks every
value's type and range. It must never read hardware or the environment beyond the
profile folders (see :mod:`scalerun.sites.store`).
"""

from __future__ import annotations

import re
import types
import typing
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from scalerun.errors import SiteError

GPU_VENDORS = ("amd", "nvidia", "none")
CONTAINER_RUNTIMES = ("singularity", "apptainer")
# SLURM's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S.
TIME_RE = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}")
# SLURM memory sizes: a whole number with an optional K/M/G/T unit.
MEMORY_RE = re.compile(r"\d+[KMGT]?")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# A site image's short name (``--container NAME``): what a site name may be.
IMAGE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")


class Invalid(ValueError):
    """A value is wrong; ``key`` is the dotted key relative to the table being checked."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def check_time(key: str, value: str | None) -> None:
    if value is not None and not TIME_RE.fullmatch(value):
        raise Invalid(key, f"{value!r} is not a SLURM time (minutes, H:MM:SS or D-HH:MM:SS)")


def check_memory(key: str, value: str | None) -> None:
    if value is not None and not MEMORY_RE.fullmatch(value):
        raise Invalid(key, f"{value!r} is not a SLURM memory size such as 60G or 480000M")


def check_env_names(key: str, env: dict[str, str]) -> None:
    for name in env:
        if not ENV_NAME_RE.fullmatch(name):
            raise Invalid(f"{key}.{name}", "is not a valid environment variable name")


@dataclass(frozen=True, kw_only=True)
class SlurmDefaults:
    """``#SBATCH`` values a site's users would otherwise type on every job."""

    partition: str | None = None
    """Partition used when ``--partition`` is not given (None: SLURM's default)."""
    partitions: tuple[str, ...] = ()
    """Partitions of the site, listed by ``scalerun sites show``; empty means any."""
    account: str | None = None
    """Billing account (``--account``); usually set in a user profile, not a site one."""
    time: str | None = None
    """Default wall-time limit in SLURM syntax."""
    mem_per_gpu: str | None = None
    """Memory per GPU (``--mem-per-gpu``), e.g. 60G on LUMI-G."""
    cpus_per_gpu: int | None = None
    """Cores each GPU's rank may use; becomes ``--cpus-per-task`` in srun mode. Leave it out
    on a site without GPUs: each task then asks for an equal share of ``node.cores``."""
    exclusive: bool = False
    """Ask for whole nodes (``--exclusive``)."""
    sbatch_args: tuple[str, ...] = ()
    """Extra ``#SBATCH`` options, each ``--name=value``."""
    signal_before: int | None = None
    """Seconds before the time limit at which jobs are warned to save (``--signal-before``);
    None: scalerun's 120; 0: no warning. Longer than a step plus a checkpoint save."""
    requeue: bool = False
    """Jobs requeue themselves after saving on the warning (``--requeue``/``--no-requeue``)."""
    gpu_binding_safe: bool = False
    """SLURM's own GPU binding (``--gpus-per-task``, ``--gpu-bind``) leaves the GPUs of a
    node able to talk to each other here. It gives each task a device cgroup of its own,
    which on LUMI "breaks communication with RCCL and GPU-aware MPI" (the course, text
    003 line 26) and costs NCCL its NVLink path on NVIDIA nodes, so the default is false:
    scalerun then never advises those options, and the doctor WARNs when a job uses them.
    Set true only where the site has checked that GPU-to-GPU traffic survives them."""

    def __post_init__(self) -> None:
        check_time("time", self.time)
        if self.signal_before is not None and not 0 <= self.signal_before <= 65535:
            raise Invalid("signal_before", f"{self.signal_before} is not 0 (off) to 65535 seconds")
        check_memory("mem_per_gpu", self.mem_per_gpu)
        if self.cpus_per_gpu is not None and self.cpus_per_gpu < 1:
            raise Invalid("cpus_per_gpu", f"{self.cpus_per_gpu} must be at least 1")
        for index, arg in enumerate(self.sbatch_args):
            if not arg.startswith("--"):
                raise Invalid(
                    f"sbatch_args[{index}]", f"{arg!r} is not a long option such as --constraint=x"
                )
        if self.partitions and self.partition and self.partition not in self.partitions:
            raise Invalid(
                "partition", f"{self.partition!r} is not in partitions {list(self.partitions)}"
            )


@dataclass(frozen=True, kw_only=True)
class NodeSpec:
    """What one compute node has, as far as launching needs to know."""

    gpus: int = 0
    """GPUs (GCDs on LUMI) per node; the default ``--gpus-per-node``."""
    gpu_vendor: str = "none"
    """amd, nvidia or none: picks ROCR_ or CUDA_VISIBLE_DEVICES and the SMI tool."""
    gpu_name: str = ""
    """Human name, e.g. 'MI250X GCD'."""
    cores: int | None = None
    """Physical cores per node (None: unknown)."""
    threads_per_core: int = 1
    reserved_cores: tuple[int, ...] = ()
    """Cores SLURM never gives to jobs (LUMI's low-noise mode: first core of each CCD)."""
    memory_gb: int | None = None
    gpu_memory_gb: int | None = None

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise Invalid("gpus", f"{self.gpus} must be 0 or more")
        if self.gpu_vendor not in GPU_VENDORS:
            raise Invalid(
                "gpu_vendor", f"{self.gpu_vendor!r} is not one of {', '.join(GPU_VENDORS)}"
            )
        if self.threads_per_core < 1:
            raise Invalid("threads_per_core", f"{self.threads_per_core} must be at least 1")
        for key in ("cores", "memory_gb", "gpu_memory_gb"):
            value = getattr(self, key)
            if value is not None and value < 1:
                raise Invalid(key, f"{value} must be at least 1 (leave it out where unknown)")
        if self.reserved_cores and self.cores is None:
            raise Invalid("reserved_cores", "needs node.cores, the number of cores they belong to")
        bad = [core for core in self.reserved_cores if not 0 <= core < (self.cores or 0)]
        if bad:
            raise Invalid("reserved_cores", f"{bad} are not cores of a {self.cores}-core node")
        if self.cores is not None and len(set(self.reserved_cores)) >= self.cores:
            raise Invalid("reserved_cores", f"all {self.cores} cores are reserved: a job would get none")

    @property
    def usable_cores(self) -> int | None:
        """Cores a job can get: all cores minus the reserved ones."""
        return None if self.cores is None else self.cores - len(set(self.reserved_cores))


GDR_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
"""NCCL's (and RCCL's) names of how far a NIC may be from a GPU for GPU-direct RDMA."""


@dataclass(frozen=True, kw_only=True)
class NetworkSpec:
    """Which network interfaces carry collective traffic (read by scalerun.netconf)."""

    interfaces: tuple[str, ...] = ()
    """Interface names or shell patterns (``hsn*``); empty lets the library choose."""
    nic_gbits: float | None = None
    """Link speed of one of the node's high-speed NICs in Gb/s (Slingshot-11: 200); the
    doctor compares the measured bus bandwidth with it."""
    nics_per_node: int | None = None
    """High-speed NICs per node (LUMI-G: 4), shared by the node's ranks."""
    gdr_level: str | None = None
    """``NCCL_NET_GDR_LEVEL`` every rank gets (LOC, PIX, PXB, PHB or SYS); None: decided
    from the ROCm version where the rank runs (:mod:`scalerun.netconf.gpu_direct`)."""

    def __post_init__(self) -> None:
        if self.gdr_level is not None and self.gdr_level not in GDR_LEVELS:
            raise Invalid("gdr_level", f"{self.gdr_level!r} is not one of {', '.join(GDR_LEVELS)}")
        if self.nic_gbits is not None and not self.nic_gbits > 0:
            raise Invalid("nic_gbits", f"{self.nic_gbits} must be a positive number of Gb/s")
        if self.nics_per_node is not None and self.nics_per_node < 1:
            raise Invalid("nics_per_node", f"{self.nics_per_node} must be at least 1")

    def link_share_gbs(self, ranks_per_node: int) -> float | None:
        """GB/s of NIC bandwidth each rank of a node can use across nodes (bytes, not bits)."""
        if self.nic_gbits is None or ranks_per_node < 1:
            return None
        return self.nic_gbits / 8 * (self.nics_per_node or 1) / ranks_per_node


@dataclass(frozen=True, kw_only=True)
class ModulesSpec:
    """Environment modules loaded at the start of every job script."""

    use: tuple[str, ...] = ()
    """Folders added with ``module use``."""
    load: tuple[str, ...] = ()
    """Modules loaded with ``module load``, in order."""


@dataclass(frozen=True, kw_only=True)
class ContainerDefaults:
    """How ``--container IMAGE`` runs each task on this site."""

    runtime: str | None = None
    """singularity or apptainer when both or neither are on PATH at submit time."""
    mounts: tuple[str, ...] = ()
    """Host paths mounted into the container (``-B``), e.g. LUMI's Slingshot libraries."""
    python: str = "python"
    """The interpreter inside the container."""
    modules: ModulesSpec = field(default_factory=ModulesSpec)
    """Modules the site's containers need (loaded only when a container is used); when
    they load, they bind what the containers need and ``mounts`` is only their fallback."""
    enter: str = "exec"
    """``exec`` runs the command as given; ``run`` lets the image's runscript activate its
    environment first (LUMI's newer AI containers)."""
    activate: tuple[str, ...] = ()
    """Shell lines run inside the image before the command, e.g. ``$WITH_CONDA`` (LUMI's
    older AI containers, whose python is not the one with torch until it runs)."""
    images: dict[str, str] = field(default_factory=dict)
    """The site's own images by short name: ``--container NAME`` runs the image at the
    path, as the nodes see it (LUMI's ``/appl/local/containers/sif-images/...``)."""
    default_image: str | None = None
    """The name (in ``images``) of the image the site recommends: ``scalerun sites NAME``
    says so, and the doctor's fixes name it where the site's container is the cure."""

    def __post_init__(self) -> None:
        if self.enter not in ("exec", "run"):
            raise Invalid("enter", f"{self.enter!r} is not exec or run")
        if self.runtime is not None and self.runtime not in CONTAINER_RUNTIMES:
            raise Invalid(
                "runtime", f"{self.runtime!r} is not one of {', '.join(CONTAINER_RUNTIMES)}"
            )
        for index, mount in enumerate(self.mounts):
            if not mount or "," in mount:
                raise Invalid(
                    f"mounts[{index}]", f"{mount!r}: a mount is SRC[:DST[:OPTS]] without commas"
                )
        self._check_images()

    def _check_images(self) -> None:
        for name, path in self.images.items():
            if not IMAGE_NAME_RE.fullmatch(name):
                raise Invalid(f"images.{name}", "must be lower-case letters, digits, '.', '_' or '-'")
            if not path.startswith("/"):
                raise Invalid(f"images.{name}", f"{path!r} is not an absolute path (as the nodes see it)")
        if self.default_image is not None and self.default_image not in self.images:
            known = ", ".join(self.images) or "none"
            raise Invalid("default_image", f"{self.default_image!r} is not in images (known: {known})")

    @property
    def default_image_path(self) -> str | None:
        """The path of the site's recommended image, None where it names none."""
        return self.images[self.default_image] if self.default_image else None


@dataclass(frozen=True, kw_only=True)
class RuntimeDefaults:
    """What the ranks of every launch on this site get, local or SLURM (``[runtime]``)."""

    hang_timeout: int = 1800
    """Seconds without progress before every rank writes its stacks and the job ends
    (``--hang-timeout`` wins); 0: never. Longer than the slowest step, checkpoint save or
    evaluation pass that runs outside ``scalerun.wrap``'s model."""
    warm_cache: str = "~/.cache/scalerun/jit"
    """The persistent folder of the warm JIT-cache copies (:mod:`scalerun.netconf.warm_cache`):
    in the home or a project folder every node sees; ``~`` expands on the node; "" : none."""
    warm_cache_gb: float = 10.0
    """All warm copies together stay under this many GB (least recently used go first)."""

    def __post_init__(self) -> None:
        if self.hang_timeout < 0:
            raise Invalid("hang_timeout", f"{self.hang_timeout} must be 0 (never) or more seconds")
        if not self.warm_cache_gb > 0:
            raise Invalid("warm_cache_gb", f"{self.warm_cache_gb:g} must be more than 0 GB")


HOROVOD_GPUS = ("", "ROCM", "CUDA")
HOROVOD_GPU_OPERATIONS = ("NCCL", "MPI")


@dataclass(frozen=True, kw_only=True)
class HorovodBuild:
    """How ``scripts/install_horovod.sh --site NAME`` builds Horovod 0.28.1 here (``[horovod]``).

    Each key is a variable Horovod's CMake (or hipcc) reads; values may refer to the
    build shell's environment as ``${VAR}`` (``${ROCM_PATH}`` on LUMI). The default, no
    table, is the CPU build: gloo, no MPI, no GPU operations.
    """

    gpu: str = ""
    """``HOROVOD_GPU``: ROCM or CUDA; empty builds no GPU operations."""
    gpu_operations: str = "NCCL"
    """``HOROVOD_GPU_OPERATIONS`` (with a GPU): NCCL, which is RCCL on ROCm, or MPI."""
    mpi: bool = False
    """``HOROVOD_WITH_MPI=1`` (needs the site's MPI at build and launch), else
    ``HOROVOD_WITHOUT_MPI=1``. Gloo is always built: scalerun's rendezvous needs it."""
    rocm_home: str = ""
    """``HOROVOD_ROCM_HOME``: the ROCm that Horovod's FindROCM searches."""
    rccl_home: str = ""
    """``rccl_ROOT``: where ``find_package(rccl)`` finds RCCL's CMake package."""
    gpu_arch: str = ""
    """``HCC_AMDGPU_TARGET``: the GPU architecture hipcc compiles for (gfx90a: MI250X)."""
    env: dict[str, str] = field(default_factory=dict)
    """More build variables, as written (e.g. ``CMAKE_PREFIX_PATH`` of an MPI)."""

    def __post_init__(self) -> None:
        if self.gpu not in HOROVOD_GPUS:
            raise Invalid("gpu", f"{self.gpu!r} is not ROCM, CUDA or empty (CPU build)")
        if self.gpu_operations not in HOROVOD_GPU_OPERATIONS:
            raise Invalid("gpu_operations", f"{self.gpu_operations!r} is not NCCL or MPI")
        if self.gpu_operations == "MPI" and self.gpu and not self.mpi:
            raise Invalid("gpu_operations", "MPI GPU operations need mpi = true")
        for key, value in (("rocm_home", self.rocm_home), ("rccl_home", self.rccl_home),
                           ("gpu_arch", self.gpu_arch)):
            if value and self.gpu != "ROCM":
                raise Invalid(key, f"is for ROCm builds; set gpu = \"ROCM\" or remove {key}")
        check_env_names("env", self.env)


@dataclass(frozen=True, kw_only=True)
class SiteProfile:
    """One site: SLURM defaults, node facts, network, modules, container and environment."""

    name: str
    description: str = ""
    extends: str | None = None
    """Name of the profile this one refines (looked up in the folders below this file's)."""
    slurm: SlurmDefaults = field(default_factory=SlurmDefaults)
    node: NodeSpec = field(default_factory=NodeSpec)
    network: NetworkSpec = field(default_factory=NetworkSpec)
    modules: ModulesSpec = field(default_factory=ModulesSpec)
    container: ContainerDefaults = field(default_factory=ContainerDefaults)
    runtime: RuntimeDefaults = field(default_factory=RuntimeDefaults)
    horovod: HorovodBuild = field(default_factory=HorovodBuild)
    """How ``scripts/install_horovod.sh --site`` builds Horovod for this site."""
    env: dict[str, str] = field(default_factory=dict)
    """Exported by the job script unless already set; ``${VAR}`` refers to the job's environment."""
    task_env: dict[str, str] = field(default_factory=dict)
    """Set in every task unless already set; ``${SLURM_NODEID}`` etc. expand per task."""
    setup: tuple[str, ...] = ()
    """Shell commands run in the job script before the launch (trusted site text)."""
    source: str = ""
    """The file this profile was read from (filled in by the loader)."""

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[a-z0-9][a-z0-9._-]*", self.name):
            raise Invalid(
                "name", f"{self.name!r} must be lower-case letters, digits, '.', '_' or '-'"
            )
        check_env_names("env", self.env)
        check_env_names("task_env", self.task_env)
        cpus = self.slurm.cpus_per_gpu
        usable = self.node.usable_cores
        if cpus and self.node.gpus and usable is not None and cpus * self.node.gpus > usable:
            raise Invalid(
                "slurm.cpus_per_gpu",
                f"{cpus} x {self.node.gpus} GPUs is more than the {usable} usable cores of node",
            )


# --- typed construction from TOML tables ----------------------------------------------


def build(cls: type, table: dict[str, Any], *, file: Path | str, prefix: str = "") -> Any:
    """Make ``cls`` from a TOML table, checking keys and types; errors name file and key."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in fields(cls) if f.name != "source"}
    for key in table:
        if key not in known:
            raise SiteError(
                f"{file}: {prefix}{key}: unknown key (known: {', '.join(sorted(known))})"
            )
    values = {
        name: convert(hints[name], table[name], file=file, key=f"{prefix}{name}")
        for name in known
        if name in table
    }
    missing = [
        f.name
        for f in fields(cls)
        if f.name in known
        and f.name not in values
        and f.default is MISSING
        and f.default_factory is MISSING
    ]
    if missing:
        raise SiteError(f"{file}: {prefix}{missing[0]}: required key is missing")
    try:
        return cls(**values)
    except Invalid as error:
        raise SiteError(f"{file}: {prefix}{error.key}: {error}") from None


def convert(hint: Any, value: Any, *, file: Path | str, key: str) -> Any:
    """Check one value against its annotation; tuples and dicts are checked element-wise."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in args if arg is not type(None)]
        return convert(inner[0], value, file=file, key=key)
    if is_dataclass(hint):
        if not isinstance(value, dict):
            raise SiteError(f"{file}: {key}: expected a table [{key}], got {_kind(value)}")
        return build(hint, value, file=file, prefix=f"{key}.")
    if origin is tuple:
        if not isinstance(value, list):
            raise SiteError(f"{file}: {key}: expected a list, got {_kind(value)}")
        return tuple(
            convert(args[0], item, file=file, key=f"{key}[{i}]") for i, item in enumerate(value)
        )
    if origin is dict:
        if not isinstance(value, dict):
            raise SiteError(f"{file}: {key}: expected a table, got {_kind(value)}")
        return {
            name: convert(args[1], item, file=file, key=f"{key}.{name}")
            for name, item in value.items()
        }
    # bool is a subclass of int: `gpus = true` must not pass as 1.
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # `nic_gbits = 200` is a number of Gb/s as much as 200.0
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise SiteError(f"{file}: {key}: expected {hint.__name__}, got {_kind(value)} {value!r}")
    return value


def _kind(value: Any) -> str:
    return {
        dict: "a table",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)
