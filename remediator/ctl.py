"""`llm-health ctl`: the operator commands, against a running remediator (the one restart authority).

    llm-health ctl (--config FILE | --remediator URL [--token-file F]) status [BACKEND]
    llm-health ctl ... drain|undrain|retire|activate|restart BACKEND --reason TEXT [--force] [--by WHO]
    llm-health ctl ... diagnostics BACKEND      (what was captured before its latest restart)
    llm-health ctl ... rollout ...              (a rolling restart or upgrade: remediator/ctl_rollout.py)

Every command goes through the remediator's API (POST /api/backends/<name>/<command>, bearer token), so
it follows the same rules as the authority and lands in its audit log with who asked (`--by`, default
user@host) and why. `--config` takes the URL from `remediator.listen` and the token from
`remediator.token_file`. What each command does in each state: docs/operations.md.

Exit codes: 0 done (or nothing to do), 1 refused (the reason is printed; nothing changed), 2 a usage
error, an unreachable remediator or any other error. Every call is over within `--timeout` seconds.
"""

from __future__ import annotations

import argparse
import getpass
import socket
import sys
from typing import Any

from llm_health.config import load_config, local_url
from llm_health.exporter.backend import load_api_key
from llm_health.http_client import HttpFailure, fetch
from llm_health.redact import redact
from llm_health.remediator import ctl_rollout
from llm_health.remediator.clock import wall_text
from llm_health.remediator.commands import Command

REFUSED_EXIT = 1
ERROR_EXIT = 2


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", help="llm-health config: the remediator's listen address and token file")
    where.add_argument("--remediator", metavar="URL", help="the remediator's URL (e.g. http://127.0.0.1:9411)")
    parser.add_argument("--token-file", help="bearer token for the remediator API (with --remediator)")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds for the whole call (default 10)")
    sub = parser.add_subparsers(dest="ctl", metavar="COMMAND")
    sub.required = True
    status = sub.add_parser("status", help="the fleet as a table: lifecycle, since, operator state, incident, "
                            "last action, who")
    status.add_argument("backend", nargs="?", help="only this backend")
    ctl_rollout.configure(sub)
    diag = sub.add_parser("diagnostics", help="the latest diagnostics captured before a restart (needs the token)")
    diag.add_argument("backend")
    for command, text in ((Command.DRAIN, "no new requests until undrained (the agent answers drain)"),
                          (Command.UNDRAIN, "take requests again"),
                          (Command.RETIRE, "out of every decision and count until activated (agent: maint)"),
                          (Command.ACTIVATE, "put a drained or retired backend back"),
                          (Command.RESTART, "ask the authority for a restart: drain, restart, warm-up, READY")):
        p = sub.add_parser(command.value, help=text, description=text)
        p.add_argument("backend")
        p.add_argument("--reason", required=True, help="why (goes to the audit log)")
        p.add_argument("--by", default=f"{getpass.getuser()}@{socket.gethostname()}",
                       help="who asks (default user@host)")
        p.add_argument("--force", action="store_true",
                       help="past the min_ready floor (restart: also the breaker, budget and busy markers), or "
                       "retire while a restart is under way (audited)")


def endpoint(args: argparse.Namespace) -> tuple[str, str]:
    """The remediator's base URL and the bearer token ('' without one)."""
    if args.config:
        from llm_health.remediator.web.tokens import read_token

        config = load_config(args.config)
        return local_url(config.remediator.listen), read_token(config)
    return args.remediator.rstrip("/"), load_api_key(args.token_file or "", "--token-file")


def run(args: argparse.Namespace) -> int:
    try:
        url, token = endpoint(args)
        if args.ctl == "status":
            print(status_table(get_backends(url, args.timeout), args.backend))
            latest = ctl_rollout.latest(url, args.timeout)
            if latest is not None and not args.backend:
                print()
                print(ctl_rollout.summary(latest))
            return 0
        if args.ctl == "diagnostics":
            return show_diagnostics(url, token, args)
        if args.ctl == "rollout":
            return ctl_rollout.run(url, token, args)
        return send(url, token, Command(args.ctl), args)
    except HttpFailure as exc:
        print(redact(f"llm-health ctl: the remediator did not answer: {exc.kind.value}: {exc.detail}"), file=sys.stderr)
        return ERROR_EXIT
    except LookupError as exc:
        print(f"llm-health ctl: {exc}", file=sys.stderr)
        return ERROR_EXIT


def get_backends(url: str, timeout: float) -> list[dict[str, Any]]:
    resp = fetch("GET", f"{url}/api/backends", timeout=timeout)
    if resp.status != 200:
        raise LookupError(f"GET /api/backends answered {resp.status}: {resp.text[:300]}")
    return list(resp.json()["backends"])


def send(url: str, token: str, command: Command, args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = fetch("POST", f"{url}/api/backends/{args.backend}/{command.value}", timeout=args.timeout,
                 json_body={"by": args.by, "reason": args.reason, "force": bool(args.force)}, headers=headers)
    try:
        body = resp.json()
    except ValueError:
        body = {}
    if resp.status == 200:
        state = "changed" if body.get("changed") else "nothing to do"
        forced = " (forced)" if body.get("forced") else ""
        incident = f", incident {body['incident']}" if body.get("incident") else ""
        print(f"{args.backend}: {command.value}: {state}{forced}: {body.get('reason', '')} "
              f"(now {body.get('admin', '?')}{incident})")
        return 0
    if resp.status == 409:
        print(f"{args.backend}: {command.value} refused ({body.get('refusal', '?')}): {body.get('error', '')}",
              file=sys.stderr)
        return REFUSED_EXIT
    print(f"llm-health ctl: {command.value} {args.backend}: the remediator answered {resp.status}: "
          f"{body.get('error', resp.text[:300])}", file=sys.stderr)
    return ERROR_EXIT


def show_diagnostics(url: str, token: str, args: argparse.Namespace) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = fetch("GET", f"{url}/api/backends/{args.backend}/diagnostics", timeout=args.timeout, headers=headers)
    if resp.status != 200:
        print(f"llm-health ctl: diagnostics {args.backend}: {resp.status}: {resp.text[:300]}", file=sys.stderr)
        return ERROR_EXIT
    d = resp.json()
    print(f"diagnostics #{d['id']} of {args.backend}, incident {d['incident_id']}, {wall_text(d['at'])}: {d['result']} "
          f"in {d['seconds']}s ({d['bytes']} bytes{', cut' if d['truncated'] else ''}): {d['argv']}")
    print(d["output"])
    return 0


def status_table(backends: list[dict[str, Any]], only: str | None = None) -> str:
    """One line per backend: what an operator asks first at 3 a.m."""
    rows = [("BACKEND", "LIFECYCLE", "SINCE", "OPERATOR", "BY", "INCIDENT", "LAST ACTION", "REASON")]
    for b in backends:
        if only and b["backend"] != only:
            continue
        lc, admin, inc, last = b["lifecycle"], b["admin"], b.get("incident"), b.get("last_decision")
        reason = admin["reason"] if admin["state"] != "in_service" else (lc.get("reason") or "")
        rows.append((
            b["backend"], lc["state"], wall_text(lc.get("since")), admin["state"], admin.get("by") or "-",
            (f"{inc['id']} {inc['state']}" if inc else "-")
            + (f" diag:{b['diagnostics']['result']}" if b.get("diagnostics") else ""),
            f"{last['kind']} {wall_text(last.get('at'))}" if last else "-",
            " ".join(str(reason).split())[:60] or "-",
        ))
    if only and len(rows) == 1:
        raise LookupError(f"unknown backend {only!r}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows)
