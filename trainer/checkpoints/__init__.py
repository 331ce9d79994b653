"""trainer.checkpoints."""
