"""The text format of BERT pretraining corpora: one sentence per line, a blank line between documents.

This is the format of MLPerf's Wikipedia parts (`part-00xxx-of-00500`, `eval.txt`) and of Google's
`create_pretraining_data.py`. With `split_sentences`, each line is free text that is segmented into
sentences first (for corpora that are not one sentence per line).
"""

from __future__ import annotations

from pathlib import Path

from trainer.config.regular import read_regular_bytes
from trainer.data.prepare import files
from trainer.data.prepare.errors import BadInput
from trainer.data.prepare.sentences import split_sentences

Document = list[str]  # sentences


def read_documents(path: str | Path, split: bool = False) -> list[Document]:
    """The documents of a text file; empty documents are dropped. Bad UTF-8 or no text: BadInput."""
    path = Path(path)
    try:
        data = read_regular_bytes(path)
    except FileNotFoundError:
        raise BadInput(path, "file not found") from None
    except OSError as e:
        raise BadInput(path, f"cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise BadInput(path, f"line {line}: not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start})") from None
    documents: list[Document] = [[]]
    for line in text.splitlines():
        line = line.strip()
        if not line:
            if documents[-1]:
                documents.append([])
            continue
        documents[-1].extend(split_sentences(line) if split else [line])
    documents = [d for d in documents if d]
    if not documents:
        raise BadInput(path, "no text (the file is empty or blank)")
    return documents


def format_documents(documents: list[Document]) -> str:
    return "\n\n".join("\n".join(d) for d in documents) + "\n"


def write_documents(path: str | Path, documents: list[Document]) -> Path:
    return files.write_text(path, format_documents(documents))
