"""llm-health exporter: reading -> verdict -> probe (only when idle)."""
