"""Dataset manifests on the control plane: find, load with `-o` overrides, check what can be checked
before any worker starts, and write the resolved manifest the workers read."""

from __future__ import annotations

from pathlib import Path

from orchestrator import __version__
from orchestrator.config import configfile
from orchestrator.errors import UserError
from trainer.config import DatasetManifest

# A validated manifest and where it came from.
LoadedManifest = configfile.LoadedFile


def manifest_files() -> dict[str, Path]:
    """Every known dataset by name; folders in $BERTCTL_DATASETS shadow shipped manifests."""
    return configfile.named_files("datasets")


def find_manifest(name: str) -> Path:
    return configfile.find_named_file("datasets", name, "dataset manifest", "--dataset")


def load_manifest(name: str, overrides: list[str] | tuple[str, ...] = ()) -> LoadedManifest:
    return configfile.load_named("datasets", name, overrides, DatasetManifest, "dataset", "--dataset")


def split_overrides(overrides: list[str], with_cluster: bool) -> tuple[list[str], list[str]]:
    """(the manifest's, the cluster's) of `data prepare`'s -o overrides. The rule: a key whose first
    part is a section of the dataset manifest (`name`, `root`, `source`, `prepare`, ...) is the
    manifest's; with --cluster, any other key is the cluster file's (`slurm.partition`,
    `slurm.account`, `container.image`, ...), checked against the cluster schema. Without --cluster
    every key is the manifest's."""
    if not with_cluster:
        return list(overrides), []
    mine = [o for o in overrides if o.partition("=")[0].strip().split(".")[0] in DatasetManifest.model_fields]
    return mine, [o for o in overrides if o not in mine]


def check_inputs(loaded: LoadedManifest) -> None:
    """What can be said before any worker starts: inputs the manifest still needs. (A manifest may leave
    them unset, to be given with -o at prepare time, so this is not a rule of the schema.)"""
    m = loaded.config
    if m.source.kind != "python_stdlib":
        for split in [s for s in ("train", "eval") if any(o.split == s for o in m.outputs.values())]:
            if not getattr(m.source, split):
                what = "the training parts (a folder or a glob)" if split == "train" else "the eval file"
                raise UserError(f"not set: point it at {what} with -o source.{split}=PATH",
                                where=str(loaded.path), key=f"source.{split}")


def write_manifest(loaded: LoadedManifest, folder: Path) -> Path:
    path = folder / "manifest.yaml"
    header = f"# resolved by bertctl {__version__} from {loaded.source}" + (
        f" with -o {' -o '.join(loaded.overrides)}" if loaded.overrides else "") + "\n"
    path.write_text(header.replace("\n", " ").rstrip() + "\n" + loaded.config.to_yaml(), encoding="utf-8")
    return path


def describe(path: Path) -> str:
    """One line for `bertctl data list`: name, source kind, outputs, description."""
    name = path.stem
    try:
        m = load_manifest(str(path)).config
    except UserError as e:
        return f"{name}\tinvalid\t{e}"
    return f"{name}\t{m.source.kind}\t{', '.join(m.outputs)}\t{m.description}"
