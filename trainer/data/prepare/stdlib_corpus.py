"""The sample corpus: English prose that every machine with Python has.

Two sources, read without importing anything: the docstrings of the standard library's modules,
classes and functions (parsed with `ast`, in source order, one document per module), and the text of
the language reference that ships as `pydoc_data.topics` (one document per topic). Code examples,
tables, reST markup and headings are dropped; what is left is split into sentences.

The corpus is deterministic for a given Python installation (files and topics are sorted), but it
depends on the Python version and on how the distribution packaged the standard library.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from trainer.data.prepare.sentences import split_sentences

SKIPPED_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__", "lib-dynload", "ensurepip"}
MIN_SENTENCES = 2  # a document must hold a sentence pair
MIN_WORDS = 3
MAX_SENTENCE_CHARS = 1000

ROLE = re.compile(r":[a-z]+(:[a-z]+)?:`~?([^`<]*?)(\s*<[^>]*>)?`")  # :func:`name` -> name
LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`_?")
EMPHASIS = re.compile(r"\*\*?([^*\s][^*]*?)\*\*?")
UNDERLINE = re.compile(r"^\s*([-=~^*#+\"'`])\1{2,}\s*$")
CODE_START = (">>>", "...", "$ ", "% ", "#", "..", "|", "+-", "[", "{")


@dataclass(frozen=True)
class CorpusDocument:
    name: str
    sentences: list[str]

    def is_eval(self, eval_percent: int) -> bool:
        """Held out by a hash of the name: stable when other documents come and go between versions."""
        return int(hashlib.md5(self.name.encode()).hexdigest()[:8], 16) % 100 < eval_percent


def stdlib_documents(limit: int | None = None) -> list[CorpusDocument]:
    """The usable documents (two sentences or more) of this Python's standard library, sorted by
    name; with `limit`, only the first ones (only as many files are parsed as needed)."""
    root = stdlib_dir()
    sources = [(p.relative_to(root).as_posix(), p) for p in module_files(root)]
    sources += [(f"pydoc_data/topics/{key}", key) for key in sorted(_topics())]
    docs = []
    for name, source in sorted(sources):
        sentences = module_sentences(source) if isinstance(source, Path) else prose_sentences(_topics()[source])
        if len(sentences) >= MIN_SENTENCES:
            docs.append(CorpusDocument(name, sentences))
            if limit is not None and len(docs) >= limit:
                break
    return docs


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def module_files(root: Path) -> list[Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIPPED_DIRS and not d.startswith("config-"))
        found += [Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py") and not f.startswith("_sysconfigdata")]
    return found


def module_sentences(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError, OSError):
        return []  # e.g. lib2to3's Python 2 fixtures: not prose anyway
    return [s for text in docstrings(tree) for s in prose_sentences(text)]


def _topics() -> dict[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions leave pydoc_data out
        return {}
    return topics


DEFINITIONS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
STATEMENT_LISTS = ("body", "handlers", "orelse", "finalbody")  # in source order


def docstrings(node: ast.AST) -> list[str]:
    """Docstrings of a module and everything defined in it, in source order.

    Only statements are walked (definitions can sit inside if/try/with blocks), never expressions:
    docstrings live nowhere else, and expressions are most of a syntax tree."""
    found = []
    if isinstance(node, DEFINITIONS):
        text = ast.get_docstring(node, clean=True)
        if text:
            found.append(text)
    for field in STATEMENT_LISTS:
        for child in getattr(node, field, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler)):
                found += docstrings(child)
    return found


def prose_sentences(text: str) -> list[str]:
    """The sentences of the prose paragraphs of a docstring or reference text."""
    sentences = []
    for paragraph in paragraphs(text):
        for sentence in split_sentences(strip_markup(paragraph)):
            if _is_prose(sentence):
                sentences.append(sentence)
    return sentences


def paragraphs(text: str) -> list[str]:
    """Blank-line separated blocks that read like prose: no code, tables, directives or headings."""
    kept = []
    for block in re.split(r"\n\s*\n", text.expandtabs()):
        lines = [line for line in block.splitlines() if line.strip() and not UNDERLINE.match(line)]
        if not lines:
            continue
        indent = len(lines[0]) - len(lines[0].lstrip())
        first = lines[0].strip()
        if first.startswith(CODE_START) or indent >= 3:
            continue  # an example, a table, a directive, or an indented code block
        if any(len(line) - len(line.lstrip()) > indent + 3 for line in lines[1:]):
            continue  # a definition list or code continuation: not running text
        joined = " ".join(line.strip() for line in lines)
        if joined.endswith("::"):
            joined = joined[:-1]
        kept.append(joined)
    return kept


def strip_markup(text: str) -> str:
    text = ROLE.sub(lambda m: m.group(2), text)
    text = LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    return EMPHASIS.sub(lambda m: m.group(1), text)


def _is_prose(sentence: str) -> bool:
    words = sentence.split()
    if len(words) < MIN_WORDS or len(sentence) > MAX_SENTENCE_CHARS:
        return False
    letters = sum(c.isalpha() for c in sentence)
    return letters >= 0.6 * len(sentence.replace(" ", "")) and any(w.isalpha() and w.islower() for w in words)
