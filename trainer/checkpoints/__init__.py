"""Checkpoints in three formats: `run` (ours: everything needed to continue a run exactly, written
atomically), `tf_checkpoint` (reading TensorFlow's bundles without TensorFlow), `convert` (a TF phase-1
checkpoint -> a PyTorch state dict with Hugging Face names); and `export` (weights -> a Hugging Face
model folder, for `bertctl export`).

May import: trainer.config, trainer.data, trainer.model, trainer.loop
"""
