"""The store's contract: domain verbs in, typed rows out; no SQL, no dialect, no connection on this side.

Three views of one state:

* `StateStore`: the store itself. Its read verbs (`Reads`) each run on their own (on SQLite: this
  thread's connection, autocommit); `tx()` opens ONE write transaction; `reader()` a short-lived read
  view for threads that come and go.
* `Transaction` (`with store.tx() as tx:`): the read verbs plus the write verbs, all inside one write
  transaction that serialises writers (SQLite: BEGIN IMMEDIATE). Everything a guarantee depends on is
  read and written in one transaction: the claim's host mutex, min_ready floor, budget, backoff, breaker,
  max_concurrent_restarts and the lease check are decided from reads of the same `tx` that records the
  intent, so they hold across threads, gunicorn workers and (with a shared database) processes.
* `Reads`: what both offer.

remediator/store/sqlite/ implements it on SQLite (the embedded default), remediator/store/postgresql/ on
PostgreSQL (several remediators, one state: docs/ha.md); both run the same SQL (remediator/store/tables/),
and each keeps its connections, transactions, schema and clock to itself.

Times: `at`/`now` are wall time (events, restart history); `t`, deadlines and `next_check_at` are
monotonic (remediator/clock.py), as the columns are documented in rows.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from llm_health.exporter.observation import VerifyOutcome
from llm_health.exporter.reading import Reading
from llm_health.groups import Labels
from llm_health.remediator.lifecycle import LifecycleState
from llm_health.remediator.policy import Marker
from llm_health.remediator.store.rollout_rows import (
    CommandRow,
    Rollout,
    RolloutMember,
    RolloutState,
)
from llm_health.remediator.store.rows import (
    Action,
    AdminRow,
    AdminState,
    BreakerState,
    CaptureResult,
    CaptureRow,
    CommandChange,
    Event,
    Heard,
    Incident,
    IncidentState,
    LastHeard,
    Lease,
    LifecycleRow,
    Silence,
)


class StateError(RuntimeError):
    """The state cannot be used (deleted, replaced, damaged, too new); we stop rather than start from an
    empty state."""


class Reads(Protocol):
    # -- incidents ------------------------------------------------------------------------------------
    def active_incident(self, backend: str) -> Incident | None: ...
    def active_incidents(self) -> list[Incident]: ...               # oldest first
    def incident(self, incident_id: int) -> Incident | None: ...

    def incident_in(self, incident_id: int, state: IncidentState) -> Incident | None:
        """The incident if it is still in `state`, else None (it was resolved, acknowledged or moved on
        while the caller worked outside the transaction)."""

    def backends_in(self, state: IncidentState) -> set[str]: ...    # backends with an incident in `state`
    def firing_alerts(self, incident_id: int) -> int: ...            # the incident's alerts still firing
    def alert_known(self, incident_id: int, fingerprint: str, starts_at: str) -> bool: ...
    def delivery_seen_at(self, key: str) -> float | None: ...        # a notification's first delivery
    def alert_resolved_at(self, fingerprint: str, starts_at: str) -> float | None: ...  # this firing's resolution

    def restarts_in_progress(self, except_incident: int | None = None, warming_until: float = float("inf")) -> int:
        """Restarts holding a slot of the concurrency bound, fleet-wide: a drain, a running restart action,
        and a warm-up whose deadline (monotonic) is after `warming_until` (its first part only); never the
        restart of a backend verified `down` (it served nothing)."""

    # -- restart actions --------------------------------------------------------------------------------
    def restart_times(self, backend: str | None, since: float = 0.0, include_dry_run: bool = False, *,
                      now: float | None = None, mono: float | None = None, boot: str = "",
                      after_action: int | None = None, planned: bool = True) -> tuple[float, ...]:
        """When the restarts of `backend` (None: every backend) started, as wall times for the policy. With
        `now` and `mono`, a restart of this boot is placed by its monotonic age (a step of the wall clock
        moves no window); `after_action`: only actions with a larger id, else `since` filters on the wall
        start. `planned=False` leaves out the planned restarts (a rollout's, which change the command)."""

    def restart_counts(self, backend: str | None = None) -> dict[tuple[str, str], int]:
        """{(backend, result or 'running'): n} of the actions in the store, dry runs left out."""

    def action(self, action_id: int) -> Action | None: ...
    def unfinished_actions(self) -> list[Action]: ...
    def unfinished_action(self, incident_id: int) -> Action | None: ...   # the incident's latest
    def latest_action(self, incident_id: int) -> Action | None: ...       # finished or not
    def latest_unfinished_start(self, holder: str) -> float | None: ...   # of `holder`'s running actions

    # -- lifecycle, markers, breaker, silences, lease ---------------------------------------------------
    def lifecycle(self, backend: str) -> LifecycleRow | None: ...
    def lifecycle_state(self, backend: str) -> LifecycleState: ...      # UNSEEN for a backend without a row
    def lifecycles(self) -> dict[str, LifecycleRow]: ...
    def markers(self, backend: str) -> tuple[Marker, ...]: ...           # API markers, expired ones too
    def marker(self, marker_id: str) -> Marker | None: ...
    def breaker(self) -> BreakerState: ...
    def active_silences(self, backend: str) -> list[Silence]: ...        # not expired yet
    def lease(self, name: str) -> Lease | None: ...
    def lease_clock(self) -> tuple[float, str] | None:
        """The store's own clock, if it has one every holder shares: (seconds now, its name). PostgreSQL: the
        database's clock, so the lease means the same on every host. None (SQLite, one host): the lease is
        timed by the holder's monotonic clock and names its boot."""

    # -- operators' holds -------------------------------------------------------------------------------
    def admin(self, backend: str) -> AdminRow | None: ...                # None: in service
    def admins(self) -> dict[str, AdminRow]: ...                         # every held backend

    # -- diagnostics captured before a restart ----------------------------------------------------------
    def captures(self, incident_id: int) -> list[CaptureRow]: ...        # oldest first
    def latest_capture(self, backend: str) -> CaptureRow | None: ...

    # -- rolling operations (remediator/rollout/) ------------------------------------------------------
    def rollout(self, rollout_id: int) -> Rollout | None: ...
    def rollouts(self, limit: int = 20) -> list[Rollout]: ...           # newest first
    def active_rollouts(self) -> list[Rollout]: ...                     # running, paused, rolling back
    def rollout_counts(self) -> dict[RolloutState, int]: ...            # rollouts by state
    def rollout_members(self, rollout_id: int) -> list[RolloutMember]: ...   # in the rollout's order
    def soaking(self, backend: str) -> RolloutMember | None: ...        # the backend as a soaking canary
    def command(self, backend: str) -> CommandRow | None: ...           # None: the configured command
    def commands(self) -> dict[str, CommandRow]: ...

    # -- audit log and counters -------------------------------------------------------------------------
    def events(self, backend: str = "", limit: int = 100, kind: str = "", before: int | None = None) -> list[Event]:
        """Newest first; `before`: only events with a smaller id (the next page)."""

    def last_event(self, backend: str, skip_kinds: tuple[str, ...] = ()) -> Event | None: ...
    def counters(self, metric: str) -> dict[str, int]: ...
    def last_heard(self) -> LastHeard: ...                               # from Alertmanager (its webhook)


class Transaction(Reads, Protocol):
    # -- audit log and counters -------------------------------------------------------------------------
    def event(self, at: float, kind: str, backend: str = "", incident_id: int | None = None, reason: str = "",
              **detail: Any) -> None:
        """Append to the audit log (a decision kind is counted too); the detail is clipped, never invalid."""

    def event_unless_recent(self, at: float, kind: str, backend: str, reason: str, within: float,
                            **detail: Any) -> bool:
        """The event, unless the same (kind, backend, reason) was recorded within `within` seconds."""

    def bump(self, metric: str, label: str, by: int = 1) -> None: ...

    def heard(self, what: Heard, at: float) -> None:
        """Alertmanager was heard from at `at` (the stored time only ever moves forward)."""

    # -- notifications and incidents --------------------------------------------------------------------
    def remember_delivery(self, key: str, at: float, forget_before: float) -> None: ...
    def remember_resolved(self, fingerprint: str, starts_at: str, at: float) -> None: ...
    def open_incident(self, backend: str, at: float, labels: Labels = ()) -> int:
        """A new OPEN incident of `backend`, recording the group labels of the alert that opened it."""
    def request_restart(self, backend: str, at: float, by: str, force: bool, command: CommandChange | None = None) -> int:
        """The backend's active incident (a new one if none) becomes a restart `by` asked for, OPEN now;
        with `command`, its claim changes the backend's stored command to it."""
    def carry_firing_alerts(self, from_incident: int, to_incident: int) -> None:
        """The alerts still firing of one incident are (also) the other's."""
    def alert_firing(self, incident_id: int, fingerprint: str, starts_at: str, alertname: str) -> None: ...
    def alert_resolves(self, incident_id: int, fingerprint: str, starts_at: str) -> None:
        """Mark the incident's alert resolved (every firing of it when `starts_at` is '')."""

    def move_incident(self, incident_id: int, at: float, state: IncidentState, *, close_reason: str | None = None,
                      last_decision: str | None = None, last_note: str | None = None,
                      next_check_at: float | None = None, warm_deadline: float | None = None) -> None:
        """Set the state (CLOSED stamps closed_at); the named fields too (None: unchanged)."""

    def note_workload(self, incident_id: int, workload: str, members: tuple[str, ...]) -> None:
        """The restarted backend's workload (a ReplicaSet) and the backends it had when the restart began."""

    def take_replacement(self, incident_id: int, backend: str) -> bool:
        """Follow `backend` as the replacement of the incident's pod; False when another open incident
        follows it already (two restarts of one ReplicaSet never take the same new pod)."""

    def look_again_at(self, incident_id: int, t: float, note: str | None = None) -> None:
        """When to look at the incident again (monotonic), and optionally its note; nothing else changes."""

    def note_decision(self, incident_id: int, at: float, note: str, decision: str, next_check_at: float) -> None:
        """A decision that keeps the incident where it is (a deferral)."""

    def record_verification(self, incident_id: int, outcome: VerifyOutcome, at: float,
                            unresponsive_since: float | None, unresponsive_seen_at: float | None) -> None: ...

    def rebase_deadlines(self, t: float, warm_deadline: float) -> None:
        """Every stored monotonic deadline belongs to another boot: restart them from `t` (a warm-up's at
        `warm_deadline`), forget the runs of `unresponsive`."""

    # -- restart actions --------------------------------------------------------------------------------
    def add_action(self, incident_id: int, backend: str, argv: str, holder: str, at: float, mono: float,
                   boot: str) -> int:
        """Record a restart's intent (before its argv runs); returns its id."""

    def add_dry_run(self, incident_id: int, backend: str, holder: str, at: float, mono: float, boot: str) -> None: ...
    def set_status_path(self, action_id: int, path: str) -> None: ...

    def finish_action(self, action_id: int, at: float, result: str, exit_code: int | None = None,
                      output: str = "") -> bool:
        """Record an action's result unless one is recorded already; True when this call recorded it."""

    # -- lifecycle --------------------------------------------------------------------------------------
    def ensure_lifecycle(self, backend: str, at: float) -> LifecycleRow:
        """The backend's row; a backend never seen starts INITIALIZING (not a transition: no event)."""

    def move_lifecycle(self, backend: str, target: LifecycleState, at: float, reason: str,
                       incident_id: int | None = None, *, drain_deadline: float | None = None,
                       drain_baseline: Reading | None = None) -> bool:
        """One lifecycle step (lifecycle.transition), audited; False (and `lifecycle_refused`) when the table
        does not allow it, and nothing changes. DRAINING/STOPPED/INITIALIZING reached with an incident id
        belong to that incident's restart; READY and ERROR belong to nobody."""

    def set_lifecycle_owner(self, backend: str, incident_id: int | None) -> None: ...

    # -- markers, breaker, silences, lease --------------------------------------------------------------
    def add_marker(self, marker: Marker, at: float) -> None: ...
    def refresh_marker(self, marker_id: str, at: float, expires_at: float) -> bool: ...   # False: expired or gone
    def remove_marker(self, marker_id: str) -> Marker | None: ...
    def open_breaker(self, at: float, reason: str) -> None: ...

    def reset_breaker(self, at: float) -> bool:
        """Close the breaker; the restarts so far no longer count toward it. True when it was open."""

    def add_silence(self, silence: Silence) -> None: ...
    def end_silence(self, silence_id: str, at: float, result: str) -> None: ...
    def put_lease(self, lease: Lease) -> None: ...


    def add_capture(self, incident_id: int, backend: str, at: float, argv: str, result: CaptureResult,
                    exit_code: int | None, seconds: float, output: str, truncated: bool) -> int: ...

    def set_admin(self, backend: str, state: AdminState, at: float, by: str, reason: str) -> None:
        """An operator's hold (IN_SERVICE removes it); the caller records the event."""

    # -- rolling operations -------------------------------------------------------------------------------
    def add_rollout(self, rollout: Rollout, members: Sequence[RolloutMember]) -> int:
        """A new rollout and its members (the ids in the arguments are ignored); returns its id."""

    def move_rollout(self, rollout_id: int, at: float, state: RolloutState, note: str | None = None) -> None:
        """Its state (a final one stamps finished_at) and, when given, its note."""

    def note_rollout(self, rollout_id: int, at: float, note: str) -> None: ...

    def update_member(self, rollout_id: int, backend: str, **values: Any) -> None:
        """Set the named fields of a member (step, incident_id, changed_at, soak_started_at, query_errors,
        inconclusive, note); any other name raises ValueError."""

    def set_command(self, backend: str, argv: tuple[str, ...] | None, at: float, rollout_id: int | None) -> None:
        """The backend's stored command (None: none, the configured one again)."""

    # -- retention --------------------------------------------------------------------------------------
    def prune(self, now: float, *, max_age: float, max_events: int, max_actions: int,
              protect: float) -> dict[str, int]:
        """Forget old history (events and finished actions older than `max_age` or beyond the newest
        `max_events`/`max_actions`); running actions, active incidents and actions started within `protect`
        seconds are kept; pruned actions still count in `restarts_pruned`. Returns how many went, by table."""


class StateStore(Reads, Protocol):
    def init(self) -> None:
        """Create or migrate the state, check it, and pin it (the server's master, before forking)."""

    def open(self) -> None:
        """Use the state init() created (a worker after the fork): never create one."""

    def tx(self) -> AbstractContextManager[Transaction]: ...
    def reader(self) -> AbstractContextManager[Reads]: ...

    def check_identity(self) -> str:
        """'' while the state is the one we opened; else why not (sticky: the store stays stopped)."""

    def integrity_problem(self) -> str: ...        # '' when the state's own integrity check passes
    def write_problem(self, worker: str) -> str: ...   # '' when a small committed write succeeds
    def close(self) -> None: ...

