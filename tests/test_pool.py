"""The Ray pool: work fans out to actors and comes back in order, and starting it contacts nothing
but loopback and unix sockets (checked with strace inside an isolated network namespace)."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]

POOL_SCRIPT = textwrap.dedent("""
    import sys
    from dataclasses import replace
    import pipelines
    from pathlib import Path as _Path
    from pipelines.config.params import load_params
    P = load_params(_Path(pipelines.__file__).resolve().parents[1] / "params.yaml")  # the other keys
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import TraceContext
    from wise.engine.runner import WiseSettings
    items = [{"example_id": f"ex{i}", "token_ids": list(range(3, 3 + 20 + i))} for i in range(3)]
    ctx = TraceContext(WiseSettings(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9,
                                    backend="reference"), init_seed=0,
                       topk=16, diagnostics=True)
    with WorkerPool(replace(P.model, source="preset:tiny-random@0"), replace(P.compute, num_workers=2), 3) as pool:
        out = pool.map("trace", items, ctx)
    assert [o["example_id"] for o in out] == ["ex0", "ex1", "ex2"], out
    assert out[2]["masses"].shape[:2] == (4, 2)
    print("POOL-OK", len(pool.actors))
""")

# The same start without the project's precautions: the detector must see the probes.
UNPROTECTED_SCRIPT = textwrap.dedent("""
    import ray
    ray.init(num_cpus=1, include_dashboard=False)
    ray.shutdown()
    print("RAY-OK")
""")

INET = re.compile(r'connect\(\d+, \{sa_family=AF_INET6?, .*?(?:inet_addr\("([^"]+)"\)|inet_pton\(AF_INET6, "([^"]+)")')
LOOPBACK = {"127.0.0.1", "::1", "::ffff:127.0.0.1"}


def _traced(script: str, tmp_path, env_extra=None) -> tuple[subprocess.CompletedProcess, set[str]]:
    log = tmp_path / "strace.log"
    code = tmp_path / "script.py"
    code.write_text(script)
    inner = f"ip link set lo up 2>/dev/null; exec strace -f -qq -e trace=connect -o {log} {sys.executable} {code}"
    cmd = ["unshare", "-n", "bash", "-c", inner]
    # Ray's unix socket paths must stay under 107 bytes: a short temp dir, not pytest's tmp_path.
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="wr", dir="/tmp"), **(env_extra or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    addrs = set()
    for line in log.read_text().splitlines():
        m = INET.search(line)
        if m:
            addrs.add(m.group(1) or m.group(2))
    return proc, addrs


def _can_isolate() -> bool:
    if not shutil.which("strace") or not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_isolate(), reason="needs strace and unshare -n (root)")
def test_pool_start_contacts_only_loopback(tmp_path):
    proc, addrs = _traced(POOL_SCRIPT, tmp_path)
    assert "POOL-OK" in proc.stdout, proc.stderr[-3000:]
    assert addrs, "strace saw no inet connect at all: the check would be vacuous"
    assert addrs <= LOOPBACK, f"non-loopback addresses contacted: {sorted(addrs - LOOPBACK)}"


@pytest.mark.skipif(not _can_isolate(), reason="needs strace and unshare -n (root)")
def test_detector_sees_probes_of_an_unprotected_ray_start(tmp_path):
    # Inside the isolated namespace nothing can leave; this only proves the check can fail.
    clean_env = {k: "" for k in ("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER",)}
    proc, addrs = _traced(UNPROTECTED_SCRIPT, tmp_path, env_extra={"HOME": str(tmp_path), **clean_env})
    assert addrs - LOOPBACK, f"expected non-loopback probes, saw only {sorted(addrs)}"


# Kill both actors mid-map (one running an item, one just freed): each is replaced, its item
# resubmitted, and the map yields every item exactly once, in order; every live actor loaded its
# model once. With no retries left, the error names the example. Run in a subprocess like the
# scripts above, so no Ray state stays in the test process.
KILL_SCRIPT = textwrap.dedent("""
    import dataclasses
    import ray
    from dataclasses import replace
    import pipelines
    from pathlib import Path as _Path
    from pipelines.config.params import load_params
    P = load_params(_Path(pipelines.__file__).resolve().parents[1] / "params.yaml")  # the other keys
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import TraceContext
    from wise.engine.runner import WiseSettings
    items = [{"example_id": f"ex{i}", "token_ids": list(range(3, 3 + 40 + i))} for i in range(6)]
    ctx = TraceContext(WiseSettings(steps=12, discovery_step=4, window=2, block_size=16, eta=0.9,
                                    backend="reference"), init_seed=0,
                       topk=16, diagnostics=True)
    with WorkerPool(replace(P.model, source="preset:tiny-random@0"), replace(P.compute, num_workers=2, max_retries=1),
                    len(items)) as pool:
        first = pool.stats()
        assert [s["model_loads"] for s in first] == [1, 1], first
        out = []
        for result in pool.imap("trace", items, ctx):
            out.append(result)
            if len(out) == 1:  # items are still pending: kill every actor
                for actor in list(pool.actors):
                    ray.kill(actor)
        assert [o["example_id"] for o in out] == [it["example_id"] for it in items], out
        assert all(o["masses"].shape[:2] == (12, 2) for o in out)
        assert pool.replaced == 2, pool.replaced
        now = pool.stats()  # a replacement still loading its model when the map ended is not listed yet
        assert 1 <= len(now) <= 2 and all(s["model_loads"] == 1 for s in now), now  # once per actor, not per item
        assert not {s["pid"] for s in now} & {s["pid"] for s in first}, (first, now)
        # The new actors ran at least the item lost with the busy actor (the killed actors may
        # have finished several items before the first result came back in order).
        assert sum(s["items"] for s in now) >= 1, now
        print("RETRIED-OK")
        pool.compute = dataclasses.replace(pool.compute, max_retries=0)
        try:
            for n, _ in enumerate(pool.imap("trace", items, ctx)):
                if n == 0:  # every actor, also one still loading its model
                    for actor in [*pool.actors, *pool.starting.values()]:
                        ray.kill(actor)
        except RuntimeError as exc:
            print("FINAL-ERROR", str(exc).splitlines()[0])
""")


def _run_ray_script(tmp_path, text: str) -> subprocess.CompletedProcess:
    """Run a driver script in its own process, with its own Ray temp dir."""
    script = tmp_path / "driver.py"
    script.write_text(text)
    env = {**os.environ, "RAY_TMPDIR": tempfile.mkdtemp(prefix="wr", dir="/tmp"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env,
                          timeout=300, cwd=ROOT)


def test_killed_actors_are_replaced_and_every_item_comes_back_once(tmp_path):
    proc = _run_ray_script(tmp_path, KILL_SCRIPT)
    assert "RETRIED-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]
    # One id when only the running item was lost; more when the driver also sent items to the
    # killed idle actor before it knew.
    assert re.search(r"FINAL-ERROR trace: (example ex\d failed: its actor died 1 time\(s\)|examples ex\d(, ex\d)+ "
                     r"failed: the actor running each died more than that many times) "
                     r"\(compute.max_retries = 0\)", proc.stdout), proc.stdout[-2000:]


# Two items on two actors: once the first result is in, kill both and wait until the driver
# knows they are dead. The idle one died with the busy one, so the busy one's item must not be
# retried on it (that second death would be charged to the item and exhaust max_retries = 1):
# the pool pings its idle actors after a death and the retry waits for a replacement.
RETRY_SCRIPT = textwrap.dedent("""
    import time
    import ray
    from ray.exceptions import RayActorError
    from dataclasses import replace
    import pipelines
    from pathlib import Path as _Path
    from pipelines.config.params import load_params
    P = load_params(_Path(pipelines.__file__).resolve().parents[1] / "params.yaml")  # the other keys
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import TraceContext
    from wise.engine.runner import WiseSettings
    # ex1 runs for seconds (2000 tokens, 32 steps), ex0 for milliseconds: ex1 is still running
    # when ex0 comes back.
    items = [{"example_id": f"ex{i}", "token_ids": list(range(3, 3 + n))} for i, n in enumerate((20, 2000))]
    ctx = TraceContext(WiseSettings(steps=32, discovery_step=4, window=2, block_size=16, eta=0.9,
                                    backend="reference"), init_seed=0,
                       topk=16, diagnostics=True)
    with WorkerPool(replace(P.model, source="preset:tiny-random@0"), replace(P.compute, num_workers=2, max_retries=1),
                    len(items)) as pool:
        first = list(pool.actors)
        assert len(first) == 2, first
        out = []
        for result in pool.imap("trace", items, ctx):
            out.append(result["example_id"])
            if len(out) == 1:
                assert [e for e, _ in pool.in_flight()] == ["ex1"], pool.in_flight()
                for actor in first:
                    ray.kill(actor)
                # ray.kill goes through the GCS while a call goes straight to the actor, so an
                # idle actor may still answer a call or two before the kill lands: poll until it
                # stops, and fail only if it still answers after the deadline
                deadline = time.monotonic() + 60
                for actor in first:
                    while True:
                        try:
                            ray.get(actor.ready.remote(), timeout=60)
                        except RayActorError:
                            break
                        if time.monotonic() > deadline:
                            raise SystemExit("a killed actor still answers")
                        time.sleep(0.1)
        assert out == ["ex0", "ex1"], out
        assert pool.died == 2 and pool.replaced >= 1, (pool.died, pool.replaced)
        print("RETRY-ON-A-LIVE-ACTOR-OK")
""")


def test_a_retry_does_not_go_to_an_idle_actor_that_died_too(tmp_path):
    proc = _run_ray_script(tmp_path, RETRY_SCRIPT)
    assert "RETRY-ON-A-LIVE-ACTOR-OK" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_a_failing_task_names_its_example():
    from dataclasses import replace
    import pipelines
    from pathlib import Path as _Path
    from pipelines.config.params import load_params
    P = load_params(_Path(pipelines.__file__).resolve().parents[1] / "params.yaml")  # the other keys
    from pipelines.compute.pool import WorkerPool
    from pipelines.compute.tasks.contexts import TraceContext
    from wise.engine.runner import WiseSettings

    items = [{"example_id": "ok", "token_ids": list(range(3, 40))}, {"example_id": "broken"}]
    ctx = TraceContext(WiseSettings(steps=4, discovery_step=2, window=1, block_size=16, eta=0.9, backend="reference"),
                       init_seed=0,
                       topk=16, diagnostics=True)
    with WorkerPool(replace(P.model, source="preset:tiny-random@0"), replace(P.compute, executor="local"), 2) as pool:
        with pytest.raises(KeyError) as err:  # the task's own error type, not retried
            pool.map("trace", items, ctx)
        assert "trace: while running example broken" in err.value.__notes__
        assert pool.stats()[0]["model_loads"] == 1 and pool.stats()[0]["items"] == 1
