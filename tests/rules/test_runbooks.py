"""Runbooks resolve: the remediator serves docs/runbooks.md at /runbooks, every alert's runbook_url
points into that page at an anchor that exists there, and every section has the same four parts."""

from __future__ import annotations

import json
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from llm_health.cli import main
from llm_health.config import parse_config
from llm_health.remediator.app import create_app
from llm_health.remediator.runbooks import slug
from llm_health.render import dashboards, prometheusrule
from llm_health.render.rules import DEFAULT_RUNBOOK_BASE_URL, RuleSettings, render, runbook_warning
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


def shipped_files() -> list[Path]:
    """Every file of the repository but the tests (which name what must not ship)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True)
    files = [ROOT / name for name in listed.stdout.split("\0") if name and not name.startswith("tests/")]
    return [f for f in files if f.is_file()]


def test_no_shipped_file_links_runbooks_on_localhost() -> None:
    files = shipped_files()
    assert len(files) > 50 and ROOT / "rules" / "llm_health_alerts.yml" in files
    found = [str(f.relative_to(ROOT)) for f in files
             if re.search(r"(localhost|127\.0\.0\.1):9411/runbooks", f.read_text(errors="replace"))]
    assert found == [], f"runbook links that open only on the remediator's host: {found}"


def test_the_unset_base_is_a_placeholder_that_never_resolves() -> None:
    base = urlsplit(DEFAULT_RUNBOOK_BASE_URL)
    assert base.scheme == "https" and base.hostname.endswith(".invalid")  # RFC 6761: never resolves
    assert runbook_warning(RuleSettings()) is not None
    assert runbook_warning(RuleSettings(runbook_url="https://ops.example.com/llm/runbooks")) is None
    for loopback in ("http://localhost:9411/runbooks", "http://127.0.0.1:9411/runbooks", "http://[::1]/runbooks"):
        assert "loopback" in (runbook_warning(RuleSettings(runbook_url=loopback)) or ""), loopback


@pytest.mark.parametrize("command", [["rules", "render"], ["rules", "render", "--format", "prometheusrule"],
                                     ["dashboards", "render"], ["dashboards", "render", "--format", "configmap"]])
def test_a_render_without_the_base_says_so_and_one_with_it_is_quiet(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*command, "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "--runbook-base-url is not set" in err and DEFAULT_RUNBOOK_BASE_URL in err
    assert main([*command, "--out", str(tmp_path / "b"), "--runbook-base-url", "https://ops.example.com/rb"]) == 0
    assert "warning" not in capsys.readouterr().err


def test_one_base_for_rules_prometheusrule_and_dashboards() -> None:
    settings = RuleSettings(runbook_url="https://ops.example.com/llm/runbooks")
    rules = render(settings)
    texts = [*rules.values(), prometheusrule.build(rules), *dashboards.render(settings).values()]
    urls = set()
    for text in texts:
        urls |= set(re.findall(r"https?://[^\s\"#)]+", text))
    assert urls == {"https://ops.example.com/llm/runbooks"}, urls
    links = {link["url"] for d in dashboards.render(settings).values() for link in json.loads(d)["links"]
             if link["type"] == "link"}
    assert links == {"https://ops.example.com/llm/runbooks"}


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
