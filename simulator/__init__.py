"""A simulated vLLM OpenAI-compatible server for tests and fire drills."""
