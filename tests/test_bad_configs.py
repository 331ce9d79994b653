"""Property test: random bad cluster files never produce a traceback, only one line and exit code 2."""

import copy

import yaml
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.config.clusters import load_cluster

VALID = yaml.safe_load(load_cluster("ci_slurm").path.read_text())


def leaves(tree, prefix=()):
    """Paths to every non-null leaf of a nested mapping (lists count as leaves)."""
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            yield from leaves(value, prefix + (key,))
        elif value is not None:
            yield prefix + (key,)


def sections(tree, prefix=()):
    yield prefix
    for key, value in tree.items():
        if isinstance(value, dict) and key != "env":
            yield from sections(value, prefix + (key,))


def get(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def wrong_type_for(value):
    """A value pydantic cannot coerce into the leaf's type."""
    if isinstance(value, bool):
        return st.sampled_from([[1, 2], {"on": True}, "maybe", 2.5])
    if isinstance(value, (int, float)):
        return st.one_of(st.text(alphabet="abcxyz $;'\"", min_size=1).map(lambda s: s + "!"),
                         st.just({"n": 1}), st.just([1, 2]))
    if isinstance(value, str):
        return st.one_of(st.just({"a": 1}), st.lists(st.integers(), min_size=1))
    if isinstance(value, list):
        return st.one_of(st.just({"k": "v"}), st.just(7.5))
    return st.just({"unexpected": [1]})


@st.composite
def bad_configs(draw):
    doc = copy.deepcopy(VALID)
    kind = draw(st.sampled_from(["unknown_key", "wrong_type", "missing", "not_a_mapping", "negative"]))
    if kind == "unknown_key":
        where = draw(st.sampled_from(list(sections(doc))))
        name = draw(st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=3, max_size=12).map(lambda s: "zz" + s))
        get(doc, where)[name] = draw(st.one_of(st.integers(), st.text(max_size=10), st.none()))
    elif kind == "wrong_type":
        path = draw(st.sampled_from([p for p in leaves(doc) if p[-1] != "env" and p[:2] != ("node", "env")]))
        get(doc, path[:-1])[path[-1]] = draw(wrong_type_for(get(doc, path)))
    elif kind == "missing":
        path = draw(st.sampled_from([("name",), ("resources",), ("run",), ("resources", "nodes"), ("run", "data"),
                                     ("run", "optim", "lr"), ("run", "train", "batch_size"), ("run", "data", "train_dir")]))
        del get(doc, path[:-1])[path[-1]]
    elif kind == "not_a_mapping":
        return draw(st.one_of(st.lists(st.integers()).map(yaml.safe_dump), st.text(alphabet="[]{}:,-'\"\t #&*!|>%@`", min_size=1)))
    else:
        path = draw(st.sampled_from([("resources", "nodes"), ("resources", "tasks_per_node"), ("run", "optim", "lr"),
                                     ("run", "train", "batch_size"), ("run", "optim", "max_steps"), ("slurm", "max_requeues")]))
        get(doc, path[:-1])[path[-1]] = -draw(st.integers(min_value=1, max_value=10**6))
    return yaml.safe_dump(doc)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=bad_configs())
def test_bad_configs_give_one_line_and_exit_2(tmp_path, text):
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    result = run_cli("render", "--cluster", str(path))
    assert result.code == 2, result.out[:200]
    assert result.out == ""
    assert result.err.startswith("bertctl: error: ") and result.err.count("\n") == 1
    assert str(path) in result.err
    assert "Traceback" not in result.err
