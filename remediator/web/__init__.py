"""The remediator's HTTP side, by concern (the factory that wires them is remediator/app.py):

* guard.py: every security check (token, cross-site, loopback Host without a token, body limits, JSON);
* webhook.py: POST /webhook (Alertmanager); api.py: /api/*; status.py: /, /metrics, /healthz;
* views.py: what the API and the status page show; tokens.py: the token file and the exposure check;
* context.py: what the handlers need (`app.extensions['remediator']`).
"""
