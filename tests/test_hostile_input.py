"""Hostile and broken input, as a hostile-but-realistic user would give it: config files and `-o`
overrides that end in exit 0 or one line and exit 2, never a hang or a traceback, and nothing
written when they fail."""

import copy
import time

import pytest
import yaml
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config.clusters import ClusterConfig, cluster_files, load_cluster
from orchestrator.config.configfile import schema_keys

SHIPPED = {name: yaml.safe_load(path.read_text()) for name, path in cluster_files().items()}
KEYS = schema_keys(ClusterConfig)

HOSTILE_TEXT = ["", " ", "a\nb", "$(touch PWNED)", "`id`", "'; rm -rf / #", '"', "\\", "x" * 5000, "\ud800",
                "null", "~", "1e309", "-0", "0x1F", "[1, 2", "{a: 1}", "*alias", "&anchor x", "!!python/object:os.system",
                "#comment", "a: b", "é ü 中文", "\t", "\x00", "\x7f", "..", "/", "C:\\x", "99:99:99", "0:00:00"]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(HOSTILE_TEXT), st.text(max_size=30), st.integers(), st.integers(min_value=10**20, max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


def check_outcome(result, elapsed: float, home) -> None:
    """Exit 0, or exactly one `bertctl: error:` line and exit 2; within 10 s; nothing written on failure."""
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert "Traceback" not in result.err
    if result.code == 0:
        return
    assert result.code == 2, result.err[-2000:]
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertctl: error: "), result.err[-2000:]
    assert not home.exists() or not any(home.rglob("*")), "a failed command wrote files"


def paths_in(tree, prefix=()):
    for key, value in tree.items():
        yield prefix + (key,)
        if isinstance(value, dict):
            yield from paths_in(value, prefix + (key,))


@st.composite
def hostile_files(draw):
    """A shipped cluster file with one to three values replaced, keys added or removed, or its text mangled."""
    doc = copy.deepcopy(draw(st.sampled_from(sorted(SHIPPED.values(), key=lambda d: d["name"]))))
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(list(paths_in(doc))))
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(HOSTILE_VALUES)
        elif action == "delete":
            parent.pop(path[-1], None)
        else:
            parent[draw(st.text(min_size=1, max_size=8))] = draw(HOSTILE_VALUES)
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except yaml.YAMLError:
        text = "name: x\n"
    mangle = draw(st.sampled_from(["none", "none", "duplicate", "alias_bomb", "deep", "truncate", "tab"]))
    if mangle == "duplicate":
        text += "executor: slurm\n"
    elif mangle == "alias_bomb":
        text += "".join(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9) if i else 'lol'}]\n" for i in range(9))
    elif mangle == "deep":
        text += "deep: " + "[" * 500 + "]" * 500 + "\n"
    elif mangle == "truncate":
        text = text[: draw(st.integers(0, max(len(text) - 1, 0)))]
    elif mangle == "tab":
        text = text.replace("  ", "\t", 1)
    return text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(text=hostile_files())
def test_fuzzed_cluster_files_end_in_exit_0_or_one_line(tmp_path, bertctl_home, text):
    path = tmp_path / "fuzzed.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    started = time.perf_counter()
    result = run_cli("render", "--cluster", str(path))
    check_outcome(result, time.perf_counter() - started, bertctl_home)


@st.composite
def hostile_overrides(draw):
    key = draw(st.one_of(st.sampled_from(KEYS), st.sampled_from(KEYS).map(lambda k: k + "x"), st.text(max_size=12)))
    value = draw(st.one_of(st.sampled_from(HOSTILE_TEXT), st.text(max_size=20), st.integers().map(str),
                           st.just("1" * 5000), st.just("[" * 300), st.just("&a [*a]")))
    return f"{key}={value}"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(cluster=st.sampled_from(sorted(SHIPPED)), overrides=st.lists(hostile_overrides(), min_size=1, max_size=3))
def test_fuzzed_overrides_end_in_exit_0_or_one_line(bertctl_home, cluster, overrides):
    started = time.perf_counter()
    result = run_cli("render", "--cluster", cluster, *[w for o in overrides for w in ("-o", o)])
    check_outcome(result, time.perf_counter() - started, bertctl_home)


# ---- each class of defect the probing found, by name

def render_file(tmp_path, text: str):
    path = tmp_path / "c.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return run_cli("render", "--cluster", str(path))


BILLION_LAUGHS = "a: &a [lol, lol]\n" + "".join(f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                                                 for p, c in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text,message", [
    (BILLION_LAUGHS, "line 2: aliases (*a) are not accepted"),
    ("a: &a [*a]\n", "line 1: aliases (*a) are not accepted"),
    ("a: " + "[" * 2000 + "]" * 2000 + "\n", "nested more than 32 levels deep"),
    ("name: x\nname: y\n", "line 2: duplicate key 'name' (first on line 1)"),
    ('name: "\\ud800"\n', "name: not valid Unicode text"),
    ("name: x\nresources: {nodes: " + "9" * 5000 + "}\n", "unreadable value: Exceeds the limit"),
])
def test_yaml_that_would_hang_or_crash_is_refused_with_its_line(tmp_path, text, message):
    started = time.perf_counter()
    result = render_file(tmp_path, text)
    assert time.perf_counter() - started < 5
    assert result.code == 2 and message in result.err and len(result.err.strip().splitlines()) == 1, result.err


def test_a_duplicate_key_in_a_copied_cluster_file_is_refused(tmp_path):
    text = load_cluster("local").path.read_text() + "executor: slurm\n"
    result = render_file(tmp_path, text)
    assert result.code == 2 and "duplicate key 'executor' (first on line" in result.err


@pytest.mark.parametrize("override,message", [
    ("run.optim.lr=.inf", "run.optim.lr: Input should be a finite number"),
    ("run.optim.lr=nan", "run.optim.lr: Input should be a finite number"),
    ("slurm.time_limit=99:99:99", "slurm.time_limit: must be a positive time"),
    ("slurm.time_limit=1-25:00:00", "slurm.time_limit: must be a positive time"),
    ("resources.nodes=true", "resources.nodes: expected a number, got true"),
    ("run.train.batch_size=" + "9" * 40, "run.train.batch_size: 99999999999999999999... is far too large"),
    ("run.optim.lr=[1", "invalid YAML"),
    ("run.model=&a [*a]", "aliases (*a) are not accepted"),
])
def test_invalid_values_are_refused(override, message):
    result = run_cli("render", "--cluster", "ci_slurm", "-o", override)
    assert result.code == 2 and message in result.err, result.err


@pytest.mark.parametrize("override,line", [
    ("slurm.mem=0", "#SBATCH --mem=0"),
    ("slurm.time_limit=1:15:00", "#SBATCH --time=1:15:00"),
    ("node.env.OMP_NUM_THREADS=1", "export OMP_NUM_THREADS=1"),
    ("run.data.train_dir=/data/my dir #1", "train_dir: '/data/my dir #1'"),
    ("slurm.partition=null", None),
])
def test_overrides_take_the_type_of_their_key(override, line):
    result = run_cli("render", "--cluster", "ci_slurm", "-o", override)
    assert result.code == 0, result.err
    if line:
        assert line in result.out
    else:
        assert "--partition" not in result.out


@pytest.mark.parametrize("name", ["1" * 5000, "../clusters/local", "sample\n"])
def test_a_dataset_name_is_looked_up_among_the_manifests_not_on_the_disk(name):
    """The fuzzer's find: a 5,000-character name made the manifest lookup raise ENAMETOOLONG."""
    result = run_cli("render", "--cluster", "ci_slurm", "-o", f"prepare.dataset={name}")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "prepare.dataset: no dataset manifest named" in result.err
    assert run_cli("render", "--cluster", "ci_slurm", "-o", "prepare.dataset=sample").code == 0


def test_a_cluster_path_too_long_for_the_file_system_is_one_line():
    result = run_cli("render", "--cluster", "/" + "c" * 300 + ".yaml")
    assert result.code == 2 and len(result.err.strip().splitlines()) == 1, result.err
    assert "cluster file cannot be looked up: File name too long" in result.err


def test_a_lone_surrogate_in_an_override_is_one_line():
    result = run_cli("render", "--cluster", "ci_slurm", "-o", "run.data.train_dir=/x\udcff")
    assert result.code == 2 and result.err.strip().endswith("not valid Unicode text (a lone surrogate)")
    result = run_cli("render", "--cluster", "ci_slurm", "-o", "ru\udcffn=1")
    assert result.code == 2 and "unknown key 'ru\\udcffn'" in result.err
