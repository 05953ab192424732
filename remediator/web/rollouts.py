"""/api/rollouts: rolling operations (remediator/rollout/). GET, no token: what runs and how far it is;
POST (bearer token): start one, pause, resume, abort. Bad input: 400, nothing changed; a rollout that
cannot run here or a command that does not apply: 409 with the reason."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from llm_health.remediator.rollout.control import Control, control
from llm_health.remediator.rollout.start import RequestError, parse_request, start
from llm_health.remediator.store import Reads, Rollout
from llm_health.remediator.web.context import ctx
from llm_health.remediator.web.guard import MUTATING, BodyError, error, guard_mutation, json_body

rollouts = Blueprint("rollouts", __name__, url_prefix="/api/rollouts")
MAX_TEXT = 500


@rollouts.before_request
def _guard() -> Any:
    if request.method in MUTATING:
        c = ctx()
        return guard_mutation(c.token, c.config.remediator.max_body_bytes)
    return None


def rollout_view(rd: Reads, r: Rollout) -> dict[str, Any]:
    members = rd.rollout_members(r.id)
    steps: dict[str, int] = {}
    for m in members:
        steps[m.step.value] = steps.get(m.step.value, 0) + 1
    return {**r.as_dict(), "members": [m.as_dict() for m in members], "steps": steps}


@rollouts.get("")
def list_rollouts() -> Any:
    c = ctx()
    with c.store.reader() as rd:
        return jsonify({"rollouts": [rollout_view(rd, r) for r in rd.rollouts(limit=20)],
                        "commands": {k: v.as_dict() for k, v in rd.commands().items()}})


@rollouts.get("/<int:rollout_id>")
def get_rollout(rollout_id: int) -> Any:
    c = ctx()
    with c.store.reader() as rd:
        r = rd.rollout(rollout_id)
        if r is None:
            return error(404, f"no rollout {rollout_id}")
        return jsonify(rollout_view(rd, r))


@rollouts.post("")
def post_rollout() -> Any:
    c = ctx()
    try:
        req = parse_request(json_body(c.config.remediator.max_body_bytes), c.config)
    except BodyError as exc:
        return error(exc.status, exc.message)
    except RequestError as exc:
        return error(400, str(exc))
    done = start(c.store, c.config, req, c.clock())
    if done.rollout_id is None:
        return jsonify({"error": done.reason, "refusal": done.refusal.value if done.refusal else ""}), 409
    with c.store.reader() as rd:
        r = rd.rollout(done.rollout_id)
        assert r is not None
        return jsonify(rollout_view(rd, r)), 201


def control_view(command: Control) -> Any:
    def view(rollout_id: int) -> Any:
        c = ctx()
        try:
            data = json_body(c.config.remediator.max_body_bytes)
        except BodyError as exc:
            return error(exc.status, exc.message)
        if not isinstance(data, dict):
            return error(400, "expected a JSON object {reason, by}")
        reason, by = data.get("reason"), data.get("by")
        for name, value in (("reason", reason), ("by", by)):
            if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
                return error(400, f"{name} must be a non-empty string (at most {MAX_TEXT} characters)")
        done = control(c.store, rollout_id, command, str(by).strip(), str(reason).strip(), c.clock())
        if not done.found:
            return error(404, f"no rollout {rollout_id}")
        body = {"rollout": rollout_id, "command": command.value, "changed": done.changed,
                "state": done.state.value if done.state else ""}
        if done.refused:
            return jsonify({**body, "error": done.refused}), 409
        return jsonify(body)

    view.__name__ = f"rollout_{command.value}"
    return view


for _command in Control:
    rollouts.add_url_rule(f"/<int:rollout_id>/{_command.value}", view_func=control_view(_command), methods=["POST"])
