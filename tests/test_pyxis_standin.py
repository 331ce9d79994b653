"""The pyxis stand-in (.ci/pyxis-standin/) on the real local Slurm: Slurm loads the SPANK plugin, srun
takes pyxis's options, tasks see the container's mounts and workdir, and bad options fail the way
pyxis fails them, with one line naming the option. The enroot stand-in is tested without Slurm."""

import subprocess
import time
from pathlib import Path

import pytest
from conftest import REPO

ENROOT = REPO / ".ci" / "pyxis-standin" / "enroot"
IMAGE = "docker://nvcr.io#nvidia/pytorch:24.01-py3"
PYXIS_OPTIONS = [
    "container-image", "container-mounts", "container-workdir", "container-name", "container-save",
    "container-mount-home", "no-container-mount-home", "container-remap-root", "no-container-remap-root",
    "container-entrypoint", "no-container-entrypoint", "container-writable", "container-readonly",
    "container-env", "container-unshare",
]


def srun(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["srun", "--quit-on-interrupt", *args], capture_output=True, text=True, timeout=timeout)


def env_of(stdout: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in stdout.splitlines() if line.startswith("PYXIS_STANDIN"))


@pytest.mark.parametrize("option", PYXIS_OPTIONS)
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_srun_help_lists_every_pyxis_option(option):
    help_text = subprocess.run(["srun", "--help"], capture_output=True, text=True, timeout=30).stdout
    assert f"--{option}" in help_text


@pytest.fixture
def data_dir(tmp_path) -> Path:
    src = tmp_path / "host_data"
    src.mkdir()
    (src / "shard_0.txt").write_text("shard zero\n")
    return src


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_a_task_sees_its_mounts_workdir_and_what_it_got(tmp_path, data_dir):
    root = tmp_path / "container"  # stands for / inside the container
    data, workdir = root / "workspace" / "data_phase2", root / "workspace" / "bert"
    mounts = f"{data_dir}:{data}:ro,{tmp_path}:{tmp_path}"
    result = srun(
        "-N2", "--ntasks-per-node=1", f"--container-image={IMAGE}", f"--container-mounts={mounts}",
        f"--container-workdir={workdir}", "--no-container-mount-home", "--container-remap-root",
        "--container-env=NCCL_DEBUG,PATH",
        "bash", "-c", f'echo "pwd=$PWD $SLURMD_NODENAME"; cat {data}/shard_0.txt; env | sort; '
                      f'touch {data}/written 2>/dev/null && echo writable || echo read-only',
    )
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert out.count(f"pwd={workdir} ") == 2 and "node1" in out and "node2" in out
    assert out.count("shard zero") == 2  # the bind mount, on both nodes
    assert out.count("read-only") == 2 and not (data_dir / "written").exists()
    assert env_of(out) == {
        "PYXIS_STANDIN": "temporary", "PYXIS_STANDIN_IMAGE": IMAGE, "PYXIS_STANDIN_MOUNTS": mounts,
        "PYXIS_STANDIN_WORKDIR": str(workdir), "PYXIS_STANDIN_MOUNT_HOME": "0",
        "PYXIS_STANDIN_REMAP_ROOT": "1", "PYXIS_STANDIN_ENV": "NCCL_DEBUG,PATH",
    }
    # the mounts lived in the tasks' private namespaces: the host only kept the empty targets
    assert data.is_dir() and list(data.iterdir()) == []


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_without_container_options_a_task_gets_nothing():
    result = srun("-N1", "bash", "-c", "env; pwd")
    assert result.returncode == 0, result.stderr
    assert env_of(result.stdout) == {}


# (option value(s), the line expected on srun's stderr); the task would print RAN
BAD_OPTIONS = {
    "relative mount source": (
        [f"--container-image={IMAGE}", "--container-mounts=data:/workspace/data"],
        "pyxis: --container-mounts: source path must be absolute: data"),
    "relative mount destination": (
        [f"--container-image={IMAGE}", "--container-mounts=/tmp:workspace"],
        "pyxis: --container-mounts: destination path must be absolute: workspace"),
    "missing mount source": (
        [f"--container-image={IMAGE}", "--container-mounts=/no/such/bertctl/dir:/workspace/data"],
        "pyxis: --container-mounts: source path does not exist on node1: /no/such/bertctl/dir"),
    "mount without destination": (
        [f"--container-image={IMAGE}", "--container-mounts=/tmp:"],
        'pyxis: --container-mounts: malformed entry "/tmp:" (expected SRC:DST[:FLAGS])'),
    "empty mount entry": (
        [f"--container-image={IMAGE}", "--container-mounts=/tmp:/a,,/tmp:/b"],
        'pyxis: --container-mounts: malformed entry "" (expected SRC:DST[:FLAGS])'),
    "unknown mount flag": (
        [f"--container-image={IMAGE}", "--container-mounts=/tmp:/a:ro+sideways"],
        'pyxis: --container-mounts: unknown mount flag "sideways" in ro+sideways'),
    "repeated mounts option": (
        [f"--container-image={IMAGE}", "--container-mounts=/tmp:/a", "--container-mounts=/tmp:/b"],
        "pyxis: --container-mounts: specified multiple times"),
    "unknown container name": (
        ["--container-name=never_created"],
        'pyxis: --container-name: no container "never_created" on node1 in this job, and no --container-image to create it'),
    "missing squashfs": (
        ["--container-image=/no/such/image.sqsh"],
        "pyxis: --container-image: squashfs file does not exist on node1: /no/such/image.sqsh"),
    "not an image": (
        ["--container-image=docker://a b"],
        "pyxis: --container-image: not a docker image reference or a squashfs path: docker://a b"),
    "bad name flag": (
        [f"--container-image={IMAGE}", "--container-name=lm:sometimes"],
        "pyxis: --container-name: flag must be auto, create, exec or no_exec: lm:sometimes"),
    "writable and read-only": (
        [f"--container-image={IMAGE}", "--container-writable", "--container-readonly"],
        "pyxis: --container-writable: both the option and its opposite were given"),
    "relative workdir": (
        [f"--container-image={IMAGE}", "--container-workdir=bert"],
        "pyxis: --container-workdir: must be an absolute path: bert"),
}


@pytest.mark.parametrize("case", BAD_OPTIONS)
@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_a_bad_option_fails_the_step_with_one_line_naming_it(case):
    options, expected = BAD_OPTIONS[case]
    result = srun("-N1", "-w", "node1", *options, "echo", "RAN")
    assert result.returncode != 0
    assert "RAN" not in result.stdout
    assert sum(expected in line for line in result.stderr.splitlines()) == 1, result.stderr


def sbatch_wait(script: Path, out: Path, *args: str) -> tuple[int, str, int]:
    """Runs a batch script to its end: (exit code, its output, job id)."""
    proc = subprocess.run(["sbatch", "--parsable", "--wait", f"--output={out}", *args, str(script)],
                          capture_output=True, text=True, timeout=120, cwd=script.parent)
    return proc.returncode, out.read_text() if out.exists() else proc.stderr, int(proc.stdout.split(";")[0])


@pytest.mark.slurm
@pytest.mark.usefixtures("slurm")
def test_an_imported_image_makes_a_named_container_that_later_steps_reuse_on_its_nodes(tmp_path, data_dir):
    script = tmp_path / "job.sh"
    script.write_text(f"""#!/bin/bash
set -u
IMAGE_FILE=$PWD/${{SLURM_JOB_ID}}_lm.sqsh
srun -N1 -n1 enroot import --output "$IMAGE_FILE" '{IMAGE}' || exit 3
# created on node1 only: a name alone works there and nowhere else
srun -N1 -n1 -w node1 --container-image="$IMAGE_FILE" --container-name=lm true || exit 4
srun -N1 -n1 -w node1 --container-name=lm --container-mounts={data_dir}:/workspace/data_phase2 \\
  bash -c 'echo "step2 $SLURMD_NODENAME $PYXIS_STANDIN $PYXIS_STANDIN_NAME $PYXIS_STANDIN_IMAGE"; cat /workspace/data_phase2/shard_0.txt' || exit 5
srun -N2 -n2 --container-name=lm true && exit 6
# one step on every node with the image makes it everywhere; then the name alone works on both
srun -N2 -n2 --container-image="$IMAGE_FILE" --container-name=lm true || exit 7
srun -N2 -n2 --container-name=lm bash -c 'echo "step4 $SLURMD_NODENAME $PYXIS_STANDIN"' || exit 8
srun -N1 -n1 -w node1 --container-name=lm:create --container-image="$IMAGE_FILE" true && exit 9
echo done
""")
    code, output, job_id = sbatch_wait(script, tmp_path / "job.out", "-N2", "--ntasks-per-node=1")
    assert code == 0, output
    image_file = tmp_path / f"{job_id}_lm.sqsh"
    assert image_file.read_text().startswith("bertctl enroot stand-in")
    assert f"step2 node1 reused lm {image_file}\nshard zero\n" in output
    assert 'pyxis: --container-name: no container "lm" on node2 in this job' in output
    assert sorted(line for line in output.splitlines() if line.startswith("step4")) == [
        "step4 node1 reused", "step4 node2 reused"]
    assert 'pyxis: --container-name: "lm" already exists on node1 (flag create)' in output
    assert output.rstrip().endswith("done")
    # the job's epilog removed its containers from the nodes' registry
    registry = Path("/var/spool/bertctl-slurm/pyxis") / str(job_id)
    for _ in range(100):
        if not registry.exists():
            break
        time.sleep(0.1)
    assert not registry.exists()

    # named containers belong to their job: a later job starts without them
    again = tmp_path / "again.sh"
    again.write_text("#!/bin/bash\nsrun --container-name=lm true\n")
    code, output, _ = sbatch_wait(again, tmp_path / "again.out", "-N1", "-w", "node1")
    assert code != 0
    assert 'pyxis: --container-name: no container "lm" on node1 in this job' in output


# ---- the enroot stand-in (no Slurm needed)

def enroot(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", str(ENROOT), *args], capture_output=True, text=True, cwd=cwd, timeout=30)


def test_enroot_import_writes_a_marker_image_where_asked_or_named_like_enroot(tmp_path):
    assert enroot("import", "--output", "x.sqsh", IMAGE, cwd=tmp_path).returncode == 0
    assert (tmp_path / "x.sqsh").read_text() == f"bertctl enroot stand-in: a marker, not a squashfs image\nuri: {IMAGE}\n"
    assert enroot("import", IMAGE, cwd=tmp_path).returncode == 0
    assert (tmp_path / "nvidia+pytorch+24.01-py3.sqsh").exists()
    again = enroot("import", "-o", "x.sqsh", IMAGE, cwd=tmp_path)
    assert again.returncode == 1 and "file already exists: x.sqsh" in again.stderr


@pytest.mark.parametrize("args, message", [
    (["start", "lm"], "only 'import' is emulated (asked: start)"),
    (["import", "nvcr.io/nvidia/pytorch:24.01-py3"], "not an image URI: nvcr.io/nvidia/pytorch:24.01-py3"),
    (["import", "--output"], "--output needs a file"),
    (["import", "--arch", "arm64", IMAGE], "option --arch is not emulated"),
])
def test_enroot_other_uses_fail_saying_it_is_a_stand_in(tmp_path, args, message):
    result = enroot(*args, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr.startswith("enroot (bertctl stand-in): ") and result.stderr.count("\n") == 1
    assert message in result.stderr
    assert list(tmp_path.iterdir()) == []
