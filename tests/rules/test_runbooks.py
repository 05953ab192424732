"""Runbooks resolve: the remediator serves docs/runbooks.md at /runbooks, every alert's runbook_url
points into that page at an anchor that exists there, and every section has the same four parts."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from llm_health.remediator.app import create_app
from llm_health.remediator.runbooks import slug

from llm_health.config import parse_config
from llm_health.render.rules import DEFAULT_RUNBOOK_BASE_URL, RuleSettings, render
from tests.support.paths import REPO
from tests.support.promtool import alert_rules

ROOT = REPO
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PARTS = ("Meaning", "Impact", "Diagnosis", "Mitigation")


class Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.ids += [value for name, value in attrs if name == "id" and value]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, str]:
    tmp = tmp_path_factory.mktemp("runbooks")
    (tmp / "token").write_text("runbooks-test-token\n")
    config = parse_config({
        "backends": [{"name": "gpu-a", "url": "http://127.0.0.1:18001", "restart": ["true"]}],
        "remediator": {"state": "state.db", "token_file": "token"},
    }, source=str(tmp / "llm-health.yml"))
    app = create_app(config, with_authority=False)
    response = app.test_client().get("/runbooks")  # no token: a pager link must open
    return response.status_code, response.content_type, response.get_data(as_text=True)


def sections() -> dict[str, str]:
    parts = re.split(r"(?m)^## ", RUNBOOKS.read_text())[1:]
    return {part.split("\n", 1)[0].strip(): part for part in parts}


def test_runbooks_page_is_served_as_html(served: tuple[int, str, str]) -> None:
    status, content_type, body = served
    assert status == 200 and content_type.startswith("text/html")
    assert "<h2" in body and "<strong>Meaning.</strong>" in body


def test_every_alert_links_to_an_anchor_of_the_served_page(served: tuple[int, str, str]) -> None:
    ids = Ids()
    ids.feed(served[2])
    alerts = alert_rules()
    assert alerts
    base = urlsplit(DEFAULT_RUNBOOK_BASE_URL)
    for name, rule in alerts.items():
        url = urlsplit(rule["annotations"]["runbook_url"])
        assert (url.scheme, url.netloc, url.path) == (base.scheme, base.netloc, base.path), name
        assert url.path == "/runbooks"  # the remediator's route
        assert url.fragment in ids.ids, f"{name}: #{url.fragment} is not an anchor of /runbooks"


def test_runbook_base_url_is_a_render_setting() -> None:
    text = render(RuleSettings(runbook_url="https://ops.example.com/llm/runbooks"))["llm_health_alerts.yml"]
    assert "runbook_url: \"https://ops.example.com/llm/runbooks#llmbackendstalled\"" in text


def test_every_section_has_meaning_impact_diagnosis_mitigation_in_order() -> None:
    found = sections()
    assert set(alert_rules()) <= set(found)
    for name, text in found.items():
        positions = [text.find(f"**{part}.**") for part in PARTS]
        assert all(p >= 0 for p in positions), f"{name}: missing {[PARTS[i] for i, p in enumerate(positions) if p < 0]}"
        assert positions == sorted(positions), f"{name}: parts out of order"


@pytest.mark.parametrize(("heading", "anchor"), [("LLMBackendStalled", "llmbackendstalled"),
                                                 ("Some Heading: x", "some-heading-x")])
def test_slug_matches_github(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor
