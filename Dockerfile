# An image with bertctl baked in, for clusters that prefer it to `container.install: wheel` (where a
# stock PyTorch image gets the submitting bertctl installed by the job). Not built or tested here:
# this project's machines have no Docker engine and no access to NVIDIA's registry.
#
#   docker build -t registry.example.com/me/bertctl:0.1.0 .
#   enroot import docker://registry.example.com/me/bertctl:0.1.0      # then container.image in the cluster file
#
# NGC's PyTorch image brings CUDA, NCCL, torch and apex; pip adds bertctl and the packages the image
# lacks, leaving the image's torch in place.
FROM nvcr.io/nvidia/pytorch:24.09-py3

WORKDIR /workspace/bertctl
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY trainer ./trainer
COPY templates ./templates
COPY clusters ./clusters
COPY datasets ./datasets
RUN pip install --no-cache-dir . && python -m trainer.launch.image_check

WORKDIR /workspace/bert
