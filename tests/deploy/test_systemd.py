"""deploy/systemd/: the units pass `systemd-analyze verify` and its offline security audit, carry the
hardening they promise, and the polkit rule grants the llm-health user `restart` of vllm@*.service only.

The units are verified from a copy whose ExecStart binary is /bin/true (verify checks that the binary
exists; /opt/llm-health is the install location docs/install.md creates). The polkit rule is run by
node with a stand-in for polkit's rule API (addRule, action.lookup, subject.user): the real rule text,
the real JavaScript semantics.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from llm_health.cli import build_parser
from tests.support.paths import REPO

ROOT = REPO
SYSTEMD = ROOT / "deploy" / "systemd"
UNITS = sorted(SYSTEMD.glob("*.service"))
POLKIT_RULE = SYSTEMD / "50-llm-health-restart-vllm.rules"
ANALYZE = shutil.which("systemd-analyze")
NODE = shutil.which("node")
INSTALLED_BINARY = "/opt/llm-health/bin/llm-health"
HARDENING = {
    "NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes",
    "PrivateDevices": "yes", "ProtectKernelTunables": "yes", "ProtectKernelModules": "yes",
    "ProtectControlGroups": "yes", "RestrictSUIDSGID": "yes", "CapabilityBoundingSet": "",
    "User": "llm-health",
}


def unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """Sections -> key -> values (systemd keys repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{path.name}: key outside a section: {line}"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not KEY=VALUE: {line}"
        current.setdefault(key, []).append(value)
    return sections


def test_there_are_two_units() -> None:
    assert [p.name for p in UNITS] == ["llm-health-exporter.service", "llm-health-remediator.service"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_unit_hardening_and_directories(path: Path) -> None:
    service = unit(path)["Service"]
    for key, value in HARDENING.items():
        assert service.get(key) == [value], f"{path.name}: {key}={service.get(key)}, expected {value!r}"
    assert "RuntimeDirectory" in service
    (exec_start,) = service["ExecStart"]
    argv = exec_start.split()
    assert argv[0] == INSTALLED_BINARY
    name = path.stem.removeprefix("llm-health-")
    assert argv[1] == name and "$OPTIONS" in argv
    # the command line parses with the real CLI (flags from the environment file aside)
    args = build_parser(only=name).parse_args([a for a in argv[1:] if a != "$OPTIONS"])
    assert args.command == name
    assert unit(path)["Install"]["WantedBy"] == ["multi-user.target"]


@pytest.mark.parametrize("path", UNITS, ids=lambda p: p.name)
def test_reload_sends_sighup_to_the_main_process(path: Path) -> None:
    """`systemctl reload` = SIGHUP, which both programs take as "read the config again"
    (tests/process/test_exporter_reload.py, tests/process/test_remediator_reload.py); ExecStart runs the
    program itself (no shell in between), so $MAINPID is the exporter, or gunicorn's master."""
    service = unit(path)["Service"]
    assert service["ExecReload"] == ["/bin/kill -HUP $MAINPID"]
    assert service["Type"] == ["simple"] and not service["ExecStart"][0].startswith(("/bin/sh", "/usr/bin/env"))


def test_remediator_keeps_its_state_in_its_state_directory() -> None:
    service = unit(SYSTEMD / "llm-health-remediator.service")["Service"]
    assert service["StateDirectory"] == ["llm-health"] and service["WorkingDirectory"] == ["/var/lib/llm-health"]
    assert "AF_UNIX" in service["RestrictAddressFamilies"][0]  # systemctl -> D-Bus for the restart


def test_busy_markers_survive_a_stop_or_restart_of_the_remediator() -> None:
    """busy_dir is one of the remediator's runtime directories, which systemd deletes (markers and all) on
    every stop or restart unless RuntimeDirectoryPreserve= keeps them; `restart` alone is not enough (a plain
    stop for an upgrade would drop them). /run itself is emptied at reboot, with the jobs."""
    service = unit(SYSTEMD / "llm-health-remediator.service")["Service"]
    example = yaml.safe_load((ROOT / "deploy" / "llm-health.example.yml").read_text())
    busy_dir = example["remediator"]["busy_dir"]
    assert f"remediator.busy_dir: {busy_dir}" in (ROOT / "docs" / "install.md").read_text()
    runtime = [f"/run/{d}" for d in service["RuntimeDirectory"][0].split()]
    assert busy_dir in runtime, (busy_dir, runtime)
    assert service.get("RuntimeDirectoryPreserve") == ["yes"]
    assert service["RuntimeDirectoryMode"] == ["0770"]                 # group llm-health: the batch jobs


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_units_pass_systemd_analyze_verify_and_security(tmp_path: Path) -> None:
    copies = []
    for path in UNITS:
        copy = tmp_path / path.name
        copy.write_text(path.read_text().replace(INSTALLED_BINARY, "/bin/true"))
        copies.append(str(copy))
    verify = subprocess.run([ANALYZE, "verify", "--man=no", *copies], capture_output=True, text=True, timeout=60)
    assert verify.returncode == 0 and not verify.stderr.strip() and not verify.stdout.strip(), verify.stderr
    for copy in copies:
        # exposure 0 (locked down) .. 10 (unsafe); --threshold is in tenths
        audit = subprocess.run([ANALYZE, "security", "--offline=true", "--threshold=20", "--no-pager", copy],
                               capture_output=True, text=True, timeout=60)
        assert audit.returncode == 0, audit.stdout[-3000:] + audit.stderr


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_verify_catches_a_misspelled_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.service"
    bad.write_text(UNITS[0].read_text().replace(INSTALLED_BINARY, "/bin/true").replace(
        "NoNewPrivileges=", "NoNewPrivilegez="))
    verify = subprocess.run([ANALYZE, "verify", "--man=no", str(bad)], capture_output=True, text=True, timeout=60)
    assert "NoNewPrivilegez" in verify.stderr


def test_sysusers_creates_the_service_user() -> None:
    lines = [line.split() for line in (SYSTEMD / "llm-health.sysusers.conf").read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    assert [line[:2] for line in lines] == [["u", "llm-health"]]


POLKIT_HARNESS = r"""
const fs = require("fs");
const rules = [];
const polkit = {Result: {YES: "yes", NO: "no", AUTH_ADMIN: "auth_admin", NOT_HANDLED: null},
                addRule: (f) => rules.push(f)};
new Function("polkit", fs.readFileSync(process.argv[2], "utf8"))(polkit);
const cases = JSON.parse(process.argv[3]);
const out = cases.map(([id, user, details]) => {
  const action = {id: id, lookup: (k) => details[k]};
  const subject = {user: user};
  for (const r of rules) { const v = r(action, subject); if (v !== null && v !== undefined) return v; }
  return null;
});
console.log(JSON.stringify(out));
"""
MANAGE = "org.freedesktop.systemd1.manage-units"
POLKIT_CASES = [
    ([MANAGE, "llm-health", {"unit": "vllm@gpu-a.service", "verb": "restart"}], "yes"),
    ([MANAGE, "llm-health", {"unit": "vllm@0.service", "verb": "restart"}], "yes"),
    ([MANAGE, "llm-health", {"unit": "vllm@gpu-a.service", "verb": "stop"}], None),
    ([MANAGE, "llm-health", {"unit": "vllm@gpu-a.service", "verb": "start"}], None),
    ([MANAGE, "llm-health", {"unit": "sshd.service", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {"unit": "vllm.service", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {"unit": "vllm@.service", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {"unit": "xvllm@a.service", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {"unit": "vllm@a.service.d", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {"unit": "vllm@a.timer", "verb": "restart"}], None),
    ([MANAGE, "llm-health", {}], None),
    ([MANAGE, "mallory", {"unit": "vllm@gpu-a.service", "verb": "restart"}], None),
    (["org.freedesktop.systemd1.manage-unit-files", "llm-health", {"unit": "vllm@a.service", "verb": "restart"}],
     None),
]


@pytest.mark.skipif(NODE is None, reason="node not installed")
def test_polkit_rule_grants_restart_of_vllm_units_only(tmp_path: Path) -> None:
    harness = tmp_path / "harness.js"
    harness.write_text(POLKIT_HARNESS)
    cases = [case for case, _ in POLKIT_CASES]
    result = subprocess.run([NODE, str(harness), str(POLKIT_RULE), json.dumps(cases)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [expected for _, expected in POLKIT_CASES]


def test_polkit_rule_names_the_action_and_the_unit_pattern() -> None:
    text = POLKIT_RULE.read_text()
    assert MANAGE in text and 'subject.user !== "llm-health"' in text and 'verb === "restart"' in text
    assert re.search(r"/\^vllm@\[[^\]]+\]\+\\\.service\$/", text)


def test_example_config_restart_argv_matches_the_polkit_grant() -> None:
    """docs/install.md's restart argv is what the rule grants (no sudo, no other verb)."""
    text = (ROOT / "docs" / "install.md").read_text()
    assert '["systemctl", "--no-ask-password", "restart", "vllm@gpu-a.service"]' in text


VLLM_EXAMPLE = SYSTEMD / "examples" / "vllm@.service"


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze not installed")
def test_the_example_vllm_unit_verifies_and_restarts_on_any_exit(tmp_path: Path) -> None:
    """vLLM's API server can exit 0 after its EngineCore died: on-failure would leave it down for good."""
    text = VLLM_EXAMPLE.read_text()
    assert "\nRestart=always\n" in text and "WatchdogSec" not in text.replace("no WatchdogSec=", "")
    copy = tmp_path / "vllm@.service"
    copy.write_text(text.replace("/opt/vllm/bin/vllm", "/bin/true"))
    verify = subprocess.run([ANALYZE, "verify", "--man=no", f"{copy}"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path)
    assert verify.returncode == 0, verify.stderr
