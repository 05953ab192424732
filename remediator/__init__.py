"""llm-health remediator: alert -> incident -> decision -> action, one restart authority."""
