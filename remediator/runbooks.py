"""`GET /runbooks`: docs/runbooks.md as HTML, so every alert's runbook_url resolves.

The rendered rules link each alert to `<--runbook-base-url>#<alertname lowercase>`, which the operator
sets to this page's address as people reach it (unset, a placeholder that never resolves). The markdown ships in the wheel (llm_health/data/docs/runbooks.md, llm_health.assets)
and is rendered once per process. Section ids are the heading text lowercased with spaces as dashes
(`## LLMBackendStalled` -> `id="llmbackendstalled"`), which is also how GitHub anchors them. The page
is public (no token): it documents alerts and carries no state.
"""

from __future__ import annotations

import functools
import html
import re

from flask import Blueprint, Response

from llm_health import assets

runbooks = Blueprint("runbooks", __name__)

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>llm-health runbooks</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, sans-serif; max-width: 60rem; margin: 2rem auto; padding: 0 1rem; line-height: 1.5; }}
code {{ background: #f3f3f3; padding: 0 .2em; }} h2 {{ border-top: 1px solid #ccc; padding-top: 1rem; }}
h2:target {{ background: #fff3c4; }} nav a {{ margin-right: .8em; }}
</style></head>
<body>
<nav>{nav}</nav>
{body}
</body></html>
"""


def slug(heading: str) -> str:
    """The anchor of a heading: lowercase, spaces to dashes, other punctuation dropped (GitHub's rule)."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@functools.lru_cache(maxsize=1)
def page() -> str:
    import markdown  # imported here: only the remediator's web process needs it

    text = assets.runbooks_markdown()
    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"], extension_configs={
        "toc": {"slugify": lambda value, separator: slug(value)},
    })
    body = md.convert(text)
    nav = " ".join(
        f'<a href="#{html.escape(slug(name))}">{html.escape(name)}</a>'
        for name in re.findall(r"^## (.+)$", text, flags=re.MULTILINE)
    )
    return _PAGE.format(nav=nav, body=body)


@runbooks.get("/runbooks")
def show() -> Response:
    return Response(page(), mimetype="text/html")
