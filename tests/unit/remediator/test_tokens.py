"""The bearer token file (remediator/web/tokens.py): a world-readable one is reported.
"""

from __future__ import annotations

import os
from pathlib import Path

from llm_health.config import parse_config


def test_f10_world_readable_token_file_is_reported(tmp_path: Path) -> None:
    from llm_health.remediator.web.tokens import token_file_warning

    (tmp_path / "token").write_text("t\n")
    cfg = parse_config({"remediator": {"token_file": "token"}}, source=str(tmp_path / "c.yml"))
    os.chmod(tmp_path / "token", 0o644)
    assert "chmod 600" in token_file_warning(cfg)
    os.chmod(tmp_path / "token", 0o600)
    assert token_file_warning(cfg) == ""
