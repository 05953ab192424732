"""Where things are, for tests in any folder below tests/."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
PAGES = TESTS / "fixtures" / "metrics"  # /metrics pages captured from the real engines
