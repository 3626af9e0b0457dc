"""`./run.sh all`: the paper's configurations x plans, fanned out over a host's GPUs or submitted to Slurm.

matrix   which configurations and plans run (configs/paper/all.toml), with GPU memory and time estimates
engines  per engine kind: the image that serves it and whether it can run (in a container, natively), one table
images   the images (Dockerfile.llamacpp, Dockerfile.vllm) built or reused through the Docker SDK
host     prerequisites: Docker daemon, GPUs (nvidia-smi), the NVIDIA container runtime
fanout   the scheduler (one job per slot, longest first, each slot takes the next job that fits its memory) and
         its Docker back-end (one container per job); live progress
native   --native: llama-server built with CUDA on the host, one isolated process per job, CUDA_VISIBLE_DEVICES
sharing  --jobs-per-gpu: several jobs per GPU, through CUDA MPS or in time slices
slurm/   --slurm: a job array (a task per configuration x plan) and a dependent check job through sbatch; --status
command  the command itself: dry run, fetch, build, fan out, final table, check and report
"""
