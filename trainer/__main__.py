"""`python -m trainer --config run.yaml`: one rank of a BERT pretraining run."""

import sys

from trainer.loop.entry import main  # torch-free until the configuration is checked

code = main()
if "trainer.parallel.distributed" in sys.modules:  # a run started; a rank that used a process group ends hard
    from trainer.parallel import distributed

    if distributed.group_was_used():
        distributed.exit_process(code)
raise SystemExit(code)
