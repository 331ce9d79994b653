"""`python -m trainer --config run.yaml`: one rank of a BERT pretraining run."""

from trainer.train import main

raise SystemExit(main())
