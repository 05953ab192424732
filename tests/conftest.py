"""Shared test set-up."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from llm_health.drill.procs import ManagedProcess, interrupt_on_termination

# The real programs the tests start. Locally a missing one skips its tests; in CI (CI=true) the
# project's own set-up must have installed them, so a missing one fails the run instead of
# letting skipped acceptance tests pass for green.
REQUIRED_BINARIES = ("prometheus", "promtool", "prometheus-alertmanager", "amtool", "haproxy", "gdb")


def pytest_sessionstart(session: pytest.Session) -> None:
    # A run stopped by SIGTERM or SIGHUP (a CI timeout, a closed terminal) ends like Ctrl-C: pytest
    # still tears the fixtures down, so every server, engine and stack a test started is stopped.
    interrupt_on_termination()
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes"):
        return
    missing = [b for b in REQUIRED_BINARIES if shutil.which(b) is None]
    if missing:
        pytest.exit(f"CI: required programs not installed: {', '.join(missing)} (run scripts/ensure-debs.sh)",
                    returncode=3)


# Parallel runs: a test module must stay on one worker (its module-scoped servers start once, and some
# modules' tests build on each other). `make test` uses `--dist loadscope`, which keeps a module together
# by its node ids. `--dist loadgroup` with the groups below would too, and would also keep the real
# engines' modules on one worker, but with pytest 9.2 it silently groups nothing (pytest-xdist#1386: the
# group rides on a node id that pytest no longer lets it change), so `make test` does not rely on it; the
# real engines run in runs of their own after the rest: vLLM and SGLang one module per worker on two workers,
# then llama.cpp alone (Makefile, REAL_ALONE).
REAL_ENGINES_GROUP = "real-engines"
# Modules whose tests share nothing (no module-scoped server, no order) and each take seconds of real time:
# under `--dist loadscope` their tests are spread, one test (one store) at a time, instead of one worker
# running the whole module while the others wait at the end of the run.
SPREAD_MODULES = frozenset({"tests/unit/remediator/test_authority.py",
                            "tests/project/test_bench.py"})       # each test a benchmark of its own, 3 min in all
# ... and of those, the ones that mostly wait (real-time fleets of threads) are handed out first, so their waits
# overlap the CPU-bound rest instead of making the run's tail (xdist hands out the largest scopes first, and
# a spread test is a scope of one). The benchmarks burn CPU: they keep their place at the end.
WAITING_MODULES = frozenset({"tests/unit/remediator/test_authority.py"})


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module in SPREAD_MODULES:
                return nodeid
            return super()._split_scope(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            if not self.ordered:        # the first hand-out: the waiting modules' tests go first, in order
                self.ordered = True
                waiting = [scope for scope in self.workqueue if scope.split("::", 1)[0] in WAITING_MODULES]
                for scope in reversed(waiting):
                    self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return Scheduling(config, log)


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    real = Path(__file__).resolve().parent / "real"
    for item in items:
        path = Path(str(item.path))
        group = REAL_ENGINES_GROUP if real in path.parents else str(path.relative_to(real.parent.parent))
        item.add_marker(pytest.mark.xdist_group(group))


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[Callable[..., ManagedProcess]]:
    """Start real processes (logs in the test's folder); every one is stopped when the test ends,
    also when it fails."""
    started: list[ManagedProcess] = []

    def start(argv: list[str], name: str) -> ManagedProcess:
        p = ManagedProcess(argv, name, tmp_path)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.stop()


@pytest.fixture
def sim(launch: Callable[..., ManagedProcess]) -> Callable[..., Any]:
    """Start real `llm-health sim` processes (stopped when the test ends): sim(*extra_argv) -> simrig.Sim."""
    from tests.support.simrig import (
        sim_factory,  # imported here: a conftest copied alone (test_interrupted_run) works
    )

    return sim_factory(launch)


@pytest.fixture
def exporter(launch: Callable[..., ManagedProcess]) -> Callable[..., Any]:
    """Start a real `llm-health exporter` on a 0.3 s interval: exporter({name: url}, {proxy: url}, *argv)."""
    from tests.support.simrig import exporter_factory

    return exporter_factory(launch)


@pytest.fixture
def fake() -> Iterator[Callable[..., Any]]:
    """Start `FakeVllm` servers in this process (stopped when the test ends): fake(api_key="")."""
    from tests.support.fakevllm import FakeVllm

    started: list[FakeVllm] = []

    def start(api_key: str = "") -> FakeVllm:
        f = FakeVllm(api_key)
        started.append(f)
        return f

    yield start
    for f in started:
        f.stop()


# -- PostgreSQL: one server per test worker (started on first use), a fresh state per test ----------------
@pytest.fixture(scope="session")
def pg_server() -> Iterator[Any]:
    from llm_health.drill.postgres import postgres_server

    with postgres_server() as server:
        yield server


@pytest.fixture(scope="session")
def pg_schemas(pg_server: Any) -> Iterator[Any]:
    """Fresh states on the worker's server, a schema each (tests/support/stores.py Schemas)."""
    from tests.support.stores import Schemas

    schemas = Schemas(pg_server)
    yield schemas
    schemas.close()


@pytest.fixture
def pg_url(pg_server: Any) -> str:
    """The URL of a new, empty database on the test worker's PostgreSQL server."""
    return str(pg_server.new_database())


@pytest.fixture(params=["sqlite", "postgresql"])
def store_kind(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run the test on both stores: tests.support.remediator.build() and new_store() put the state in a
    fresh PostgreSQL schema for the second."""
    from tests.support import stores

    if request.param == "postgresql":
        schemas = request.getfixturevalue("pg_schemas")
        with stores.using_postgres(schemas.new):
            yield request.param
    else:
        yield request.param
