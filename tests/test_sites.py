"""Site profiles: the shipped facts, the search folders, ``extends``, and broken files."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scalerun.cli import main
from scalerun.errors import SiteError
from scalerun.sites import Folder, find_sites, load_site, site_folders

SHIPPED = Path(__file__).resolve().parents[1] / "src" / "scalerun" / "sites"

LUMI_FACTS = [
    # attribute path, value (docs.lumi-supercomputer.eu and the course job scripts)
    ("slurm.partition", "standard-g"),
    ("slurm.partitions", ("standard-g", "small-g", "dev-g")),
    ("slurm.mem_per_gpu", "60G"),
    ("slurm.cpus_per_gpu", 7),
    ("node.gpus", 8),
    ("node.gpu_vendor", "amd"),
    ("node.usable_cores", 56),
    ("node.reserved_cores", (0, 8, 16, 24, 32, 40, 48, 56)),
    ("network.interfaces", ("hsn0", "hsn1", "hsn2", "hsn3")),
    ("container.runtime", "singularity"),
    ("container.activate", ("$WITH_CONDA",)),  # the course's AI containers
    ("container.modules.load", ("singularity-AI-bindings",)),
    ("network.nic_gbits", 200.0),  # Slingshot-11
    ("network.nics_per_node", 4),
    ("slurm.gpu_binding_safe", False),  # "breaks communication with RCCL" (course text 003:26)
    ("env", {"CXX": "g++-12"}),  # DeepSpeed's JIT builds inside the containers (course)
    (
        "task_env",
        {
            "MIOPEN_USER_DB_PATH": "/tmp/${USER}-miopen-cache-${SLURM_NODEID}",
            "MIOPEN_CUSTOM_CACHE_DIR": "/tmp/${USER}-miopen-cache-${SLURM_NODEID}",
        },
    ),
]


LUMI_C_FACTS = [
    # attribute path, value (docs.lumi-supercomputer.eu: hardware/lumic.md, partitions.md,
    # distribution-binding.md; the profile's comments name the pages)
    ("slurm.partition", "standard"),
    ("slurm.partitions", ("standard", "small", "debug")),
    ("slurm.cpus_per_gpu", None),  # no GPU: each task asks for its share of the cores
    ("node.gpus", 0),
    ("node.gpu_vendor", "none"),
    ("node.cores", 128),
    ("node.threads_per_core", 2),
    ("node.usable_cores", 128),  # no low-noise mode on LUMI-C
    ("node.memory_gb", 256),
    ("network.interfaces", ("hsn0",)),
    ("network.nic_gbits", 200.0),
    ("network.nics_per_node", 1),
    ("container.images", {}),
    ("task_env", {}),
]


@pytest.mark.parametrize(("path", "value"), LUMI_C_FACTS)
def test_lumi_c_profile(path, value):
    assert attribute(load_site("lumi-c"), path) == value


def attribute(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize(("path", "value"), LUMI_FACTS)
def test_lumi_g_profile(path, value):
    assert attribute(load_site("lumi-g"), path) == value


def test_link_share_per_rank_from_the_stated_nics():
    """LUMI-G: 4 x 200 Gb/s for 8 GCDs is 12.5 GB/s each; the NVIDIA profile 50 GB/s per GPU."""
    assert load_site("lumi-g").network.link_share_gbs(8) == pytest.approx(12.5)
    assert load_site("lumi-g").network.link_share_gbs(2) == pytest.approx(50.0)
    assert load_site("nvidia").network.link_share_gbs(8) == pytest.approx(50.0)
    assert load_site("local").network.link_share_gbs(2) is None  # states no NICs: no share


def test_lumi_g_mounts_the_slingshot_libraries():
    binds = load_site("lumi-g").container.mounts
    assert {"/var/spool/slurmd", "/opt/cray", "/usr/lib64/libcxi.so.1"} <= set(binds)


@pytest.mark.parametrize("name", ["lumi-g", "lumi-c", "nvidia", "local"])
def test_shipped_profiles_load_and_name_their_file(name):
    profile = load_site(name)
    assert profile.name == name and profile.source == str(SHIPPED / f"{name}.toml")


GPU_BINDING = [
    # (profile text, SLURM's GPU binding safe there) - a site without the key: not safe
    ("", False),
    ("[slurm]\ngpu_binding_safe = true\n", True),
    ("extends = 'lumi-g'\n", False),
    ("extends = 'nvidia'\n", False),  # NCCL loses NVLink too (NVIDIA/nccl#1066)
    ("extends = 'local'\n", False),
    ("extends = 'nvidia'\n[slurm]\ngpu_binding_safe = true\n", True),
]


@pytest.mark.parametrize(("text", "safe"), GPU_BINDING)
def test_whether_slurms_gpu_binding_is_safe(tmp_path, text, safe):
    found = folders(tmp_path)
    write(found[1].path, "site", text)
    assert load_site("site", found).slurm.gpu_binding_safe is safe


def folders(tmp_path: Path) -> list[Folder]:
    project, user = tmp_path / "project", tmp_path / "user"
    project.mkdir(exist_ok=True)
    user.mkdir(exist_ok=True)
    return [Folder("project", project), Folder("user", user), Folder("shipped", SHIPPED)]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.toml"
    path.write_text(text)
    return path


def test_search_order_project_then_user_then_shipped(tmp_path):
    found = folders(tmp_path)
    write(found[1].path, "lumi-g", 'extends = "lumi-g"\n[slurm]\naccount = "project_user"\n')
    write(found[0].path, "lumi-g", 'extends = "lumi-g"\n[slurm]\npartition = "small-g"\n')
    profile = load_site("lumi-g", found)
    # project refines user, which refines shipped: every layer's change is kept
    assert (profile.slurm.partition, profile.slurm.account, profile.slurm.cpus_per_gpu) == (
        "small-g",
        "project_user",
        7,
    )
    assert profile.source == str(found[0].path / "lumi-g.toml")
    assert [(e.name, e.label) for e in find_sites(found) if e.name == "lumi-g"] == [
        ("lumi-g", "project"),
        ("lumi-g", "user"),
        ("lumi-g", "shipped"),
    ]


def test_a_user_profile_of_its_own(tmp_path):
    found = folders(tmp_path)
    write(
        found[1].path,
        "mycluster",
        'extends = "nvidia"\n[slurm]\npartition = "gpu"\n[node]\ngpus = 4\n',
    )
    profile = load_site("mycluster", found)
    assert (profile.name, profile.slurm.partition, profile.node.gpus, profile.node.gpu_vendor) == (
        "mycluster",
        "gpu",
        4,
        "nvidia",
    )


def test_default_folders(tmp_path):
    labels = site_folders(cwd=tmp_path, environ={"HOME": "/home/ann"})
    assert [(f.label, f.path) for f in labels] == [
        ("project", tmp_path / ".scalerun" / "sites"),
        ("user", Path("/home/ann/.config/scalerun/sites")),
        ("shipped", SHIPPED),
    ]
    assert site_folders(cwd=tmp_path, environ={"XDG_CONFIG_HOME": "/x"})[1].path == Path(
        "/x/scalerun/sites"
    )


BROKEN = [
    # profile text, what the one-line error must say after "<file>: "
    ("[slurm]\npartiton = 'x'\n", "slurm.partiton: unknown key"),
    ("[node]\ngpus = 'eight'\n", "node.gpus: expected int, got a string 'eight'"),
    ("[node]\ngpus = true\n", "node.gpus: expected int, got a boolean True"),
    ("[node]\ngpus = -1\n", "node.gpus: -1 must be 0 or more"),
    ("[node]\ngpu_vendor = 'intel'\n", "node.gpu_vendor: 'intel' is not one of amd, nvidia, none"),
    ("[node]\ncores = 8\nreserved_cores = [0, 8]\n", "node.reserved_cores: [8] are not cores"),
    ("[slurm]\ntime = '1h'\n", "slurm.time: '1h' is not a SLURM time"),
    ("[network]\ngdr_level = 'FAST'\n", "network.gdr_level: 'FAST' is not one of LOC, PIX, PXB, PHB, SYS"),
    ("[slurm]\nmem_per_gpu = '60 GB'\n", "slurm.mem_per_gpu: '60 GB' is not a SLURM memory size"),
    (
        "[slurm]\npartition = 'big'\npartitions = ['small']\n",
        "slurm.partition: 'big' is not in partitions",
    ),
    (
        "[slurm]\ncpus_per_gpu = 8\n[node]\ngpus = 8\ncores = 56\n",
        "slurm.cpus_per_gpu: 8 x 8 GPUs is more than the 56",
    ),
    ("[slurm]\nsbatch_args = '--x'\n", "slurm.sbatch_args: expected a list, got a string"),
    ("[slurm]\ngpu_binding_safe = 'no'\n", "slurm.gpu_binding_safe: expected bool, got a string 'no'"),
    ("[slurm]\ngpu_binding_safe = 0\n", "slurm.gpu_binding_safe: expected bool, got an integer 0"),
    ("[slurm]\ngpu_bind_safe = true\n", "slurm.gpu_bind_safe: unknown key (known: "),
    ("gpu_binding_safe = false\n", "gpu_binding_safe: unknown key"),  # it lives in [slurm]
    ("[slurm]\nsbatch_args = ['-C x']\n", "slurm.sbatch_args[0]: '-C x' is not a long option"),
    ("[node]\nreserved_cores = [0]\n", "node.reserved_cores: needs node.cores"),
    ("[node]\ncores = -4\n", "node.cores: -4 must be at least 1 (leave it out where unknown)"),
    ("[node]\ncores = 0\n", "node.cores: 0 must be at least 1"),
    ("[node]\nmemory_gb = -512\n", "node.memory_gb: -512 must be at least 1"),
    ("[node]\ngpu_memory_gb = 0\n", "node.gpu_memory_gb: 0 must be at least 1"),
    ("[node]\ncores = 2\nreserved_cores = [0, 1]\n", "node.reserved_cores: all 2 cores are reserved"),
    ("[env]\n'1BAD' = 'x'\n", "env.1BAD: is not a valid environment variable name"),
    ("[env]\nX = 1\n", "env.X: expected str, got an integer 1"),
    ("[container]\nmounts = ['/a,/b']\n", "container.mounts[0]: '/a,/b': a mount is SRC[:DST[:OPTS]]"),
    (
        "[container]\nruntime = 'docker'\n",
        "container.runtime: 'docker' is not one of singularity, apptainer",
    ),
    ("[container.images]\nPyTorch = '/a.sif'\n", "container.images.PyTorch: must be lower-case"),
    ("[container.images]\npytorch = 'a.sif'\n", "container.images.pytorch: 'a.sif' is not an absolute path"),
    ("[container]\ndefault_image = 'pytorch'\n", "container.default_image: 'pytorch' is not in images (known: none)"),
    ("[container]\ndefault_image = 'x'\n[container.images]\npytorch = '/a.sif'\n",
     "container.default_image: 'x' is not in images (known: pytorch)"),
    ("slurm = 3\n", "slurm: expected a table [slurm], got an integer"),
    ("name = 'other'\n", "name: 'other' differs from the file name 'broken'"),
    ("extends = 'nowhere'\n", "extends: no site profile 'nowhere'"),
    ("[slurm\n", "not valid TOML"),
]


@pytest.mark.parametrize(("text", "message"), BROKEN)
def test_a_broken_profile_names_file_key_and_problem(tmp_path, text, message):
    found = folders(tmp_path)
    path = write(found[1].path, "broken", text)
    with pytest.raises(SiteError) as caught:
        load_site("broken", found)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_extends_looks_only_below_so_it_cannot_loop(tmp_path):
    found = folders(tmp_path)
    write(found[0].path, "a", 'extends = "b"\n')
    write(found[1].path, "b", 'extends = "a"\n')
    with pytest.raises(SiteError, match="extends: no site profile 'a'"):
        load_site("a", found)


def test_unknown_name_lists_the_known_ones(tmp_path):
    with pytest.raises(SiteError, match="no site profile 'lumi' in .*known: local, lumi-c, lumi-g, nvidia"):
        load_site("lumi", folders(tmp_path))


def test_sites_command_lists_and_shows(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    write_to = tmp_path / ".scalerun" / "sites"
    write_to.mkdir(parents=True)
    write(write_to, "local", 'extends = "local"\ndescription = "my laptop"\n')
    assert main(["sites"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines[1:]] == [
        ["local", "project"],
        ["local", "shipped"],
        ["lumi-c", "shipped"],
        ["lumi-g", "shipped"],
        ["nvidia", "shipped"],
    ]
    assert "my laptop" in lines[1] and "hidden by the one above" in lines[2]
    assert main(["sites", "show", "lumi-g"]) == 0
    shown = capsys.readouterr().out
    assert 'partition = "standard-g"' in shown and "[task_env]" in shown
    assert main(["sites", "show", "lumi-g", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["slurm"]["cpus_per_gpu"] == 7


def test_sites_command_reports_a_broken_profile_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".scalerun" / "sites").mkdir(parents=True)
    write(tmp_path / ".scalerun" / "sites", "x", "[node]\ngpus = 'many'\n")
    assert main(["sites", "show", "x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "x.toml: node.gpus: expected int" in err


def test_lumi_g_jobs_build_with_the_courses_compiler(tmp_path):
    """The profile's ``CXX`` reaches the job script, and a job run by bash exports it unless
    the submitting shell chose another compiler (DeepSpeed's JIT builds read it)."""
    from scalerun.launch.slurm.render import render_sbatch
    from tests.launch.requests import request, slurm_job

    given = request(script="train.py", run_dir=tmp_path, site="lumi-g", nodes=2,
                    account="project_1", check=False)
    text = render_sbatch(slurm_job(given, load_site("lumi-g")))
    line = next(line for line in text.splitlines() if "CXX" in line)
    def exported(environ: dict[str, str]) -> str:
        return subprocess.run(["bash", "-c", f"{line}\nprintf %s \"$CXX\""], env=environ,
                              capture_output=True, text=True, check=True).stdout

    assert exported({"PATH": "/usr/bin:/bin"}) == "g++-12"
    assert exported({"PATH": "/usr/bin:/bin", "CXX": "clang++"}) == "clang++"


def lumi_g_container_script(tmp_path: Path) -> str:
    """The job script ``scalerun launch --site lumi-g --container IMAGE`` writes (real
    planner, real renderer)."""
    from scalerun.launch.slurm.render import render_sbatch
    from tests.launch.requests import request, slurm_job

    given = request(script="train.py", run_dir=tmp_path, site="lumi-g", nodes=2, account="project_1",
                    check=False, container="/appl/local/containers/pytorch.sif")
    return render_sbatch(slurm_job(given, load_site("lumi-g")))


def test_lumi_g_job_script_asks_for_what_the_profile_says(tmp_path):
    """The lumi-g facts at work: the job's resources, its image entry and its per-node caches."""
    text = lumi_g_container_script(tmp_path)
    for directive in ("--partition=standard-g", "--cpus-per-task=7", "--gpus-per-node=8",
                      "--mem-per-gpu=60G", "--ntasks-per-node=8"):
        assert f"#SBATCH {directive}\n" in text
    assert "singularity exec " in text and "'$WITH_CONDA && exec \"$@\"'" in text
    assert "--env 'MIOPEN_USER_DB_PATH=/tmp/${USER}-miopen-cache-${SLURM_NODEID}'" in text


@pytest.mark.parametrize(("module_found", "before", "bound"), [
    (False, None, "/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1"),
    (False, "/data", "/data,/var/spool/slurmd,/opt/cray,/usr/lib64/libcxi.so.1"),  # the user's first
    (True, None, None),  # the module binds what this system's images need
])
def test_lumi_g_jobs_bind_the_slingshot_libraries(tmp_path, module_found, before, bound):
    """The job script's bindings block, run by bash with a stand-in ``module``: without
    LUMI's singularity-AI-bindings module the job binds the Slingshot libraries itself."""
    text = lumi_g_container_script(tmp_path)
    lines = text.split("# --- container bindings", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    stand_in = f"module() {{ [[ $1 == use ]] || {'true' if module_found else 'false'}; }}"
    environ = {"PATH": "/usr/bin:/bin", **({"SINGULARITY_BIND": before} if before else {})}
    done = subprocess.run(["bash", "-c", "\n".join([stand_in, *lines, 'printf %s "${SINGULARITY_BIND-unset}"'])],
                          env=environ, capture_output=True, text=True, check=True)
    if bound is None:
        assert done.stdout == "unset" and done.stderr == ""
    else:
        assert done.stdout.startswith(bound + ",")
        assert done.stderr == "scalerun: module singularity-AI-bindings is missing: binding the site mounts instead\n"


# --- LUMI-C: a job of CPU ranks --------------------------------------------------------------

PROBE = str(Path(__file__).resolve().parent / "fixtures" / "slurm" / "probe.py")

LUMI_C_JOBS = [
    # jobscript flags, the #SBATCH lines they give on lumi-c
    (["--nodes", "2", "--ntasks-per-node", "8"],
     ["--partition=standard", "--nodes=2", "--ntasks-per-node=8", "--cpus-per-task=16"]),  # a NUMA node each
    (["--ntasks-per-node", "16"], ["--ntasks-per-node=16", "--cpus-per-task=8"]),  # a CCD each (LUMI's example)
    (["--ntasks-per-node", "128"], ["--ntasks-per-node=128", "--cpus-per-task=1"]),
    ([], ["--ntasks-per-node=1", "--cpus-per-task=128"]),  # one rank: the whole node
    (["--ntasks-per-node", "8", "--hyperthreads"], ["--cpus-per-task=32", "--hint=multithread"]),
    (["--mode", "torchrun", "--nodes", "2"], ["--ntasks-per-node=1", "--cpus-per-task=128"]),
    (["--ntasks-per-node", "8", "--partition", "small", "--cpus-per-task", "4"],
     ["--partition=small", "--cpus-per-task=4"]),  # the flags win
]


@pytest.mark.parametrize(("flags", "directives"), LUMI_C_JOBS)
def test_lumi_c_job_script_asks_for_cores_not_gpus(tmp_path, capsys, flags, directives):
    """``scalerun jobscript --site lumi-c``: the partition, a share of the 128 cores per task,
    the ranks' masks planned on the node, and nothing of GPUs."""
    assert main(["jobscript", "--site", "lumi-c", "--run-dir", str(tmp_path), *flags, PROBE]) == 0
    text = (tmp_path / "job.sbatch").read_text()
    for directive in directives:
        assert f"#SBATCH {directive}\n" in text
    if "torchrun" not in flags:  # srun binds each task with the masks planned on the first node
        assert "CPU_BIND=$(" in text and "scalerun exec --srun-cpu-bind" in text
    for gpu_word in ("--gpus", "--mem-per-gpu", "--gpu-bind", "VISIBLE_DEVICES", "MIOPEN"):
        assert gpu_word not in text


# --- the site's images: --container NAME ------------------------------------------------------

AMD_IMAGES = "/appl/local/containers/sif-images/"


def test_lumi_g_names_the_images_amd_and_csc_provide():
    box = load_site("lumi-g").container
    assert box.default_image == "pytorch"
    assert box.default_image_path == AMD_IMAGES + "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"
    assert all(path.startswith(AMD_IMAGES + "lumi-pytorch-rocm-") for name, path in box.images.items()
               if name.startswith("pytorch"))
    assert box.images["csc-pytorch"].startswith("/appl/local/csc/")
    assert load_site("local").container.default_image_path is None


def test_a_user_profile_adds_its_own_images_to_the_sites(tmp_path):
    found = folders(tmp_path)
    write(found[1].path, "lumi-g", 'extends = "lumi-g"\n[container]\ndefault_image = "mine"\n'
          '[container.images]\nmine = "/project/p/mine.sif"\n')
    box = load_site("lumi-g", found).container
    assert box.default_image_path == "/project/p/mine.sif" and "pytorch" in box.images


RESOLVED = [
    # --container value, site, paths that exist here, the image the job runs
    ("pytorch", "lumi-g", (), AMD_IMAGES + "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"),
    ("pytorch-2.6.0", "lumi-g", (), AMD_IMAGES + "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.6.0.sif"),
    ("/scratch/p/own.sif", "lumi-g", (), "/scratch/p/own.sif"),  # a path: as given, here or not
    ("own.sif", "local", (), "own.sif"),
    ("docker://rocm/pytorch:latest", "lumi-g", (), "docker://rocm/pytorch:latest"),
    ("sandbox", "lumi-g", ("sandbox",), "sandbox"),  # a folder here that looks like a name
]


@pytest.mark.parametrize(("value", "site", "here", "image"), RESOLVED)
def test_container_takes_a_site_image_name_or_a_path(value, site, here, image):
    from scalerun.sites.images import resolve_image

    assert resolve_image(value, load_site(site), exists=lambda path: path in here) == image


UNKNOWN = [
    ("pytroch", "lumi-g", "--container 'pytroch' is neither an image of site lumi-g (pytorch, pytorch-2.7.0, "
                          "pytorch-2.6.0, pytorch-2.5.1, csc-pytorch) nor an image file here"),
    ("pytorch", "local", "--container 'pytorch': site local names no images ([container.images])"),
]


@pytest.mark.parametrize(("value", "site", "message"), UNKNOWN)
def test_an_unknown_image_name_is_one_line_with_the_names(value, site, message):
    from scalerun.errors import LaunchError
    from scalerun.sites.images import resolve_image

    with pytest.raises(LaunchError) as caught:
        resolve_image(value, load_site(site), exists=lambda path: False)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_launch_runs_the_named_image(tmp_path, capsys):
    """Through the CLI: the job script runs the site's image; a mistyped name ends the
    command in one line before anything is written."""
    assert main(["jobscript", "--site", "lumi-g", "--account", "p", "--container", "pytorch",
                 "--run-dir", str(tmp_path), PROBE]) == 0
    assert f" {AMD_IMAGES}lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif " in (
        tmp_path / "job.sbatch").read_text()
    capsys.readouterr()
    assert main(["launch", "--site", "lumi-g", "--container", "pytorch3", "--dry-run",
                 "--run-dir", str(tmp_path / "b"), PROBE]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "neither an image of site lumi-g (pytorch, " in err


def test_sites_name_shows_the_images_and_the_default(capsys):
    assert main(["sites", "lumi-g"]) == 0
    shown = capsys.readouterr().out.splitlines()
    start = shown.index("# images (--container NAME):")
    first = shown[start + 1].split()
    assert first[:3] == ["#", "pytorch", AMD_IMAGES + "lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif"]
    assert "(default: the site's recommended image)" in shown[start + 1]
    assert [line.split()[1] for line in shown[start + 2:start + 6]] == [
        "pytorch-2.7.0", "pytorch-2.6.0", "pytorch-2.5.1", "csc-pytorch"]
    assert 'default_image = "pytorch"' in shown and "[container.images]" in shown
    assert main(["sites", "show", "lumi-c"]) == 0
    assert "# images" not in capsys.readouterr().out  # a site without images says nothing of them


def test_sites_with_a_name_and_another_word_is_one_line(capsys):
    assert main(["sites", "lumi-g", "lumi-c"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "give list, show NAME, or NAME alone" in err
