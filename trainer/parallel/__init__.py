"""trainer.parallel."""
