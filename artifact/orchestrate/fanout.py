"""The fan-out: configuration x plan jobs over slots (GPUs, or --parallel CPU slots), one job per slot at a time,
longest job first, each slot taking the next job that fits its memory (`pick`; `simulate` plays the same policy on the
estimated hours, for the dry runs). `FanoutBase` is that scheduler with the live progress and the judgement of a
finished job; a back-end says how one job runs: `Fanout` here (one Docker container per job) or
`native.NativeFanout` (one process per job on the host, `CUDA_VISIBLE_DEVICES` per GPU slot).

A container runs `python -m artifact run CONFIG --plan PLAN --results /results` (the same protocol code as the CPU
demo) as the invoking user, with `--network none`, the weights read-only, the results directory read-write. Its log
goes to `<results>/<config>/<plan>/logs/container-*.log` and is parsed for live progress (run, episode i/N, elapsed,
estimate). A failure (non-zero exit, a killed container, a wrong engine build in the manifests) is that job's outcome
and never stops the others; resume is the protocol's own (complete sessions are reused).
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from artifact import workloads
from artifact.orchestrate import host
from artifact.orchestrate.matrix import Job
from artifact.protocol.sessions import sessions
from artifact.catalog import load_plan
from artifact.records.store import find_runs

RUN_LINE = re.compile(r"^\s*\[(?P<arm>\w+) run (?P<run>\d+)\] (?P<i>\d+)/(?P<n>\d+) ")
REUSE_LINE = re.compile(r"\] session (?P<session>\S+): complete, reusing")
DONE, FAILED, SKIPPED, TOO_BIG, INTERRUPTED = "done", "FAILED", "skipped", "too big", "interrupted"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


@dataclass(frozen=True)
class Slot:
    label: str  # "gpu0", "cpu1"
    device_ids: tuple = ()  # GPU indices for the container; () = no GPU
    memory_gib: float | None = None


@dataclass
class Outcome:
    job: Job
    status: str
    slot: str = ""
    seconds: float = 0.0
    note: str = ""


@dataclass
class Progress:
    """Where a job's container is, from its log lines."""

    job: Job
    total_runs: int
    started: float = field(default_factory=time.monotonic)
    current: str = "starting"
    episode: int = 0
    episodes: int = 0
    done_runs: set = field(default_factory=set)
    episodes_here: int = 0  # episodes this container ran (the rate for the estimate)

    def feed(self, line: str, runs_per_session: dict) -> None:
        m = RUN_LINE.match(line)
        if m:
            arm, run, i, n = m["arm"], int(m["run"]), int(m["i"]), int(m["n"])
            self.current, self.episode, self.episodes = f"{arm} run {run}", i, n
            self.episodes_here += 1
            if i == n:
                self.done_runs.add((arm, run))
            return
        m = REUSE_LINE.search(line)
        if m:
            self.done_runs.update(runs_per_session.get(m["session"], ()))

    def line(self, slot: str) -> str:
        return f"  {slot:>5}  {self.job.key:<34} {self.summary(10)}"

    def summary(self, width: int = 0) -> str:
        """ "on run 1  episode 3/80, 0:02:30 elapsed, ~1:10:00 left" """
        elapsed = time.monotonic() - self.started
        text = f"{self.current:<{width}}" if width else self.current
        if self.episodes:
            text += f" episode {self.episode}/{self.episodes}"
            left = (
                self.total_runs * self.episodes
                - len(self.done_runs) * self.episodes
                - (0 if self.episode == self.episodes else self.episode)
            )
            if self.episodes_here:
                text += f", {hms(elapsed)} elapsed, ~{hms(elapsed / self.episodes_here * max(left, 0))} left"
        else:
            text += f" {hms(elapsed)} elapsed"
        return text


def runs_per_session(plan) -> tuple[int, dict]:
    groups = sessions(plan)
    return sum(len(g) for g in groups), {g[0].session: [(s.arm, s.run) for s in g] for g in groups}


def pick(queue: list[Job], slot: Slot) -> int | None:
    """Index of the job `slot` takes next from `queue` (longest first): the first that fits its memory."""
    for i, job in enumerate(queue):
        if slot.memory_gib is None or job.gpu_mem_gib <= slot.memory_gib:
            return i
    return None


def longest_first(jobs: list[Job]) -> list[Job]:
    return sorted(jobs, key=lambda j: -j.hours)


def simulate(jobs: list[Job], slots: list[Slot]) -> list[tuple[Slot, Job, float, float]]:
    """The fan-out's policy played on the estimated hours: (slot, job, start h, end h) per job, in start order. A
    slot whose next free moment comes first takes the next job that fits it; a slot that fits none retires."""
    queue, free, out = longest_first(jobs), {s.label: 0.0 for s in slots}, []
    live = list(slots)
    while queue and live:
        slot = min(live, key=lambda s: free[s.label])  # ties: the first slot in the given order
        i = pick(queue, slot)
        if i is None:
            live.remove(slot)
            continue
        job = queue.pop(i)
        out.append((slot, job, free[slot.label], free[slot.label] + job.hours))
        free[slot.label] += job.hours
    return out


class FanoutBase:
    """Jobs over slots, one job per slot at a time (see the module's docstring). A back-end implements `run_job`
    (run one job on one slot, return its Outcome) and `stop_running` (stop what runs, on Ctrl-C or a signal); it
    registers a running job's Progress in `self.active` so that the progress table shows it."""

    progress_every: float = 60.0

    def _init_fanout(self) -> None:
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.active: dict[str, tuple[str, Progress]] = {}

    def run_job(self, job: Job, slot: Slot) -> Outcome:
        raise NotImplementedError

    def stop_running(self) -> None:
        raise NotImplementedError

    def after_stop(self) -> None:
        """Clean-up once the workers have returned (or were given up on) after a stop."""

    def run(self, jobs: list[Job], slots: list[Slot]) -> list[Outcome]:
        """Run `jobs` longest first, each on the first free slot with enough GPU memory."""
        queue = longest_first(jobs)
        outcomes: list[Outcome] = []
        taken: dict[str, tuple[Job, Slot]] = {}

        def take(slot: Slot) -> Job | None:
            with self.lock:
                i = pick(queue, slot)
                if i is None:
                    return None
                taken[queue[i].key] = (queue[i], slot)
                return queue.pop(i)

        def worker(slot: Slot, done: threading.Event) -> None:
            try:
                work(slot)
            finally:
                done.set()

        def work(slot: Slot) -> None:
            while not self.stop.is_set():
                job = take(slot)
                if job is None:
                    return
                try:
                    outcome = self.run_job(job, slot)
                except Exception as exc:  # a back-end failure mid-run: this job's outcome, not the others'
                    outcome = Outcome(
                        job,
                        INTERRUPTED if self.stop.is_set() else FAILED,
                        slot.label,
                        0.0,
                        f"{type(exc).__name__}: {str(exc)[:200]}",
                    )
                with self.lock:
                    outcomes.append(outcome)
                say(
                    f"[{slot.label}] {job.key}: {outcome.status} after {hms(outcome.seconds)}"
                    + (f" ({outcome.note})" if outcome.note else "")
                )

        # Each worker sets its own event when it ends: waiting on those (not Thread.join, which a KeyboardInterrupt
        # can leave believing a live thread has ended) lets a stop wait for the jobs' clean-up.
        dones = [threading.Event() for _ in slots]
        for s, done in zip(slots, dones):
            threading.Thread(target=worker, args=(s, done), daemon=True, name=s.label).start()

        def wait_all(seconds: float) -> bool:
            deadline = time.monotonic() + seconds
            for done in dones:
                if not done.wait(max(deadline - time.monotonic(), 0)):
                    return False
            return True

        try:
            last = time.monotonic()
            while not wait_all(0.5):
                if time.monotonic() - last >= self.progress_every:
                    last = time.monotonic()
                    self.print_progress(len(outcomes), len(jobs))
        except KeyboardInterrupt:
            self.stop.set()
            say("interrupted: stopping the running jobs (complete sessions are kept; a re-run resumes)")
            self.stop_running()
            wait_all(30)
            self.after_stop()
        with self.lock:
            finished = {o.job.key for o in outcomes}
            outcomes += [
                Outcome(j, INTERRUPTED, s.label, note="stopped by a signal; a re-run resumes")
                for j, s in taken.values()
                if j.key not in finished
            ]
            outcomes += [Outcome(j, INTERRUPTED if self.stop.is_set() else FAILED, note="not started") for j in queue]
        return outcomes

    def print_progress(self, finished: int, total: int) -> None:
        with self.lock:
            active = list(self.active.values())
        if active:
            say(f"progress: {finished}/{total} jobs finished, {len(active)} running")
            for slot, p in sorted(active, key=lambda a: a[0]):
                say(p.line(slot))

    def follow(self, job: Job, slot: Slot, chunks, log_path: Path, progress: Progress, per_session: dict) -> None:
        """Write a job's output (an iterable of byte chunks) to its log, feeding its lines to `progress`."""
        with open(log_path, "wb") as log:
            buf = b""
            for chunk in chunks:
                log.write(chunk)
                log.flush()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    progress.feed(line.decode(errors="replace"), per_session)

    def judge(
        self, job: Job, slot: Slot, code: int, seconds: float, log_path: Path, total_runs: int, expect_build: str | None
    ) -> Outcome:
        """A finished job's outcome: interrupted, failed (exit code, killed, incomplete or wrongly served runs) or
        done."""
        if self.stop.is_set():
            return Outcome(job, INTERRUPTED, slot.label, seconds, "stopped by a signal; a re-run resumes")
        if code != 0:
            tail = last_error(log_path)
            why = "killed" if code in (137, 143, -9, -15) else f"exit {code}"
            return Outcome(job, FAILED, slot.label, seconds, f"{why}: {tail}; log {log_path}")
        problem = check_manifests(self.results / job.cfg.name / job.plan, expect_build)
        if problem:
            return Outcome(job, FAILED, slot.label, seconds, problem)
        return Outcome(job, DONE, slot.label, seconds, f"{total_runs} runs complete")


def job_logs(results: Path, job: Job, kind: str, slot: Slot) -> Path:
    """`<results>/<config>/<plan>/logs/<kind>-<time>-<slot>.log` (the directory made)."""
    logs = results / job.cfg.name / job.plan / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    return logs / f"{kind}-{time.strftime('%Y%m%dT%H%M%S')}-{re.sub(r'[^a-zA-Z0-9_.-]', '-', slot.label)}.log"


@dataclass
class Fanout(FanoutBase):
    """The Docker back-end: one container per job (see the module's docstring)."""

    client: object
    images: dict  # engine kind -> SDK Image
    expect_build: dict  # engine kind -> expected /props build_info (or None)
    results: Path
    weights: Path | None
    hf_cache: Path | None
    episodes: int | None = None
    user: str = field(default_factory=lambda: f"{os.getuid()}:{os.getgid()}")
    progress_every: float = 60.0
    shm_size: dict = field(default_factory=dict)

    def __post_init__(self):
        self._init_fanout()
        self.containers: dict[str, object] = {}

    def command(self, job: Job) -> list[str]:
        cmd = ["run", job.config_path, "--plan", job.plan, "--results", "/results"]
        return cmd + (["--episodes", str(self.episodes)] if self.episodes else [])

    def volumes(self, job: Job) -> dict:
        vols = {str(self.results.resolve()): {"bind": "/results", "mode": "rw"}}
        if self.weights and self.weights.is_dir():
            vols[str(self.weights.resolve())] = {"bind": "/weights", "mode": "ro"}
        for src, dst in workloads.get(job.cfg.workload.name).container_mounts(job.cfg, self.hf_cache).items():
            vols[src] = {"bind": dst, "mode": "ro"}
        return vols

    def start(self, job: Job, slot: Slot, name: str):
        image = self.images[job.engine]
        return start_container(
            self.client,
            image.id,
            self.command(job),
            name=name,
            user=self.user,
            volumes=self.volumes(job),
            device_ids=list(slot.device_ids),
            environment={"ARTIFACT_IMAGE": (image.tags or [image.id])[0], "ARTIFACT_IMAGE_ID": image.id},
            labels={"artifact.job": job.key},
            shm_size=self.shm_size.get(job.engine),
        )

    def run_job(self, job: Job, slot: Slot) -> Outcome:
        import docker

        t0 = time.monotonic()
        total, per_session = runs_per_session(load_plan(job.plan))
        progress = Progress(job, total)
        log_path = job_logs(self.results, job, "container", slot)
        name = f"prefix-cache-{re.sub(r'[^a-zA-Z0-9_.-]', '-', job.key)}-{os.getpid()}"
        try:
            container = self.start(job, slot, name)
        except docker.errors.APIError as exc:
            remove_quietly(self.client, name)
            err = host.gpu_runtime_error(exc) if host.is_gpu_runtime_error(exc) else exc
            return Outcome(job, FAILED, slot.label, time.monotonic() - t0, str(err).splitlines()[0][:300])
        with self.lock:
            self.active[job.key] = (slot.label, progress)
            self.containers[job.key] = container
            late = self.stop.is_set()  # stopped while this container was being started: stop_running missed it
        if late:
            container.stop(timeout=20)
        say(f"[{slot.label}] {job.key}: started ({job.engine}, container {container.short_id}, log {log_path})")
        try:
            self.follow(job, slot, container.logs(stream=True, follow=True), log_path, progress, per_session)
            code = container.wait().get("StatusCode", -1)
        finally:
            with self.lock:
                self.active.pop(job.key, None)
                self.containers.pop(job.key, None)
            remove_quietly(self.client, container.id)
        return self.judge(job, slot, code, time.monotonic() - t0, log_path, total, self.expect_build.get(job.engine))

    def stop_running(self) -> None:
        with self.lock:
            self.stopped = list(self.containers.values())
        for c in self.stopped:  # SIGTERM: the protocol stops its server, the run stays 'incomplete'
            try:
                c.stop(timeout=20)
            except Exception:
                pass

    def after_stop(self) -> None:
        for c in getattr(self, "stopped", []):
            remove_quietly(self.client, c.id)


def start_container(
    client,
    image: str,
    command: list[str],
    *,
    name: str,
    user: str,
    volumes: dict,
    device_ids: list[str],
    environment: dict,
    labels: dict,
    shm_size: str | None = None,
):
    """A detached container with no network, as `user`, with one GPU per device id (none: no GPU request)."""
    kwargs = {"device_requests": host.gpu_request(device_ids)} if device_ids else {}
    if shm_size:
        kwargs["shm_size"] = shm_size
    # init: a minimal init as PID 1 forwards `docker stop`'s SIGTERM to the CLI (PID 1 would ignore it until the
    # CLI's own handler is installed) and reaps llama-server should it outlive its parent.
    return client.containers.run(
        image,
        command,
        name=name,
        detach=True,
        network_mode="none",
        user=user,
        volumes=volumes,
        environment=environment,
        labels=labels,
        init=True,
        **kwargs,
    )


def remove_quietly(client, name_or_id: str) -> None:
    try:
        client.containers.get(name_or_id).remove(force=True)
    except Exception:
        pass


def last_error(log_path: Path) -> str:
    """The container log's last 'error:' line (the CLI's one-line errors), else its last line."""
    try:
        lines = [ln.strip() for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    errors = [ln for ln in lines if ln.startswith(("error:", "interrupted"))]
    return (errors or lines or ["no output"])[-1][:200]


def check_manifests(pdir: Path, expect_build: str | None) -> str | None:
    """None if every run under `pdir` is complete (and was served by the expected engine build), else why not."""
    runs = find_runs(pdir)
    if not runs:
        return f"no runs under {pdir}"
    for run in runs:
        if not run.complete:
            return f"{run.path.name} is not complete"
        build = run.manifest.get("engine_build")
        if expect_build and build != expect_build:
            return f"{run.path.name} was served by {run.manifest.get('engine') or 'its engine'} {build}, the image should hold {expect_build}"
    return None
