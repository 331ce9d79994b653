"""The exit code every part agrees on, in a module that imports nothing: the trainer's first lines use it
(trainer/loop/lifeline.py) before any schema, pydantic included, has loaded."""

# A rank exits with this (EX_TEMPFAIL) after saving a checkpoint on SIGUSR2/SIGTERM; the job
# script then requeues the job and the run resumes from the checkpoint.
REQUEUE_EXIT_CODE = 75
