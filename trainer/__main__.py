"""`python -m trainer --config run.yaml`: one rank of a BERT pretraining run."""

from trainer.loop.train import main
from trainer.parallel import distributed

code = main()
if distributed.group_was_used():
    distributed.exit_process(code)
raise SystemExit(code)
