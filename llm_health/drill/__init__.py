"""Fire drills and test rigs: the demo stack, process helpers, hostile servers and slow clients (never imported by the exporter or the remediator)."""
