"""What runs on every rank before training, torch-free: the binding wrapper (binding.py, reading the
node's topology.py), the rank's identity (dist_env.py), the launch rehearsal (probe.py) and the
image check (image_check.py).
"""
