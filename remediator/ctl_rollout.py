"""`llm-health ctl rollout`: rolling operations against a running remediator (remediator/rollout/).

    llm-health ctl ... rollout [--canary N] [--per-host 1] [--soak DURATION] [--backend NAME ...]
                               [--pass-without-traffic] --reason TEXT [--by WHO] --command ARGV...
    llm-health ctl ... rollout --plan FILE [--reason TEXT] [--by WHO]    (a YAML plan: the same fields)
    llm-health ctl ... rollout status [ID]
    llm-health ctl ... rollout pause|resume|abort ID --reason TEXT [--by WHO]
    llm-health ctl ... rollout ack ID --reason TEXT      (a failed rollback repaired by hand: the next may start)

`--command` takes the rest of the line (an argv; no shell): the backend's new restart command (or start
command, for a backend restarted in three steps), with {backend}, {host}, {url} and {model} filled from the
configuration. Exit codes as for every ctl command: 0 done, 1 refused (nothing changed), 2 an error.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from pathlib import Path
from typing import Any

import yaml

from llm_health.config import ConfigError
from llm_health.http_client import fetch
from llm_health.remediator.clock import wall_text
from llm_health.render.rules import parse_duration

REFUSED_EXIT = 1
ERROR_EXIT = 2
ACTIONS = ("status", "pause", "resume", "abort", "ack")


def configure(sub: Any) -> None:
    p = sub.add_parser("rollout", help="a rolling restart or upgrade through the authority: canary, soak gate, "
                       "host by host, rollback (or: status, pause, resume, abort, ack)",
                       description=__doc__.split("\n\n")[1] if __doc__ else None,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", nargs="?", choices=ACTIONS, help="without one (and with --command or --plan): start")
    p.add_argument("id", nargs="?", type=int, help="the rollout (status: default the latest)")
    p.add_argument("--canary", type=int, help="canaries first (default remediator.rollout.canary, 1)")
    p.add_argument("--per-host", type=int, help="members restarted at once per host (1)")
    p.add_argument("--soak", help="how long the canary is watched, e.g. 10m (default remediator.rollout.soak)")
    p.add_argument("--backend", action="append", default=[], help="only these backends (repeat; default all)")
    p.add_argument("--pass-without-traffic", action="store_true",
                   help="a canary that served no user request may pass (said in the gate's reason)")
    p.add_argument("--plan", help="a YAML plan: command, canary, per_host, soak, backends, gate, reason")
    p.add_argument("--reason", help="why (goes to the audit log)")
    p.add_argument("--by", default=f"{getpass.getuser()}@{socket.gethostname()}", help="who asks (default user@host)")
    p.add_argument("--command", nargs=argparse.REMAINDER, help="the new command: the rest of the line")


def body_from(args: argparse.Namespace) -> dict[str, Any]:
    """The API body for a start: the plan's fields, overridden by the flags given."""
    body: dict[str, Any] = {}
    if args.plan:
        raw = yaml.safe_load(Path(args.plan).read_text())
        if not isinstance(raw, dict):
            raise ConfigError(f"{args.plan}: a plan is a mapping (command, canary, soak, ...)")
        body.update(raw)
        if isinstance(body.get("soak"), str):
            body["soak"] = parse_duration(body["soak"], f"{args.plan}: soak")
    if args.command:
        body["command"] = list(args.command)
    for key, value in (("canary", args.canary), ("per_host", args.per_host)):
        if value is not None:
            body[key] = value
    if args.soak:
        body["soak"] = parse_duration(args.soak, "--soak")
    if args.backend:
        body["backends"] = list(args.backend)
    if args.pass_without_traffic:
        body["pass_without_traffic"] = True
    if args.reason:
        body["reason"] = args.reason
    body.setdefault("by", args.by)
    return body


def run(url: str, token: str, args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if args.action in (None, "status") and not (args.command or args.plan):
        return show(url, args)
    if args.action is None:
        try:
            body = body_from(args)
        except (OSError, yaml.YAMLError, ConfigError) as exc:
            print(f"llm-health ctl rollout: {exc}", file=sys.stderr)
            return ERROR_EXIT
        resp = fetch("POST", f"{url}/api/rollouts", timeout=args.timeout, json_body=body, headers=headers)
        answer = _json(resp)
        if resp.status == 201:
            print(summary(answer))
            return 0
        return _refused(resp.status, answer, "rollout", resp.text)
    if args.id is None or not args.reason:
        print(f"llm-health ctl rollout {args.action}: needs the rollout's ID and --reason", file=sys.stderr)
        return ERROR_EXIT
    resp = fetch("POST", f"{url}/api/rollouts/{args.id}/{args.action}", timeout=args.timeout,
                 json_body={"by": args.by, "reason": args.reason}, headers=headers)
    answer = _json(resp)
    if resp.status == 200:
        print(f"rollout {args.id}: {args.action}: {'changed' if answer.get('changed') else 'nothing to do'} "
              f"(now {answer.get('state', '?')})")
        return 0
    return _refused(resp.status, answer, f"rollout {args.action}", resp.text)


def _json(resp: Any) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _refused(status: int, body: dict[str, Any], what: str, text: str) -> int:
    if status == 409:
        print(f"{what} refused ({body.get('refusal', 'conflict')}): {body.get('error', '')}", file=sys.stderr)
        return REFUSED_EXIT
    print(f"llm-health ctl: {what}: the remediator answered {status}: {body.get('error', text[:300])}", file=sys.stderr)
    return ERROR_EXIT


def show(url: str, args: argparse.Namespace) -> int:
    path = f"/api/rollouts/{args.id}" if args.id is not None else "/api/rollouts"
    resp = fetch("GET", url + path, timeout=args.timeout)
    if resp.status != 200:
        print(f"llm-health ctl: GET {path} answered {resp.status}: {resp.text[:300]}", file=sys.stderr)
        return ERROR_EXIT
    body = resp.json()
    rollouts = [body] if args.id is not None else body.get("rollouts", [])[:1]
    if not rollouts:
        print("no rollout yet")
        return 0
    print(summary(rollouts[0]))
    return 0


def latest(url: str, timeout: float) -> dict[str, Any] | None:
    """The latest rollout (None: none yet, or a remediator without rollouts)."""
    resp = fetch("GET", f"{url}/api/rollouts", timeout=timeout)
    if resp.status != 200:
        return None
    found = resp.json().get("rollouts") or []
    return found[0] if found else None


def summary(r: dict[str, Any]) -> str:
    """The rollout and one line per member."""
    steps = ", ".join(f"{n} {s}" for s, n in sorted(r.get("steps", {}).items()))
    lines = [f"rollout {r['id']}: {r['state']} ({steps}); by {r['by']}: {r['reason']}; soak {r['soak']:g}s; "
             f"started {wall_text(r.get('created_at'))}",
             f"  command: {' '.join(r['argv'])}", f"  note: {r.get('note') or '-'}"]
    rows = [("BACKEND", "HOST", "CANARY", "STEP", "INCIDENT", "NOTE")]
    for m in r.get("members", []):
        rows.append((m["backend"], m["host"] or "-", "yes" if m["canary"] else "", m["step"],
                     str(m["incident_id"] or "-"), " ".join(str(m.get("note") or "").split())[:90] or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    return "\n".join(lines)
