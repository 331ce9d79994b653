"""What runs on every rank before training: the binding wrapper (binding.py, reading the node's
topology.py), the rank's identity (dist_env.py), the launch rehearsal (probe.py) and the image check
(image_check.py), all torch-free; and the preflight measures (preflight.py, preflight_measures.py).

May import: trainer.config, trainer.data, trainer.model, trainer.loop, trainer.parallel
"""
