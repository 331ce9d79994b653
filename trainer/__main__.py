"""`python -m trainer --config run.yaml`: one rank of a BERT pretraining run."""

import sys

from trainer.loop.lifeline import end_with_job, stop_before_the_run

stop_before_the_run()  # a SIGTERM while torch imports is an interrupted run, not a failed one
end_with_job()  # a local job's trainer stops when the job's shell is gone

from trainer.loop.entry import main  # noqa: E402 - torch-free until the configuration is checked

code = main()
if "trainer.parallel.distributed" in sys.modules:  # a run started; a rank that used a process group ends hard
    from trainer.parallel import distributed

    if distributed.group_was_used():
        distributed.exit_process(code)
raise SystemExit(code)
