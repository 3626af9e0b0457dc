"""`./run.sh all`: the paper's configurations x plans in pinned containers, fanned out over a host's GPUs.

matrix   which configurations and plans run (configs/paper/all.toml), with GPU memory and time estimates
images   the images (Dockerfile.llamacpp, Dockerfile.vllm) built or reused through the Docker SDK
host     prerequisites: Docker daemon, GPUs (nvidia-smi), the NVIDIA container runtime
fanout   one container per configuration x plan, one GPU each, N GPUs => N containers at once; live progress
command  the command itself: dry run, fetch, build, fan out, final table, check and report
"""
