"""llm-health: health verdicts and one restart authority for self-hosted LLM model servers."""

__version__ = "0.1.0"
