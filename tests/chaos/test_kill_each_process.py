"""Chaos: kill -9 each process of a running ``switchyard up`` under steady traffic.

ONE real ``up`` for the module (embedded PostgreSQL; Redis through Sentinel: a primary, a replica
and 3 Sentinels of the test's own, given to ``up`` as ``REDIS_URL=redis+sentinel://...``; the
real vLLM CPU engine serving the demo model, free ports, a private var directory). For each
victim, in order — the web process, the Celery worker, the Celery beat holding the schedule's
lease, the Sentinel-managed Redis primary, the router, then the vLLM engine's API server and its
engine core (last: each costs an engine restart) — three clients stream short chat completions
through the router (deadline 20 s each) while the victim gets SIGKILL. Asserted:

- no client hangs past its deadline; no request ends with an error that is not ours (vLLM's raw
  error event or document);
- killing the web process, the Celery worker (which started the model's replicas: they outlive
  it), the beat or the Redis primary fails no request at all;
- the Redis primary: the Sentinels promote the replica and the router leaves its fallback
  (``switchyard_admission_redis_fallback``, sampled every 0.1 s: 1 during the failure, 0 after;
  the failover ends well within ``SwitchyardRouterRedisFallback``'s ``for``, so that page stays
  quiet: promtool's cases show it firing past it); a key revoked during the failure is refused by
  the router within REVOKED_WITHIN_S of its end (goal 5 s); every request of the window is in
  the ledger once;
- the beat: a beat process (``up`` restarts the killed one) holds the lease again and sends the
  schedule within the lease + its standby poll (``config/beat_lock.py``), and every request of
  the window is in the ledger once: 0 usage records lost, none twice;
- every stream ends with success or our terminal event and ``[DONE]``; only the router's own
  death may cut a stream it was serving (nobody is left to write the terminal event) or refuse
  connections while it is down;
- the victim is back (its own check) and the platform serves again (a request started after
  the kill succeeds) within a bound: 180 s for the engine on CPU, 15 s for the others (goals
  60 s and 5 s; the measured times are printed);
- after the engine kills exactly one engine API server and one engine core run (the old
  engine's processes are gone);
- at the end, after ``up`` is stopped (Ctrl-C), no process of its tree or of vLLM is left.

Run it: ``pytest tests/chaos -s`` (about 5 minutes on 2 cores; ``-s`` shows the times;
``SWITCHYARD_CHAOS_LOGS=<dir>`` keeps ``up``'s and vLLM's logs there, as a failure always does).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from fixtures.platform_up import PlatformUp, http_status
from fixtures.redis_sentinel import SentinelRedis, sentinel_redis
from fixtures.wait import eventually
from signals import FALLBACK_ALERT, FallbackWatch, Revoker, alert_for_s, key_status
from traffic import CLIENT_SLACK_S, DEADLINE_S, Result, Traffic

from config import beat_lock
from runtime import redis_conn
from runtime.procs import cmdline, pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.timing]

# goal 60 s (vLLM on CPU restarts with a fresh warm-up); measured 97-109 s with the 2-core
# machine shared by other test runs, hence the margin
ENGINE_BOUND_S = 180.0
OTHER_BOUND_S = 15.0  # goal 5 s
# a key revoked during a failure is refused this soon after its end: goal 5 s (issue #30); the
# margin is the loaded 2-core machine's, as for the other bounds (the measured time is printed)
REVOKED_WITHIN_S = 10.0
SETTLE_S = 3.0  # traffic kept running once everything is back
HANG_SLACK_S = 2.0  # a request may end this much after its deadline

API_SERVER = r"vllm\.entrypoints\.openai\.api_server"
ENGINE_CORE = r"VLLM::EngineCore"
REPLICA = r"manage\.py serve_model"  # the worker supervisor `up`'s autoscaler started
MEASURED: dict[str, dict[str, float | int | str]] = {}


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def leaders(pids: list[int]) -> list[int]:
    """The processes of ``pids`` whose parent is not one of them (a prefork pool's master)."""
    return [pid for pid in pids if _ppid(pid) not in pids]


def engine_port(pid: int) -> int:
    """The port of the engine ``pid`` belongs to: the ``--port`` on its vLLM API server's
    command line (an engine core's parent is its API server; 0 when none is found)."""
    for candidate in (pid, _ppid(pid)):
        argv = cmdline(candidate).split()
        if "--port" in argv:
            return int(argv[argv.index("--port") + 1])
    return 0


def engine_generating(port: int) -> bool:
    """vLLM's own gauge: a request is running in the engine now (not only in a client's
    socket buffer: a loaded client may read a finished stream late)."""
    url = f"http://127.0.0.1:{port}/metrics"
    with urllib.request.urlopen(url, timeout=2.0) as response:
        text = response.read().decode()
    running = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    return any(float(line.rsplit(" ", 1)[1]) > 0 for line in running)


def redis_pings(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as conn:
        conn.sendall(b"PING\r\n")
        return conn.recv(16).startswith(b"+PONG")


def beat_holder(up: PlatformUp) -> int:
    """The pid of the beat holding the lease, from its heartbeat (0 when none)."""
    client = redis_conn.from_url(up.redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    try:
        raw = client.get(beat_lock.heartbeat_key(beat_lock.beat_namespace()))
    finally:
        client.close()
    return int(raw.decode().split(" ", 1)[1].split(":")[1]) if raw else 0


def usage_records(up: PlatformUp) -> int:
    """How many usage records ``up``'s ledger holds (its embedded PostgreSQL)."""
    url = f"postgresql://postgres@127.0.0.1:{up.ports['pg-port']}/switchyard"
    with psycopg.connect(url, connect_timeout=3) as conn:
        row = conn.execute("SELECT count(*) FROM billing_usagerecord").fetchone()
    return int(row[0]) if row else 0


def settled_usage_records(up: PlatformUp) -> int:
    """The ledger's count once it stops moving (the usage stream consumed): the same for 3 s."""
    seen: list[tuple[float, int]] = []

    def settled() -> tuple[int] | None:  # a tuple: a count of 0 is an answer too
        seen.append((time.monotonic(), usage_records(up)))
        same = [t for t, n in seen if n == seen[-1][1]]
        return (seen[-1][1],) if seen[-1][0] - same[0] >= 3.0 else None

    return eventually(settled, timeout=60.0, interval=0.5, what="the ledger settled")[0]


@dataclass(frozen=True)
class Victim:
    name: str
    pattern: str  # its command line (a regex), among the platform's processes
    engine: bool = False  # killing it costs an engine restart
    outside: bool = False  # not one of up's processes (the Sentinel-managed primary)

    def back(
        self, up: PlatformUp, killed: int, before: str, group: SentinelRedis, watch: FallbackWatch
    ) -> Callable[[], bool]:
        """Whether the victim is back, its own check (``before``: up's output at the kill;
        ``group``/``watch``: the Sentinel group and the router's fallback gauge)."""
        replaced = lambda: any(p != killed for p in leaders(up.find(self.pattern)))  # noqa: E731
        if self.name == "web":
            return lambda: replaced() and http_status(f"{up.web}/admin/login/") == 200
        if self.name == "celery-worker":
            ready = lambda: up.output[len(before) :].count(" ready.") >= 1  # noqa: E731
            return lambda: replaced() and ready()
        if self.name == "redis-primary":  # a replica promoted, the router on Redis again
            new = lambda: group.master_port() != group.primary.port  # noqa: E731
            return lambda: new() and redis_pings(group.master_port()) and watch.latest() == 0
        if self.name == "router":
            return lambda: replaced() and http_status(f"{up.router}/readyz") == 200
        if self.name == "beat":  # another beat took the lease (after it expired)
            return lambda: beat_holder(up) not in (0, killed) and pid_alive(beat_holder(up))
        return replaced  # the engine: serving again is its check


VICTIMS = [
    Victim("web", r"uvicorn config\.asgi:application"),
    # celery renames its master "[celeryd: celery@host:MainProcess] ... (-A config worker ...)"
    Victim("celery-worker", r"celeryd: \S+:MainProcess|celery -A config worker"),
    # celery renames it "[celery beat] -A config beat ..."
    Victim("beat", r"\[celery beat\]|celery -A config beat"),
    Victim("redis-primary", r"redis-server", outside=True),
    Victim("router", r"-m runtime\.gateway"),
    Victim("engine-api-server", API_SERVER, engine=True),
    Victim("engine-core", ENGINE_CORE, engine=True),
]


@pytest.fixture(scope="module")
def sentinel() -> Iterator[SentinelRedis]:
    """The Redis ``up`` uses: a primary, a replica and 3 Sentinels (stopped after ``up``)."""
    directory = Path(tempfile.mkdtemp(prefix="switchyard-chaos-redis-"))
    try:
        with sentinel_redis(directory) as group:
            yield group
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def up(request: pytest.FixtureRequest, sentinel: SentinelRedis) -> Iterator[PlatformUp]:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    # outside pytest's basetemp: the embedded PostgreSQL runs as another user
    var = Path(tempfile.mkdtemp(prefix="switchyard-chaos-"))
    platform = PlatformUp(var, env={"REDIS_URL": sentinel.url})
    try:
        ready_s = platform.wait_model_ready()
        print(f"\nchaos: up's model ready after {ready_s:.0f} s")
        yield platform
    finally:
        if platform.proc.poll() is None:
            platform.kill()
        wanted = os.environ.get("SWITCHYARD_CHAOS_LOGS")  # a directory: keep them there
        if wanted or request.session.testsfailed:  # keep the logs for a look
            logs = Path(wanted or tempfile.mkdtemp(prefix="switchyard-chaos-logs-"))
            logs.mkdir(parents=True, exist_ok=True)
            if platform.log.exists():
                shutil.copy(platform.log, logs / "up.log")
            if (var / "log" / "replicas").is_dir():  # the replicas' and their engines' logs
                shutil.copytree(var / "log" / "replicas", logs / "replicas", dirs_exist_ok=True)
            print(f"\nchaos: logs kept in {logs}")
        shutil.rmtree(var, ignore_errors=True)


def poll(check: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``check()`` held within ``timeout_s`` (polled every 20 ms; errors: not yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return True
        time.sleep(0.02)
    return False


def first_ok_after(results: list[Result], moment: float) -> float | None:
    ends = [r.ended for r in results if r.started >= moment and r.outcome == "ok"]
    return min(ends) - moment if ends else None


def check_results(victim: Victim, results: list[Result], killed_at: float) -> Counter[str]:
    outcomes = Counter(r.outcome for r in results)
    assert outcomes["ok"] > 0, outcomes
    hung = [r for r in results if r.outcome == "hang" or r.took_s > DEADLINE_S + HANG_SLACK_S]
    assert not hung, hung[:3]
    raw = [r for r in results if r.outcome == "raw_error"]
    assert not raw, raw[:3]
    cut = [r for r in results if r.outcome == "cut"]
    unreachable = [r for r in results if r.outcome == "unreachable"]
    if victim.name == "router":  # in flight at the kill: nobody left to end them
        assert all(r.started <= killed_at for r in cut), cut[:3]
    else:
        assert not cut, cut[:3]
        assert not unreachable, unreachable[:3]
    if not victim.engine and victim.name != "router":  # serving never needs it: all succeed
        assert set(outcomes) == {"ok"}, outcomes
    return outcomes


LEDGER_CHECKED = ("beat", "redis-primary")


def billed_once(up: PlatformUp, before: int, billed: int) -> None:
    """The ledger gains exactly ``billed`` usage records, and no more arrive."""
    # 60 s: after a Redis failover the usage consumer reconnects with backoff; on a slow run
    # (CI, 2026-11-27: 30 s was not enough once) the last records come late. Exactly once is
    # still asserted below: a late record counts, a lost or doubled one fails.
    try:
        ledger = eventually(
            lambda: (n := usage_records(up)) >= before + billed and n,
            timeout=60.0, interval=0.5, what=f"{billed} usage records in the ledger",
        )  # fmt: skip
    except AssertionError as exc:  # how many did arrive: late, or lost?
        raise AssertionError(f"{exc}; {usage_records(up) - before} of {billed} arrived") from None
    assert ledger == before + billed, (before, billed, ledger)
    assert settled_usage_records(up) == ledger  # and no more arrive


def revocation_after(up: PlatformUp, revoker: Revoker, ended: float) -> float:
    """Seconds from the failure's end (``ended``) until the router refuses the revoked key;
    at most REVOKED_WITHIN_S."""
    up.wait_for("the revoked key refused", lambda: key_status(up.router, revoker.key) == 401,
                OTHER_BOUND_S + REVOKED_WITHIN_S)  # fmt: skip
    took = max(0.0, time.monotonic() - ended)
    revoker.revoked()
    assert took <= REVOKED_WITHIN_S, f"revocation reached the router {took:.2f} s after the end"
    return took


def fallback_signal(watch: FallbackWatch) -> float:
    """The router showed the failure (its fallback gauge 1) and cleared it, within the
    Redis-fallback alert's ``for`` (a failover is not a page); how long it showed it."""
    raised = watch.raised_s()
    assert raised > 0, watch.samples[-20:]
    assert watch.latest() == 0, watch.samples[-20:]
    assert raised < alert_for_s(FALLBACK_ALERT), raised
    return raised


@pytest.mark.timeout(900)
@pytest.mark.parametrize("victim", VICTIMS, ids=[v.name for v in VICTIMS])
def test_kill_9_under_traffic(up: PlatformUp, sentinel: SentinelRedis, victim: Victim) -> None:
    ledger_before = settled_usage_records(up) if victim.name in LEDGER_CHECKED else 0
    stack = contextlib.ExitStack()
    watch = FallbackWatch(up.router)
    revoker: Revoker | None = None
    if victim.outside:  # the Redis primary: the router's fallback gauge, a key to revoke
        revoker = stack.enter_context(contextlib.closing(Revoker(up.command_env())))
        key = revoker.key
        up.wait_for("the new key valid at the router", lambda: key_status(up.router, key) == 200,
                    30.0)  # fmt: skip
        stack.enter_context(watch)
    traffic = Traffic(router=up.router, api_key=up.api_key()).start()
    try:
        up.wait_for("traffic flowing", lambda: first_ok_after(traffic.snapshot(), 0) is not None,
                    60.0)  # fmt: skip
        targets = [sentinel.primary.pid] if victim.outside else leaders(up.find(victim.pattern))
        # one of each, but the autoscaler may run a second model replica (pool max 2)
        assert len(targets) == 1 or (victim.engine and targets), (
            victim.pattern, [cmdline(p) for p in targets])  # fmt: skip
        killed = targets[0]
        up.engine_ports.update(engine_port(p) for p in leaders(up.find(API_SERVER)))
        before = up.output
        # kill while client 0's long stream runs, so that a stream is cut mid-way
        mid_stream = traffic.long_streaming.wait(timeout=30.0)
        if victim.engine:  # and the engine generating it (of the replicas the autoscaler runs)
            busy = [p for p in targets if engine_port(p)]
            mid_stream = mid_stream and poll(
                lambda: any(engine_generating(engine_port(p)) for p in busy), 30.0
            )
            with contextlib.suppress(OSError, ValueError):
                killed = next((p for p in busy if engine_generating(engine_port(p))), killed)
        killed_at = time.monotonic()
        os.kill(killed, signal.SIGKILL)
        if revoker is not None:  # revoked while the primary is down
            revoker.revoke()
        bound = ENGINE_BOUND_S if victim.engine else OTHER_BOUND_S
        back = victim.back(up, killed, before, sentinel, watch)
        try:
            back_s = up.wait_for(f"{victim.name} back", back, bound)
        except pytest.fail.Exception as exc:
            if not victim.outside:
                raise
            pytest.fail(f"{exc}\nthe Sentinel group:\n{sentinel.diagnosis()}")
        if revoker is not None:
            revoked_s = revocation_after(up, revoker, killed_at + back_s)
        serving_s = up.wait_for(
            "serving again",
            lambda: first_ok_after(traffic.snapshot(), killed_at) is not None,
            bound,
        )
        serving_s = first_ok_after(traffic.snapshot(), killed_at) or serving_s
        time.sleep(SETTLE_S)  # scenario: traffic on the recovered platform, not a sync
    finally:
        results = traffic.stop()
        stack.close()
    outcomes = check_results(victim, results, killed_at)
    terminal = sum(n for outcome, n in outcomes.items() if outcome.startswith("terminal:"))
    # The stream the engine was serving ended with our event. (The long stream can finish in
    # the instant between seeing the engine generate and the kill: then no request spans the
    # kill, or those that do were whole before it, their last bytes still on the way, and end
    # ok; either way no stream was cut and there is none to judge.)
    around = [r for r in results if r.started <= killed_at <= r.ended and r.outcome != "ok"]
    if victim.engine and mid_stream and around:
        assert terminal >= 1, (outcomes, around)
    assert not pid_alive(killed)
    if victim.name in LEDGER_CHECKED:  # each request billed once: none lost, none twice
        billed_once(up, ledger_before, billed=len(results))  # all of them ok (check_results)
    if victim.outside:
        fallback_s = fallback_signal(watch)
        print(f"\nchaos: {victim.name}: the fallback gauge read 1 for {fallback_s:.2f} s "
              f"(first 1 to first 0 sampled); revoked key refused {revoked_s:.2f} s after the "
              f"failure's end")  # fmt: skip
    if victim.engine:  # the old engine's processes are gone: one engine per model replica
        replicas = len(leaders(up.find(REPLICA)))
        assert replicas >= 1, up.find(REPLICA)
        assert len(leaders(up.find(API_SERVER))) == replicas, up.find(API_SERVER)
        assert len(up.find(ENGINE_CORE)) == replicas, up.find(ENGINE_CORE)
    MEASURED[victim.name] = {"back_s": round(back_s, 2), "serving_s": round(serving_s, 2),
                             "requests": len(results), **outcomes}  # fmt: skip
    print(
        f"\nchaos: kill -9 {victim.name}: back {back_s:.2f} s, serving again {serving_s:.2f} s "
        f"after the kill (mid-stream: {mid_stream}); {len(results)} requests: {dict(outcomes)}"
    )


@pytest.mark.timeout(300)
def test_nothing_is_left_after_up_stops(up: PlatformUp) -> None:
    assert up.pids(), "the platform is not running"
    up.engine_ports.update(engine_port(p) for p in leaders(up.find(API_SERVER)))
    code = up.stop()
    assert code == 0, up.output[-4000:]
    assert up.leftovers() == []
    stray = [
        f"{p}: {cmdline(p)}"
        for p in (int(e.name) for e in Path("/proc").glob("[0-9]*"))
        if p != os.getpid()
        and any(f"--port {port}" in cmdline(p) for port in up.engine_ports if port)
    ]
    assert stray == []
    print("\nchaos: measured recovery (seconds after kill -9):")
    for name, figures in MEASURED.items():
        print(f"chaos:   {name:<18} {figures}")
    print(f"chaos: deadline {DEADLINE_S:g} s per request, client timeout +{CLIENT_SLACK_S:g} s")
