"""`python -m trainer --config run.yaml`: one rank of a BERT pretraining run."""

from trainer import distributed
from trainer.train import main

code = main()
if distributed.group_was_used():
    distributed.exit_process(code)
raise SystemExit(code)
