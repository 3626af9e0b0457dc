"""`./run.sh all --slurm`: the matrix as one Slurm job array (a task per configuration x plan) plus a dependent check
job, through the site's own `sbatch`.

Submission (on a login node: it needs the network for the set-up, the tasks do not):
  1. the site options are checked (one-line errors), and `sbatch --test-only` judges the array's batch script before
     anything is submitted (an unknown partition, account or option is one line, nothing half-submitted);
  2. the set-up happens here, once: the environment and llama-server (the CUDA build for native GPU tasks, the CPU
     default's with --cpu), the weights fetched and verified, derived models made; tasks run offline;
  3. `<results>/slurm/<stamp>/` holds jobs.json (task index -> configuration, plan), array.sbatch, check.sbatch,
     logs/ (Slurm's output per task) and tasks/<index>.json (each task's own record: running, then its outcome);
  4. the array holds only the jobs whose runs are not all complete, so resubmitting resumes (and the protocol reuses
     a plan's complete sessions); the check job depends on it with `--dependency=afterany`.
A task (`./run.sh all --slurm-task I --submission DIR`, from array.sbatch) runs job I the native way (native.py: the
same isolated process as `all --native`, on the GPU Slurm gave it), or the artifact's image through Apptainer/
Singularity (`--container apptainer --image FILE.sif`) or Docker (`--container docker`). The check job
(`--slurm-finish`) prints the final table from the records and runs check. `--status` shows each task's state from
the results directory, with squeue's and (where accounting is on) sacct's view.

The results directory must be on a file system every node mounts: the batch script first checks that it sees the
submission's jobs.json and says so in one line when it does not; submitting under a node-local path warns.

The package, by role (each imports only those above it, and native.py for the tasks and the set-up):
  spec    the submission's directory: jobs.json, tasks/<index>.json, reading and writing them
  batch   the site options checked, array.sbatch and check.sbatch, sbatch itself (--test-only)
  status  each task's state (results, records, squeue, sacct): --status and the check job (--slurm-finish)
  task    one array task on its node: native, Apptainer or Docker, and its record
  submit  the submission: set-up once, the array of the jobs not complete, the dependent check job; --dry-run
"""

from artifact.orchestrate.slurm.status import finish
from artifact.orchestrate.slurm.submit import cmd_slurm
from artifact.orchestrate.slurm.task import apptainer_command, run_task

__all__ = ["apptainer_command", "cmd_slurm", "finish", "run_task"]
