"""The bearer token file and what it allows: read once at start, its mode checked, and no serving without
it unless told so (insecure_no_auth) on a loopback address only."""

from __future__ import annotations

import stat
from pathlib import Path

from llm_health.config import Config, ConfigError
from llm_health.remediator.web.guard import loopback_host


def token_path(config: Config) -> Path | None:
    token_file = config.remediator.token_file
    return config.resolve_path(token_file) if token_file else None


def read_token(config: Config) -> str:
    path = token_path(config)
    if path is None:
        return ""
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConfigError(f"remediator.token_file: cannot read {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"remediator.token_file: {path} is empty")
    return token


def token_file_warning(config: Config) -> str:
    """A warning when the token file can be read by anyone (others) or written by its group."""
    path = token_path(config)
    if path is None:
        return ""
    try:
        mode = path.stat().st_mode
    except OSError:
        return ""
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        return (f"WARNING: remediator.token_file {path} is readable or writable by other users (mode {stat.filemode(mode)}); "
                f"anyone who can read it can restart backends. Fix: chmod 600 {path}")
    return ""


def listen_host(listen: str) -> str:
    return listen.rpartition(":")[0].strip("[]")


def check_exposure(config: Config, token: str) -> None:
    """Safe by default: no webhook or mutating API without a token, unless explicitly told
    (remediator.insecure_no_auth / --insecure-no-auth) AND listening on loopback only."""
    r = config.remediator
    if token:
        return
    if not r.insecure_no_auth:
        raise ConfigError("remediator.token_file is not set: refusing to serve the webhook and the mutating API "
                          "without a bearer token. Set token_file (e.g. `openssl rand -hex 32 > token; chmod 600 "
                          "token`), or for a local trial pass --insecure-no-auth with a loopback --listen")
    host = listen_host(r.listen)
    if not loopback_host(host):
        raise ConfigError(f"remediator.insecure_no_auth: only allowed with a loopback listen address, got "
                          f"{r.listen!r}; set token_file to listen on {host}")
