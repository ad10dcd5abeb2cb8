"""The public API on real jails: results, limits, files, persistent sessions, back-pressure,
infrastructure failures and retries, worker recycling, the probe and the refusal to run unisolated."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
import time

import pytest

import sandboxes
from sandboxes import api, jail
from sandboxes import worker as worker_module
from sandboxes.pool import IdleSlots

pytestmark = pytest.mark.timeout(120)
LOCAL_OK = not sandboxes.probe(docker=False).local_missing
needs_local = pytest.mark.skipif(not LOCAL_OK, reason="local isolation unavailable on this host")


def local_pool(**options):
    """The shared pool behind sandboxes.open("local", **options) (for stats and fault injection)."""
    for key, backend in api._backends.items():
        if key[0] == "local" and dict(key[2]) == {k: api._hashable(v) for k, v in options.items()}:
            return backend.pool
    raise LookupError(options)


def kill_group(launcher: int) -> None:
    """SIGKILL a worker's jail (bwrap) from outside: an infrastructure failure, not the snippet's.
    Its launcher survives to reap it, as it would after any crash."""
    with contextlib.suppress(OSError), open(f"/proc/{launcher}/task/{launcher}/children") as handle:
        for child in handle.read().split():
            os.kill(int(child), signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, parents first (from /proc)."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children") as handle:
                    todo += [int(child) for child in handle.read().split()]
    return found


def jail_pids(worker) -> set[int]:
    """A local worker's host pids: its launcher, everything below it, and whatever is in its cgroup."""
    return {*descendants(worker.proc.pid), *(worker.cgroup.pids() if worker.cgroup is not None else ())}


def zygote_and_below(worker) -> list[int]:
    """The worker's zygote (the outermost process running zygote.py) and every process below it."""
    for pid in descendants(worker.proc.pid):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().split(b"\0")
            if "python" in os.path.basename(argv[0].decode()) and b"/opt/sandboxes/zygote.py" in argv[:4]:
                return descendants(pid)
    raise LookupError(f"no zygote below {worker.proc.pid}")


def still_there(pids: set[int], timeout_s: float = 5.0) -> set[int]:
    """Those of `pids` that /proc still lists (zombies included) after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while (left := {pid for pid in pids if os.path.exists(f"/proc/{pid}")}) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


@needs_local
async def test_issue_example():
    async with sandboxes.open("local", wall_s=10, cpu_s=10, memory_mb=1024, max_output_bytes=65536) as sb:
        r = await sb.run_python("print(sum(range(10)))")
        assert (r.status, r.stdout, r.stderr, r.exit_code, r.signal, r.truncated) == ("ok", "45\n", "", 0, None, False)
        assert r.provider == "local" and r.wall_ms > 0
        r = await sb.exec(["sh", "-c", "ls /"], stdin=b"")
        assert r.status == "ok" and set(r.stdout.split()) >= {"usr", "tmp", "proc"} and "root" not in r.stdout.split()


@needs_local
async def test_errors_exit_codes_and_stdin():
    async with sandboxes.open("local", workers=2) as sb:
        r = await sb.run_python("import sys; sys.exit(3)")
        assert (r.status, r.exit_code) == ("error", 3)
        r = await sb.run_python("raise ValueError('boom')")
        assert r.status == "error" and r.exit_code == 1 and "ValueError: boom" in r.stderr
        assert "zygote" not in r.stderr  # the traceback shows the snippet only
        r = await sb.run_python("import sys; print(sys.stdin.read()[::-1])", stdin="olleh")
        assert r.stdout == "hello\n"
        r = await sb.exec(["wc", "-c"], stdin=b"x" * 300_000)  # more than a pipe buffer
        assert r.stdout.strip() == "300000"
        r = await sb.exec(["no-such-program"])
        assert r.status == "error" and r.exit_code == 127 and "no-such-program" in r.stderr
        r = await sb.run_python("print('x')", wall_s=0.5)  # per-call limit override
        assert r.ok


@needs_local
async def test_files_are_written_for_the_call():
    async with sandboxes.open("local", workers=2) as sb:
        r = await sb.run_python("print(open('data/in.txt').read())", files={"data/in.txt": "payload"})
        assert r.stdout == "payload\n"
        await sb.upload("staged.txt", b"staged")  # staged: shipped with every later call
        for _ in range(3):
            assert (await sb.run_python("print(open('staged.txt').read())")).stdout == "staged\n"
        with pytest.raises(sandboxes.SandboxError, match="persistent=True"):
            await sb.download("staged.txt")


@needs_local
async def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="memory_mb=-5"):
        sandboxes.open("local", memory_mb=-5)
    with pytest.raises(ValueError, match="'nope'"):
        sandboxes.open("nope")
    async with sandboxes.open("local", workers=2) as sb:
        with pytest.raises(TypeError, match="argv"):
            await sb.exec("ls -l")
        with pytest.raises(TypeError, match="wal_s"):
            await sb.run_python("pass", wal_s=3)
        with pytest.raises(ValueError, match="wall_s=0"):
            await sb.run_python("pass", wall_s=0)


@needs_local
async def test_persistent_repl_session():
    async with sandboxes.open("local", persistent=True) as sb:
        assert (await sb.run_python("x = 40\ndef inc(v):\n    return v + 1")).ok
        r = await sb.run_python("inc(x) + 1")  # last expression is echoed, as in a notebook
        assert (r.status, r.stdout) == ("ok", "42\n")
        await sb.upload("in.txt", "uploaded")
        r = await sb.run_python("open('out.bin', 'wb').write(bytes(range(256))); print(open('in.txt').read())")
        assert r.stdout.startswith("uploaded")
        assert await sb.download("out.bin") == bytes(range(256))
        r = await sb.exec(["ls"])
        assert r.stdout.split() == ["in.txt", "out.bin"]
        r = await sb.run_python("raise KeyError('k')")
        assert r.status == "error" and "KeyError" in r.stderr
        assert (await sb.run_python("x")).stdout == "40\n"  # an exception keeps the state
        r = await sb.run_python("import time; time.sleep(30)", wall_s=0.5)
        assert r.status == "timeout" and "state was lost" in r.stderr
        r = await sb.run_python("x")
        assert r.status == "error" and "NameError" in r.stderr
        assert (await sb.run_python("import os, shutil; shutil.rmtree(os.getcwd())")).ok
        r = await sb.exec(["sh", "-c", "pwd; ls -A"])  # a new, empty work dir
        assert (r.status, r.stdout) == ("ok", "/tmp/work\n"), r
    async with sandboxes.open("local", persistent=True) as other:  # sessions never share state
        r = await other.run_python("print(globals().get('x'))")
        assert r.stdout == "None\n"


@needs_local
async def test_a_pool_holds_as_many_persistent_sessions_as_it_is_sized_for():
    """``sessions=N``: N persistent sessions open at once (an RL batch of tool episodes), each with its own state;
    one more waits for a slot rather than starting unbounded work; a size out of range names the value."""
    opened = [sandboxes.open("local", persistent=True, workers=1, sessions=40) for _ in range(40)]
    try:
        await asyncio.gather(*(sb.start() for sb in opened))
        results = await asyncio.gather(*(sb.run_python(f"x = {i}\nx") for i, sb in enumerate(opened)))
        assert [r.stdout for r in results] == [f"{i}\n" for i in range(40)]
        assert len({sb._require_session().slot for sb in opened}) == 40
        pool = local_pool(workers=1, sessions=40)
        before = dict(pool.stats)
        gives_up = sandboxes.open("local", persistent=True, workers=1, sessions=40)
        late = sandboxes.open("local", persistent=True, workers=1, sessions=40)
        leaving = asyncio.create_task(gives_up.start())
        await asyncio.sleep(0.05)
        waiting = asyncio.create_task(late.start())
        await asyncio.sleep(0.5)
        assert not waiting.done() and not leaving.done() and pool.session_waiters == 2  # queued, first come first
        leaving.cancel()  # a waiter whose episode ran out of time leaves the queue and takes no slot
        with pytest.raises(asyncio.CancelledError):
            await leaving
        assert pool.session_waiters == 1
        await opened.pop().close()
        await asyncio.wait_for(waiting, 30)
        opened.append(late)
        assert (await late.run_python("print(globals().get('x'))")).stdout == "None\n"  # a fresh REPL in the freed slot
        assert pool.stats["session_waits"] - before["session_waits"] == 2
        assert pool.stats["session_wait_s"] - before["session_wait_s"] >= 0.5 + 0.5
    finally:
        await asyncio.gather(*(sb.close() for sb in opened))
    with pytest.raises(ValueError, match="sessions=0: a pool holds 1 to"):
        await sandboxes.open("local", persistent=True, workers=1, sessions=0).start()


@needs_local
async def test_jails_of_two_pools_never_share_a_uid_or_a_cgroup():
    """Two pools (other options) each number their slots from 0; closing one pool's session must not kill the
    other's jail (it once did: both slots' cgroup was the same, and removing it killed everything in it)."""
    async with sandboxes.open("local", persistent=True, workers=1) as kept:
        assert (await kept.run_python("import os\nstate = os.getpid()")).ok
        async with sandboxes.open("local", persistent=True, workers=1, recycle_after=7) as other:
            assert local_pool(workers=1) is not local_pool(workers=1, recycle_after=7)
            launchers = [sb._session.worker.proc.pid for sb in (kept, other)]
            assert len({os.stat(f"/proc/{pid}").st_uid for pid in launchers}) == 2  # the host uids the jails run as
        assert (await kept.run_python("state")).status == "ok"  # its REPL (and so its worker) survived


OPEN_FDS = (
    "import os\nfds = []\nfor fd in range(256):\n    try:\n        os.fstat(fd)\n        fds.append(fd)\n"
    "    except OSError:\n        pass\nprint(fds)"
)


@needs_local
async def test_repl_cells_cannot_reach_or_fake_the_workers_channel():
    """A cell's code runs in the REPL process itself. It must hold no descriptor of the zygote's channel to the host
    (it could forge the zygote's replies or read the host's next request), and a report it forges on the REPL's own
    pipe ends the REPL, not the worker."""
    async with sandboxes.open("local", persistent=True) as sb:
        r = await sb.run_python(OPEN_FDS)
        assert (r.status, r.stdout) == ("ok", "[0, 1, 2, 5, 6]\n"), r  # stdio and the REPL's two cell pipes
        forged = (
            "import os, struct, time\nbody = b'{\"x\":1}'\nos.write(6, struct.pack('>I', len(body)) + body)\n"
            "time.sleep(5)"
        )
        r = await sb.run_python(forged)
        assert r.status == "killed" and "state was lost" in r.stderr, r
        r = await sb.run_python("print(6 * 7)")
        assert (r.status, r.stdout) == ("ok", "42\n"), r


@needs_local
async def test_file_transfers_never_follow_what_a_cell_planted():
    """Upload and download run in the zygote itself, which holds more than a cell: a symlink, FIFO or directory
    that earlier code put at the path is refused with an error, never followed, and never ends the session."""
    async with sandboxes.open("local", persistent=True) as sb:
        planted = await sb.run_python("""
import os
x = 7
os.symlink('/proc/self/fd/8', 'notes.txt')  # in the zygote, /proc/self is the zygote
os.symlink('/dev', 'd')
os.symlink('/proc/self', 'z')
os.mkfifo('fifo')
os.mkdir('adir')
print('planted')
""")
        assert planted.stdout == "planted\n", planted
        for path in ("notes.txt", "d/x", "fifo", "adir"):
            with pytest.raises(sandboxes.SandboxError, match="cannot write"):
                await sb.upload(path, b'{"exit_code":0}')
        for path in ("notes.txt", "d/zero", "z/status", "fifo", "adir"):
            with pytest.raises(sandboxes.SandboxError, match="cannot read"):
                await sb.download(path)
        r = await sb.run_python("import sys; print(x); sys.exit(1)")  # the REPL and its state are intact
        assert (r.status, r.stdout) == ("error", "7\n"), r
        await sb.upload("sub/ok.txt", b"fine")  # a plain path still works
        assert await sb.download("sub/ok.txt") == b"fine"


async def test_back_pressure_queues_callers(provider):
    options = {"actors": 2, "workers_per_actor": 1} if provider == "ray" else {"workers": 2}
    async with sandboxes.open(provider, **options) as sb:
        await asyncio.gather(*(sb.run_python("pass") for _ in range(4)))  # every worker warm
        start = time.monotonic()
        results = await asyncio.gather(*(sb.run_python("import time; time.sleep(0.25)") for _ in range(8)))
        elapsed = time.monotonic() - start
    assert all(r.ok for r in results), results
    assert elapsed >= 0.9, f"8 x 0.25 s on 2 workers finished in {elapsed:.2f} s: more than 2 ran at once"
    if provider == "local":  # the 6 calls that found both workers busy counted their wait (ray's live in its actors)
        pool = local_pool(**options)
        assert pool.stats["slot_waits"] >= 6 and pool.stats["slot_wait_s"] >= 6 * 0.2, pool.stats


@needs_local
async def test_worker_death_is_noticed_at_once_and_replaced():
    """A worker killed from outside mid-call (SIGKILL on its jail, or on its zygote alone) is noticed at once by
    its channel (EOF), not at the call's deadline: a one-shot call is retried once on a fresh worker; a session's
    call is infra_error (its state is lost) and its next call gets a fresh REPL. Nothing of the dead jail is left."""
    async with (
        sandboxes.open("local", workers=1, recycle_after=10_000) as sb,
        sandboxes.open("local", persistent=True, workers=1, recycle_after=10_000) as repl,
    ):
        assert (await sb.run_python("pass")).ok
        pool = local_pool(workers=1, recycle_after=10_000)
        victim = pool._workers[0]
        dead = jail_pids(victim)
        threading.Timer(0.3, kill_group, (victim.proc.pid,)).start()
        start = time.monotonic()
        r = await sb.run_python("import time; time.sleep(1); print('done')", wall_s=30)
        assert (r.status, r.stdout, r.attempts) == ("ok", "done\n", 2), r
        assert time.monotonic() - start < 10, "the death was noticed at the deadline, not at once"
        assert pool.stats["retries"] == 1 and pool._workers[0] is not victim
        assert still_there(dead) == set()

        assert (await repl.run_python("x = 1")).ok
        victim = repl._session.worker
        dead = jail_pids(victim)
        threading.Timer(0.3, os.kill, (zygote_and_below(victim)[0], signal.SIGKILL)).start()
        start = time.monotonic()
        r = await repl.run_python("import time; time.sleep(30)", wall_s=30)
        assert r.status == "infra_error" and "state was lost" in r.stderr, r
        assert time.monotonic() - start < 10, "the death was noticed at the deadline, not at once"
        r = await repl.run_python("print(globals().get('x'))")
        assert (r.status, r.stdout) == ("ok", "None\n"), r  # a fresh worker, a fresh REPL
        assert still_there(dead) == set()


@needs_local
async def test_a_wedged_worker_is_bounded_by_the_calls_wall_limit(monkeypatch):
    """A snippet spinning forever is killed by its worker at the wall limit ("timeout"); the worker stays. A worker
    that stops answering itself (its zygote stopped: wedged) is given up at the wall limit plus the reply grace,
    killed with its whole jail, and the call retried on a fresh worker (one-shot) or reported infra_error (session)."""
    monkeypatch.setattr(worker_module, "REPLY_GRACE_S", 0.5)
    async with (
        sandboxes.open("local", workers=1, recycle_after=10_002) as sb,
        sandboxes.open("local", persistent=True, workers=1, recycle_after=10_002) as repl,
    ):
        assert (await sb.run_python("pass")).ok
        pool = local_pool(workers=1, recycle_after=10_002)
        worker, respawns = pool._workers[0], pool.stats["respawns"]
        idle = jail_pids(worker)
        r = await sb.run_python("while True: pass", wall_s=0.5, cpu_s=30)
        assert r.status == "timeout" and r.wall_ms < 3000, r
        assert pool._workers[0] is worker and pool.stats["respawns"] == respawns  # the worker itself is fine
        assert still_there(idle - jail_pids(worker)) == set()  # the spinning process is gone
        assert len(jail_pids(worker)) == len(idle)  # and nothing else of the call runs

        wedged = jail_pids(worker)
        for pid in zygote_and_below(worker):
            os.kill(pid, signal.SIGSTOP)
        start = time.monotonic()
        r = await sb.run_python("print('ok')", wall_s=0.5)
        elapsed = time.monotonic() - start
        assert (r.status, r.stdout, r.attempts) == ("ok", "ok\n", 2), r
        assert 1.0 <= elapsed < 6, f"given up after {elapsed:.2f} s, not at wall_s + grace = 1 s"
        assert still_there(wedged) == set()

        assert (await repl.run_python("x = 1")).ok
        wedged = jail_pids(repl._session.worker)
        for pid in zygote_and_below(repl._session.worker):
            os.kill(pid, signal.SIGSTOP)
        r = await repl.run_python("x", wall_s=0.5)
        assert r.status == "infra_error" and "no reply within the deadline" in r.stderr, r
        assert still_there(wedged) == set()
        assert (await repl.run_python("print(globals().get('x'))")).stdout == "None\n"


@needs_local
async def test_repeated_worker_death_is_infra_error():
    async with sandboxes.open("local", workers=1, recycle_after=9_999) as sb:
        assert (await sb.run_python("pass")).ok
        pool = local_pool(workers=1, recycle_after=9_999)
        stop = time.monotonic() + 3

        def keep_killing():
            while time.monotonic() < stop:
                worker = pool._workers.get(0)
                if worker is not None and worker.proc.poll() is None:
                    time.sleep(0.2)
                    kill_group(worker.proc.pid)
                time.sleep(0.01)

        killer = threading.Thread(target=keep_killing)
        killer.start()
        r = await sb.run_python("import time; time.sleep(2)")
        killer.join()
        assert r.status == "infra_error" and r.attempts == 2, r
        assert "local worker failed" in r.stderr
        assert (await sb.run_python("print('back')")).stdout == "back\n"


@needs_local
async def test_cancelled_call_kills_its_worker_and_frees_the_slot_at_once():
    """Cancelling a caller (an episode past its deadline) abandons its execution: the worker running it is killed at
    once, with everything in its jail, and the one slot serves the next call right away on a fresh worker. The same
    for a persistent session's call: its worker is killed and the session's next call gets a fresh REPL."""
    async with (
        sandboxes.open("local", workers=1, recycle_after=10_000) as sb,
        sandboxes.open("local", persistent=True, workers=1, recycle_after=10_000) as repl,
    ):
        assert (await sb.run_python("pass")).ok
        pool = local_pool(workers=1, recycle_after=10_000)
        before, victim = dict(pool.stats), pool._workers[0]
        first = asyncio.create_task(sb.run_python("while True: pass", wall_s=60, cpu_s=60))
        await asyncio.sleep(0.3)
        busy = jail_pids(victim)
        assert len(busy) >= 5, busy  # launcher, bwrap twice, zygote, the spinning child
        first.cancel()
        start = time.monotonic()
        r = await sb.run_python("print('second')")
        waited = time.monotonic() - start
        assert first.cancelled()
        assert (r.status, r.stdout) == ("ok", "second\n"), r
        assert waited < 5, f"the second call waited {waited:.2f} s for the abandoned one"
        assert still_there(busy) == set()
        assert pool._workers[0] is not victim
        assert pool.stats["abandoned"] - before["abandoned"] == 1
        assert pool.stats["respawns"] - before["respawns"] == 1

        assert (await repl.run_python("x = 1")).ok
        victim = repl._session.worker
        cell = asyncio.create_task(repl.run_python("import time; time.sleep(60)", wall_s=60))
        await asyncio.sleep(0.3)
        busy = jail_pids(victim)
        cell.cancel()
        with pytest.raises(asyncio.CancelledError):
            await cell
        assert still_there(busy) == set()
        r = await repl.run_python("print(globals().get('x'))")
        assert (r.status, r.stdout) == ("ok", "None\n"), r


def test_idle_slots_hand_over_to_threads_and_coroutines_and_survive_cancellation():
    slots = IdleSlots(range(1))
    assert slots.get() == 0  # now none is idle

    async def scenario() -> list:
        waiting = [asyncio.create_task(slots.get_async()) for _ in range(2)]
        await asyncio.sleep(0.01)
        waiting[0].cancel()  # a cancelled waiter must not swallow the slot handed to it
        slots.put(0)
        got = await waiting[1]
        from_thread = asyncio.get_running_loop().run_in_executor(None, slots.get)
        await asyncio.sleep(0.01)
        assert not from_thread.done()  # back-pressure: the thread waits for the slot
        slots.put(got)
        return [got, await from_thread]

    assert asyncio.run(scenario()) == [0, 0]
    slots.put(0)
    assert asyncio.run(asyncio.wait_for(slots.get_async(), 1)) == 0


@needs_local
async def test_workers_are_recycled():
    async with sandboxes.open("local", workers=1, recycle_after=3) as sb:
        pids = []
        for _ in range(7):
            r = await sb.run_python("import os; print(os.getpid())")
            assert r.ok
            pids.append(r.stdout)
        assert local_pool(workers=1, recycle_after=3).stats["respawns"] >= 3


@needs_local
async def test_preloaded_modules_from_host_site_packages():
    pytest.importorskip("numpy")
    options = {"workers": 1, "preload": ("numpy",), "site_packages": tuple(sandboxes.host_site_packages())}
    async with sandboxes.open("local", **options) as sb:
        r = await sb.run_python("import sys, numpy as np\nprint(int(np.arange(10).sum()), 'numpy' in sys.modules)")
        assert (r.status, r.stdout) == ("ok", "45 True\n"), r
        assert local_pool(**options)._workers[0].info["preloaded"] == ["numpy"]


def test_probe_reports_this_host():
    report = sandboxes.probe()
    data = report.as_dict()
    for key in (
        "bubblewrap",
        "user_namespaces",
        "seccomp",
        "landlock_abi",
        "cgroup",
        "cgroup_writable",
        "docker",
        "auto",
    ):
        assert key in data
    if not report.local_missing:
        assert report.auto == "local"
    if report.docker is None:
        assert report.docker_detail


@needs_local
async def test_refuses_without_isolation_unless_unsafe(monkeypatch):
    monkeypatch.setattr(jail, "bwrap_version", lambda: None)  # pretend bubblewrap is not installed
    with pytest.raises(sandboxes.SandboxUnavailable, match="bubblewrap is not installed.*unsafe=True"):
        async with sandboxes.open("local", workers=1, preload=("refusal-test",)):
            pass
    async with sandboxes.open("local", unsafe=True, workers=1, preload=("unsafe-test",)) as sb:
        r = await sb.run_python("import os; print(os.getcwd()); print(os.environ.get('MOLT_SANDBOX_CANARY_SECRET'))")
        assert r.status == "ok" and r.provider == "local-unsafe"
        assert r.stdout.splitlines()[1] == "None"  # even unsafe workers get a scrubbed environment
        cwd = r.stdout.splitlines()[0]
        assert "sandboxes-unsafe-" in cwd
        r = await sb.run_python(
            "import os\nif os.fork() == 0:\n    os.setsid(); import time; time.sleep(60)\nprint('ok')"
        )
        assert r.ok
    sandboxes.shutdown()
    assert not os.path.exists(os.path.dirname(cwd))


async def test_persistent_session_on_every_provider(provider):
    options = {"ray": {"actors": 1, "workers_per_actor": 1, "sessions": 1}, "local": {"workers": 2, "sessions": 1}}
    options = options.get(provider, {"workers": 2})
    late = sandboxes.open(provider, persistent=True, **options)
    async with sandboxes.open(provider, persistent=True, **options) as sb:
        assert (await sb.run_python("state = [1, 2]")).ok
        r = await sb.run_python("state.append(3)\nsum(state)")
        assert (r.status, r.stdout, r.provider) == ("ok", "6\n", provider), r
        await sb.upload("f.txt", "x")
        assert (await sb.exec(["cat", "f.txt"])).stdout == "x"
        cell = asyncio.create_task(sb.run_python("import time; time.sleep(60)", wall_s=60))
        await asyncio.sleep(0.5)
        cell.cancel()  # an abandoned call's worker is killed: the next call runs at once, on a fresh REPL
        start = time.monotonic()
        r = await sb.run_python("print(globals().get('state'))")
        if r.status == "infra_error":  # ray: the call on the actor's thread ended with the kill, after our cancel
            r = await sb.run_python("print(globals().get('state'))")
        assert (r.status, r.stdout) == ("ok", "None\n"), r
        assert time.monotonic() - start < 20
        waiting = asyncio.create_task(late.start())
        await asyncio.sleep(1.2)  # ray: longer than an actor holds one open_session call
        assert not waiting.done() or "sessions" not in options  # the one session slot is taken: wait, never fail
    await asyncio.wait_for(waiting, 30)
    async with late:
        assert (await late.run_python("print(globals().get('state'))")).stdout == "None\n"


@needs_local
async def test_auto_picks_what_probe_reports():
    async with sandboxes.open("auto", workers=2) as sb:
        r = await sb.run_python("print('auto')")
    assert r.ok and r.provider == sandboxes.probe().auto


async def test_docker_without_an_engine_is_a_clear_error(monkeypatch, tmp_path):
    pytest.importorskip("docker")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    with pytest.raises(sandboxes.SandboxUnavailable, match="no Docker engine answered.*dockerd"):
        async with sandboxes.open("docker", workers=1, recycle_after=7):
            pass


@pytest.mark.skipif(sandboxes.probe().docker is None, reason="no Docker engine answered")
async def test_docker_orphans_are_reaped_at_start_up():
    import docker

    from sandboxes import docker_pool

    client = docker.from_env()
    try:
        image = docker_pool.ensure_image(client)
        dead_owner = f"{docker_pool.socket.gethostname()}:{2**22 + 17}"  # above pid_max: never a live process
        orphan = client.containers.create(
            image, command=["true"], labels={docker_pool.LABEL: "1", docker_pool.OWNER_LABEL: dead_owner}
        )
        async with sandboxes.open("docker", workers=1, recycle_after=501) as sb:
            assert (await sb.run_python("print('ok')")).stdout == "ok\n"
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(orphan.id)
    finally:
        client.close()


@needs_local
async def test_interpreter_the_jail_user_cannot_reach_is_refused(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("only root runs jails under other uids")
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    python = hidden / "python3"
    python.symlink_to("/usr/bin/python3")
    with pytest.raises(sandboxes.SandboxUnavailable, match="not reachable by the jails"):
        async with sandboxes.open("local", workers=1, python=str(python)):
            pass


@needs_local
async def test_snippets_can_use_multiprocessing_and_subprocesses():
    async with sandboxes.open("local", workers=2) as sb:
        r = await sb.run_python(
            "import multiprocessing as mp\n"
            "def square(x):\n    return x * x\n"
            "if __name__ == '__main__':\n"
            "    with mp.Pool(2) as pool:\n        print(pool.map(square, range(5)))\n"
        )
        assert (r.status, r.stdout) == ("ok", "[0, 1, 4, 9, 16]\n"), r
        r = await sb.run_python(
            "import subprocess\nprint(subprocess.run(['python3', '-c', 'print(7)'], capture_output=True).stdout)"
        )
        assert r.stdout == "b'7\\n'\n", r
