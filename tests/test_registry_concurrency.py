"""Concurrent submits: four processes create experiments of one cluster into one registry at once.
Every id is unique, every create succeeds, and every directory is complete and registered."""

import multiprocessing
import os
import time

from orchestrator import experiments
from orchestrator.experiments import Experiment

WRITERS, EACH = 4, 150


def create_many(home: str, count: int, queue) -> None:
    os.environ["BERTCTL_HOME"] = home
    made, errors = [], []
    for _ in range(count):
        exp = Experiment(id=experiments.new_id("local"), cluster="local", cluster_source="local", executor="local",
                         nexp=1, seeds=[0], program="train", overrides=[], script="job.sh", created=time.time(), dir="")
        try:
            made.append(experiments.create(exp, {"run.yaml": "world_size: 1\n", "job.sh": "#!/bin/bash\n"}).id)
        except Exception as e:  # noqa: BLE001 - counted and reported below
            errors.append(f"{type(e).__name__}: {e}")
    queue.put((made, errors))


def test_concurrent_creates_get_unique_ids_and_complete_directories(bertctl_home):
    queue = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(target=create_many, args=(str(bertctl_home), EACH, queue))
               for _ in range(WRITERS)]
    for w in workers:
        w.start()
    results = [queue.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=30)
    ids = [i for made, _ in results for i in made]
    errors = [e for _, errs in results for e in errs]
    assert errors == [] and len(ids) == WRITERS * EACH == len(set(ids))
    registered = experiments.load_all()
    assert sorted(e.id for e in registered) == sorted(ids)
    assert all((e.path / "run.yaml").read_text() == "world_size: 1\n" for e in registered)
    leftovers = [p.name for p in (bertctl_home / "experiments").iterdir() if p.name.startswith(".")]
    assert leftovers == []  # no staging directory left behind
