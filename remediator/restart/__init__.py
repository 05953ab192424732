"""One incident's restart procedure: one module per step, a dispatch from the incident's state to the step.

* reconcile.py: `Reconciler.look(incident)`: the state picks the step; the step answers when to look again;
* consider.py (open), draining.py (draining), act.py (claim, the argv, its result), warmup.py (warming,
  needs_ack), with silences.py (Alertmanager), gates.py (policy facts, host mutex, concurrency, floor) and
  notes.py (decisions that are not a restart, escalation, closing);
* choices.py: the next-state choices, pure (beside policy.decide); result.py: `LookAgain` / `DONE`;
* context.py: what every step is given (store, config, backend I/O, clocks, holder).

Each step does its slow I/O (verify, in-flight read, the argv, Alertmanager) OUTSIDE any transaction,
then decides and writes in ONE short `store.tx()` that re-checks the incident's state first. The
fleet-wide guarantees (host mutex, min_ready, the restart-concurrency bound, budget, backoff, breaker,
the lease) are read and decided inside that one transaction, with the restart's intent.
"""
