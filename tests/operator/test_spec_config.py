"""Parsing the AgentDeployment spec and the operator's own configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from sessionmem_core import env
from sessionmem_core.env import ConfigError
from sessionmem_core.keys import Scope
from sessionmem_operator.config import DEFAULT_LAUNCHER_IMAGE, OperatorConfig
from sessionmem_operator.spec import ExecutionModel, SpecError, SummarySpec, parse_agent, parse_duration


@pytest.mark.parametrize(
    ("text", "seconds"), [("24h", 86400), ("90m", 5400), ("1h30m", 5400), ("45s", 45), ("1h0m1s", 3601)]
)
def test_parse_duration(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1d", "h", "1.5h", "30s1m"])
def test_parse_duration_rejects_other_formats(text: str) -> None:
    with pytest.raises(SpecError):
        parse_duration(text)


def body(spec: dict[str, object]) -> dict[str, object]:
    return {"metadata": {"name": "a", "namespace": "ns", "uid": "u", "generation": 3}, "spec": spec}


def test_parse_agent_applies_defaults_when_the_server_did_not() -> None:
    agent = parse_agent(body({"image": "img", "sessionMemory": {}}))
    assert agent.execution_model is ExecutionModel.SERVING
    assert agent.generation == 3
    assert agent.memory is not None
    assert agent.memory.scope is Scope.SESSION
    assert agent.memory.replay_messages == env.DEFAULT_REPLAY_MESSAGES
    assert agent.memory.max_entries == env.DEFAULT_CAP
    assert agent.memory.ttl_seconds == env.DEFAULT_TTL_SECONDS
    assert agent.memory.replay_tokens is None
    assert agent.memory.redact == ()
    assert agent.memory.summary is None
    assert agent.memory.token_counter == "approx"
    assert agent.agent_port == env.DEFAULT_AGENT_PORT
    assert agent.serving_port == env.DEFAULT_SERVE_PORT


def test_parse_agent_reads_the_memory_policies() -> None:
    memory = {
        "redact": ["email", "card", "employee-id"],
        "summary": {"threshold": 60, "endpoint": "http://127.0.0.1:8081/summarize"},
        "replayTokens": 4000,
        "tokenCounter": "my_pkg.tokens:count",
    }
    agent = parse_agent(body({"image": "img", "sessionMemory": memory}))
    assert agent.memory is not None
    assert agent.memory.redact == ("email", "card", "employee-id")
    assert agent.memory.summary == SummarySpec(threshold=60, endpoint="http://127.0.0.1:8081/summarize")
    assert agent.memory.replay_tokens == 4000
    assert agent.memory.token_counter == "my_pkg.tokens:count"


def test_summary_defaults_to_the_builtin_summariser_and_off_without_threshold() -> None:
    agent = parse_agent(body({"image": "img", "sessionMemory": {"summary": {}}}))
    assert agent.memory is not None
    assert agent.memory.summary == SummarySpec(threshold=None, endpoint="builtin")
    agent = parse_agent(body({"image": "img", "sessionMemory": {"summary": {"threshold": 50}}}))
    assert agent.memory is not None and agent.memory.summary == SummarySpec(threshold=50, endpoint="builtin")


def test_absent_or_null_session_memory_is_off() -> None:
    assert parse_agent(body({"image": "img"})).memory is None
    assert parse_agent(body({"image": "img", "sessionMemory": None})).memory is None
    assert parse_agent(body({"image": "img"})).agent_port == env.DEFAULT_SERVE_PORT


def test_parse_agent_rejects_what_the_schema_would() -> None:
    with pytest.raises(SpecError):
        parse_agent(body({}))
    with pytest.raises(SpecError):
        parse_agent(body({"image": "img", "executionModel": "lambda"}))
    with pytest.raises(SpecError):
        parse_agent(body({"image": "img", "sessionMemory": {"scope": "team"}}))
    with pytest.raises(SpecError):
        parse_agent(body({"image": "img", "sessionMemory": {"summary": {"threshold": "many"}}}))


def test_config_defaults() -> None:
    config = OperatorConfig.load({})
    assert config.launcher_image == DEFAULT_LAUNCHER_IMAGE
    assert config.proxy_url is None
    assert config.audience == env.DEFAULT_AUDIENCE
    assert config.token_expiration_seconds == 600
    assert config.clusterwide


def test_config_env_overrides_the_file(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text(
        "proxyUrl: http://file-proxy:8000/\n"
        "audience: file-aud\n"
        "namespaces: [team-a, team-b]\n"
        "launcherResources: {requests: {cpu: 10m}}\n"
    )
    config = OperatorConfig.load(
        {
            env.OPERATOR_CONFIG_FILE: str(path),
            env.OPERATOR_PROXY_URL: "http://env-proxy:8000",
            env.OPERATOR_LAUNCHER_IMAGE: "reg/launcher:2",
            env.OPERATOR_TOKEN_EXPIRATION_SECONDS: "1200",
            env.OPERATOR_AUDIENCE: "",  # empty means unset: the file's value stays
        }
    )
    assert config.proxy_url == "http://env-proxy:8000"
    assert config.launcher_image == "reg/launcher:2"
    assert config.audience == "file-aud"
    assert config.token_expiration_seconds == 1200
    assert config.namespaces == ("team-a", "team-b")
    assert not config.clusterwide
    assert config.launcher_resources == {"requests": {"cpu": "10m"}}


@pytest.mark.parametrize(
    "environ",
    [
        {env.OPERATOR_TOKEN_EXPIRATION_SECONDS: "60"},  # below the API server's minimum
        {env.OPERATOR_TOKEN_EXPIRATION_SECONDS: "ten"},
        {env.OPERATOR_PROXY_URL: "proxy:8000"},
        {env.OPERATOR_LAUNCHER_IMAGE: "has space"},
        {env.OPERATOR_CONFIG_FILE: "/nonexistent/operator.yaml"},
    ],
)
def test_bad_config_fails_at_start(environ: dict[str, str]) -> None:
    with pytest.raises(ConfigError):
        OperatorConfig.load(environ)


def test_unknown_file_keys_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("proxyURL: http://typo:8000\n")
    with pytest.raises(ConfigError, match="proxyURL"):
        OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})


def test_config_reads_what_the_proxy_accepts_and_the_resync_period(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("redactors: [employee-id, badge]\nuserCapabilities: true\nresyncSeconds: 2.5\n")
    config = OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})
    assert config.redactors == ("employee-id", "badge")
    assert config.known_redactors == {"email", "card", "phone", "employee-id", "badge"}
    assert config.user_capabilities is True
    assert config.resync_seconds == 2.5
    defaults = OperatorConfig.load({})
    assert defaults.redactors == () and defaults.user_capabilities is False and defaults.resync_seconds == 60.0
    assert defaults.memory_health_seconds == 10.0


def test_the_backend_health_period_may_be_off(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("memoryHealthSeconds: 0\n")
    assert OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)}).memory_health_seconds == 0


@pytest.mark.parametrize(
    "text",
    [
        "redactors: [email]\n",
        "redactors: [Bad_Name]\n",
        "userCapabilities: maybe\n",
        "resyncSeconds: 0\n",
        "memoryHealthSeconds: 0.5\n",
        "memoryHealthSeconds: -1\n",
    ],
    ids=[
        "redefines-a-builtin",
        "bad-redactor-name",
        "not-a-boolean",
        "resync-too-short",
        "health-too-often",
        "health-negative",
    ],
)
def test_bad_proxy_facts_fail_at_start(tmp_path: Path, text: str) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})


def test_launcher_limits_become_the_launchers_env_names(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("launcherLimits: {maxHeaderBytes: 8192, idleTimeoutSeconds: 2.5, maxConnections: 64}\n")
    config = OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})
    assert dict(config.launcher_limits) == {
        env.MAX_HEADER_BYTES: "8192",
        env.IDLE_TIMEOUT_SECONDS: "2.5",
        env.MAX_CONNECTIONS: "64",
    }
    assert OperatorConfig.load({}).launcher_limits == ()


def test_the_launchers_otlp_endpoint_is_an_http_url(tmp_path: Path) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text("launcherOtlpEndpoint: http://collector.obs.svc:4318\n")
    assert OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)}).launcher_otlp_endpoint == (
        "http://collector.obs.svc:4318"
    )
    assert OperatorConfig.load({}).launcher_otlp_endpoint is None
    path.write_text("launcherOtlpEndpoint: collector:4318\n")
    with pytest.raises(ConfigError, match="OTLP"):
        OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})


@pytest.mark.parametrize(
    "text",
    [
        "launcherLimits: {maxHeaders: 1}\n",
        "launcherLimits: {maxHeaderBytes: 0}\n",
        "launcherLimits: {maxHeaderBytes: 1.5}\n",
        "launcherLimits: {idleTimeoutSeconds: soon}\n",
    ],
    ids=["unknown-key", "zero", "fractional-size", "not-a-number"],
)
def test_bad_launcher_limits_fail_at_start(tmp_path: Path, text: str) -> None:
    path = tmp_path / "operator.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        OperatorConfig.load({env.OPERATOR_CONFIG_FILE: str(path)})
