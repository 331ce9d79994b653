"""ARCHITECTURE.md stays true: every file and function it names exists, and the boundaries it draws
hold (the trainer never imports the orchestrator, the orchestrator never imports torch, and no two
modules import each other)."""

import ast
import re
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
from conftest import REPO

DOC = (REPO / "ARCHITECTURE.md").read_text()
ROOTS = ("orchestrator", "trainer", "templates", "tests", "clusters", "datasets", "benchmarks", ".ci", "docs")
PATH_REF = re.compile(r"(?<![\w/.])((?:%s)/[\w./*-]*[\w*/])(?:::([\w.]+))?" % "|".join(re.escape(r) for r in ROOTS))
# backticked names that look like code: CamelCase, UPPER_CASE, snake_case, Class.member
CODE_NAME = re.compile(r"^(?:[A-Z][a-z]\w*(?:\.\w+)?|[A-Z][A-Z0-9_]+|[a-z]+_[a-z_]+)$")
NOT_CODE = {"file::Symbol", "Class.method", "mlperf_logging", "cu_seqlens"}


def python_files(*roots: str) -> list[Path]:
    return [p for root in roots for p in sorted((REPO / root).rglob("*.py"))]


@lru_cache(maxsize=None)
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def members(node) -> set[str]:
    """The names a module or class body defines: functions, classes, assignments, annotated fields."""
    names = set()
    for child in node.body:
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(child.name)
        elif isinstance(child, ast.Assign):
            names |= {t.id for t in child.targets if isinstance(t, ast.Name)}
        elif isinstance(child, ast.AnnAssign) and isinstance(child.target, ast.Name):
            names.add(child.target.id)
    return names


def defines(path: Path, dotted: str) -> bool:
    """Whether `dotted` (a name, or Class.member) is defined at the top of this file."""
    node = tree(path)
    *outer, last = dotted.split(".")
    for name in outer:
        node = next((c for c in node.body if isinstance(c, ast.ClassDef) and c.name == name), None)
        if node is None:
            return False
    return last in members(node)


def references() -> list[tuple[str, str | None]]:
    return sorted(set(PATH_REF.findall(DOC)))


def test_the_map_names_files_and_functions():
    refs = references()
    assert len(refs) > 60 and sum(bool(symbol) for _, symbol in refs) > 25  # the page is a map, not prose


@pytest.mark.parametrize("path,symbol", references(), ids=lambda v: v or "")
def test_every_named_file_and_function_exists(path, symbol):
    pattern = re.sub(r"/(NAME|X)\.", "/*.", path.rstrip("/"))  # placeholders: clusters/NAME.yaml
    matches = list(REPO.glob(pattern)) if "*" in pattern else [REPO / pattern]
    assert matches and all(m.exists() for m in matches), f"ARCHITECTURE.md names {path}, which does not exist"
    if symbol:
        assert defines(REPO / path, symbol), f"ARCHITECTURE.md names {path}::{symbol}, which is not defined there"


def recipes() -> dict[str, list[str]]:
    """ARCHITECTURE.md's "To add X, change Y" rows: what is added -> the files its second column lists."""
    section = DOC.split("## To add X, change Y", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and not line.startswith("| to add")]
    return {row[0].lstrip("| "): [f.strip() for f in row[1].split(";")] for row in rows}


def test_the_recipes_are_there():
    assert {"a cluster key (e.g. `slurm.reservation`)", "a run key (`run.<section>.<key>`)", "an optimizer",
            "a dataset manifest", "a CLI verb", "a cluster file"} <= set(recipes())


@pytest.mark.parametrize("recipe", sorted(recipes()))
def test_each_recipe_lists_files_that_exist(recipe):
    files = recipes()[recipe]
    assert files
    for entry in files:
        path = (PATH_REF.search(entry) or re.search(r"README\.md|ARCHITECTURE\.md", entry))
        assert path, f"{recipe}: {entry!r} names no file"
        pattern = re.sub(r"/(NAME|X)\.", "/*.", path[1] if path.re is PATH_REF else path[0])
        assert list(REPO.glob(pattern)), f"{recipe}: {pattern} does not exist"


def test_a_new_run_key_touches_at_most_five_files():
    assert len(recipes()["a run key (`run.<section>.<key>`)"]) <= 5


def code_names() -> list[str]:
    return sorted({n for n in re.findall(r"`([^`\s]+)`", DOC) if CODE_NAME.match(n) and n not in NOT_CODE})


@pytest.mark.parametrize("name", code_names())
def test_every_named_class_constant_and_function_is_defined_somewhere(name):
    assert any(defines(p, name) for p in python_files("orchestrator", "trainer", "tests")), \
        f"ARCHITECTURE.md names `{name}`, which no module defines"


def imported_modules(path: Path, module_level_only: bool) -> set[str]:
    nodes = tree(path).body if module_level_only else ast.walk(tree(path))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_the_trainer_never_imports_the_orchestrator():
    offenders = [str(p.relative_to(REPO)) for p in python_files("trainer")
                 if any(m.split(".")[0] == "orchestrator" for m in imported_modules(p, module_level_only=False))]
    assert not offenders


def test_the_orchestrator_and_the_config_schemas_never_import_torch():
    offenders = [str(p.relative_to(REPO)) for p in python_files("orchestrator", "trainer/config")
                 if any(m.split(".")[0] == "torch" for m in imported_modules(p, module_level_only=False))]
    assert not offenders


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_two_modules_import_each_other_at_module_level():
    """A cycle makes the import order matter and the map a knot; function-level imports don't count."""
    modules = {module_name(p): p for p in python_files("orchestrator", "trainer")}
    graph = {name: module_level_dependencies(path, set(modules)) - {name} for name, path in modules.items()}
    cycles = find_cycles(graph)
    assert not cycles, f"import cycles: {cycles}"


def test_no_module_imports_its_own_importer_even_inside_a_function():
    """A function-level import back is a circle too, only hidden: trainer/loop/train.py once took RunArgs and
    `fail` from its own caller, trainer/loop/entry.py (now both import trainer/loop/run_args.py). A package and
    its own submodules are left out (a package's __init__ may name what its modules define)."""
    modules = {module_name(p): p for p in python_files("orchestrator", "trainer")}
    at_load = {name: module_level_dependencies(path, set(modules)) - {name} for name, path in modules.items()}
    anywhere = {name: imported_modules(path, module_level_only=False) & set(modules) for name, path in modules.items()}
    circles = sorted({tuple(sorted((a, b))) for a in modules for b in at_load[a] if a in anywhere[b]
                      and not a.startswith(f"{b}.") and not b.startswith(f"{a}.")})
    assert not circles, f"modules that import each other: {circles}"


def module_level_dependencies(path: Path, modules: set[str]) -> set[str]:
    """The project modules this file imports as it loads. `from pkg import sub` depends on the
    submodule `pkg.sub` alone when every imported name is a submodule, else on `pkg` too."""
    deps = set()
    for node in tree(path).body:
        if isinstance(node, ast.Import):
            deps |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            deps |= subs
            if len(subs) < len(node.names) and node.module in modules:
                deps.add(node.module)
    return deps


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_loss_row_names_the_functions_a_training_step_calls():
    """The step table's loss row once named pretraining_loss_sums, which training never calls: follow
    the calls of a training forward (model(batch, loss_sums=True), as Trainer.forward_backward makes it)."""
    import sys

    import numpy as np

    from trainer.config import ModelConfig
    from trainer.data.batch import collate
    from trainer.data.layout import Sample
    from trainer.model.bert import BertForPreTraining

    cfg = ModelConfig(num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=64, max_position_embeddings=64)
    model = BertForPreTraining(cfg)
    ids, positions = np.arange(5, 37), np.array([3, 9, 20])
    sample = Sample(ids, (np.arange(32) >= 16).astype(np.int64), positions, ids[positions], 1)
    batch = collate([sample] * 2, unpadded=False)
    called = set()

    def record(frame, event, arg):
        if event == "call":
            path = Path(frame.f_code.co_filename)
            if REPO in path.parents:
                called.add(f"{path.relative_to(REPO)}::{frame.f_code.co_name}")

    sys.setprofile(record)
    try:
        mlm, nsp = model(batch, loss_sums=True)
    finally:
        sys.setprofile(None)
    (mlm + nsp).backward()
    row = next(line for line in DOC.splitlines() if line.startswith("| loss |"))
    taken = {"trainer/model/mlm_loss.py::masked_lm_loss_sum", "trainer/model/bert.py::nsp_loss_sum"}
    assert taken <= called and "trainer/model/bert.py::pretraining_loss_sums" not in called
    assert all(name in row for name in taken), row
    first_named = PATH_REF.search(row.split("|")[3])
    assert f"{first_named.group(1)}::{first_named.group(2)}" in called  # the row's first function is one training calls


def test_the_trainer_class_reads_as_the_run_in_under_200_lines():
    """Bookkeeping beside the loop (progress, warm-up, checkpoints, counts) lives in its own modules:
    the class grew to 284 lines once and was brought back; this keeps it there."""
    tree = ast.parse((REPO / "trainer" / "loop" / "train.py").read_text())
    trainer = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Trainer")
    length = trainer.end_lineno - trainer.lineno + 1
    assert length < 200, f"class Trainer is {length} lines: move what is not the run itself beside it"


def packages() -> list[Path]:
    """The packages the import rules are declared for: each half's top and its subpackages (not deeper)."""
    inits = [p for root in ("orchestrator", "trainer") for p in (REPO / root).rglob("__init__.py")]
    return sorted(p for p in inits if len(p.relative_to(REPO).parts) <= 3)


def package_of(module: str) -> str | None:
    """The package a bertctl module belongs to: the subpackage under trainer/ or orchestrator/, or the top."""
    parts = module.split(".")
    if parts[0] not in ("trainer", "orchestrator"):
        return None
    if len(parts) > 1 and (REPO / parts[0] / parts[1] / "__init__.py").exists():
        return ".".join(parts[:2])
    return parts[0]


def is_bertctl_module(module: str) -> bool:
    path = REPO / module.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def declared_imports(init: Path) -> set[str] | None:
    """The packages its docstring's `May import:` paragraph names (None: it has none)."""
    doc = ast.get_docstring(tree(init)) or ""
    found = re.search(r"^May import: (.*?)(?:\n\n|\Z)", doc, re.M | re.S)
    if found is None:
        return None
    return set(re.findall(r"\b(?:trainer|orchestrator)(?:\.\w+)?\b", found.group(1)))


@pytest.mark.parametrize("init", packages(), ids=lambda p: str(p.parent.relative_to(REPO)))
def test_each_package_says_what_lives_there_and_imports_only_what_it_declares(init):
    """Every import (at any level) of a package's modules stays within what its docstring allows."""
    name = package_of(module_name(init))
    allowed = declared_imports(init)
    assert allowed is not None, f"{init.relative_to(REPO)}: its docstring has no 'May import:' paragraph"
    own = [p for p in python_files(*(str(init.parent.relative_to(REPO)),)) if package_of(module_name(p)) == name]
    used = {}
    for path in own:
        for module in imported_modules(path, module_level_only=False):
            target = package_of(module)
            if target not in (None, name) and is_bertctl_module(module):
                used.setdefault(target, str(path.relative_to(REPO)))
    undeclared = {t: f for t, f in used.items() if t not in allowed}
    assert not undeclared, f"{init.relative_to(REPO)} does not declare: {undeclared}"


def test_the_trainer_top_level_keeps_a_handful_of_modules():
    top = sorted(p.name for p in (REPO / "trainer").glob("*.py"))
    assert len(top) <= 8, top


def test_the_trainers_first_lines_load_nothing_but_the_standard_library():
    """trainer/__main__.py sets its stop-signal handler after importing trainer/loop/lifeline.py: whatever that
    import loads is time in which a SIGTERM still kills the process as a failed run (pydantic, when the exit code
    came from trainer/config/run.py, took ~0.13 s)."""
    code = ("import sys; before = set(sys.modules); import trainer.loop.lifeline; "
            "print(sorted({m.split('.')[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names)))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "['trainer']"
