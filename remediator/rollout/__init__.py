"""Rolling operations through the one restart authority: a new command for a fleet, canary first.

    start.py      validate a rollout asked for (ctl, API, a YAML plan) and record it with its members
    plan.py       pure: the order, the next members, what a member's restart came to, the end state
    gate.py       pure: the canary's soak gate (verdict during the soak; traffic, errors, latency at the end)
    queries.py    I/O: what the gate asks Prometheus, each query within a total deadline
    procedure.py  one look at one rollout (the authority's scheduler key `rollout:<id>`)
    control.py    pause, resume, abort (operators)

A member's restart is an ordinary restart asked for (an incident with `requested_by`), carrying the new
command: drain, stop, start, warm-up gate, under the host mutex, the min_ready floor, the budget and the
breaker like every other restart. Its claim stores the backend's command (store `commands`), so every
later restart of the backend (automatic ones too) runs the command it was rolled to.
"""
