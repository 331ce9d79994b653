"""trainer.loop."""
