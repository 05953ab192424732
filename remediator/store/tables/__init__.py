"""The store's SQL, one module per table, written once for both stores (tables/connected.py: the dialect
both speak). `ReadVerbs` and `WriteVerbs` are every verb of store/base.py on a `Connected._db()`; a store
supplies the connection, its transactions and its schema."""

from llm_health.remediator.store.shared import SharedVerbs
from llm_health.remediator.store.tables.actions import ActionReads, ActionWrites
from llm_health.remediator.store.tables.admin import AdminReads, AdminWrites
from llm_health.remediator.store.tables.breaker import BreakerReads, BreakerWrites
from llm_health.remediator.store.tables.captures import CaptureReads, CaptureWrites
from llm_health.remediator.store.tables.events import EventReads, EventWrites
from llm_health.remediator.store.tables.heard import HeardReads, HeardWrites
from llm_health.remediator.store.tables.incidents import IncidentReads, IncidentWrites
from llm_health.remediator.store.tables.lease import LeaseReads, LeaseWrites
from llm_health.remediator.store.tables.lifecycle import LifecycleReads, LifecycleWrites
from llm_health.remediator.store.tables.markers import MarkerReads, MarkerWrites
from llm_health.remediator.store.tables.retention import RetentionWrites
from llm_health.remediator.store.tables.rollouts import RolloutReads, RolloutWrites
from llm_health.remediator.store.tables.silences import SilenceReads, SilenceWrites


class ReadVerbs(IncidentReads, ActionReads, LifecycleReads, MarkerReads, BreakerReads, SilenceReads, LeaseReads,
                EventReads, HeardReads, AdminReads, CaptureReads, RolloutReads):
    """Every read verb (store/base.py Reads); the connection comes from the concrete class."""


class WriteVerbs(IncidentWrites, ActionWrites, LifecycleWrites, MarkerWrites, BreakerWrites, SilenceWrites,
                 LeaseWrites, EventWrites, HeardWrites, AdminWrites, CaptureWrites, RetentionWrites, RolloutWrites,
                 SharedVerbs):
    """Every write verb (store/base.py Transaction); mixed with ReadVerbs into a store's transaction."""


__all__ = ["ReadVerbs", "WriteVerbs"]
