"""k8s/ against the code: the manifests and the image use only what the broker has.

No YAML library is installed (and none is added for this), so the manifests are
read by :class:`YamlSubset`, a strict parser of the subset they are written in:
block mappings and sequences, plain, quoted and flow-sequence scalars, ``|``
block scalars, comments and ``---``. Anything outside the subset is an error,
never a guess: a manifest that drifts out of it fails here rather than being
misread. Plain ``yes``/``no``/``on``/``off`` are refused too, since Kubernetes'
YAML 1.1 parser reads them as booleans; and, as it does, ``0440`` is octal.

Then the checks: every TOML key, ``ASBP_*`` variable and ``--flag`` exists in
gateway.config, and the ConfigMap loads as a broker configuration once the
Secrets' files exist; the probes ask for routes the app serves; the image's
entry point is the console script of pyproject.toml; selectors, names, ports
and mounts agree across files; Redis keeps an fsynced AOF on its volume; the
grace period covers the broker's own graceful stop.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import tomllib
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import Route

from agents import generate_agent_key
from gateway.app import create_app
from gateway.broker import _STOP_BUDGET
from gateway.config import CONFIG_ENV_VAR, add_arguments, load_config
from gateway.config.fields import settings
from gateway.config.model import GatewayConfig
from gateway.engines.redis.cluster_url import parse_cluster_url
from gateway.messaging.service import STOP_GRACE
from gateway.metrics.catalogue import METRICS
from gateway.ops.cli import main as cli_main
from gateway.ops.server import GRACEFUL_TIMEOUT
from tests.support import generate_tls_files

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "k8s"
#: Manifests shown but not applied (see kustomization.yaml): the Secrets' shape, and
#: the ServiceMonitor, whose kind exists only where the Prometheus Operator runs.
NOT_APPLIED = {"secrets.example.yaml", "broker-servicemonitor.yaml"}


# -- the YAML subset -----------------------------------------------------------------


class YamlError(ValueError):
    """Text outside the subset, or not YAML at all."""


_KEY = re.compile(r"[A-Za-z0-9_./-]+")
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?[0-9]+\.[0-9]+")
#: Plain scalars YAML 1.1 reads as booleans: they must be quoted in the subset.
_AMBIGUOUS = {"yes", "no", "on", "off", "y", "n", "Yes", "No", "On", "Off", "YES", "NO"}


class YamlSubset:
    """Parses one document of the subset; see the module docstring."""

    def __init__(self, text: str) -> None:
        if "\t" in text:
            raise YamlError("tabs are not allowed")
        self.lines = text.splitlines()
        self.pos = 0

    @classmethod
    def documents(cls, text: str) -> list[Any]:
        """Every non-empty document of a ``---`` separated stream."""
        chunks = re.split(r"(?m)^---[ \t]*$", text)
        return [doc for chunk in chunks if (doc := cls(chunk).parse()) is not None]

    def parse(self) -> Any:
        line = self._peek()
        if line is None:
            return None
        value = self._node(line[0])
        if self._peek() is not None:
            raise YamlError(f"line {self.pos + 1}: text after the document's end")
        return value

    # Structural lines: blank lines and comment lines are skipped.
    def _peek(self) -> tuple[int, str] | None:
        while self.pos < len(self.lines):
            raw = self.lines[self.pos]
            content = _strip_comment(raw).rstrip()
            if content.strip():
                return len(content) - len(content.lstrip(" ")), content.strip()
            self.pos += 1
        return None

    def _node(self, indent: int) -> Any:
        line = self._peek()
        assert line is not None and line[0] == indent
        if _is_item(line[1]):
            return self._sequence(indent)
        return self._mapping(indent)

    def _mapping(self, indent: int, first: str | None = None) -> dict[str, Any]:
        result: dict[str, Any] = {}
        while True:
            if first is not None:
                content, first = first, None
            else:
                line = self._peek()
                if line is None or line[0] < indent:
                    return result
                if line[0] > indent:
                    raise YamlError(f"line {self.pos + 1}: unexpected indentation")
                if _is_item(line[1]):
                    return result
                content = line[1]
            key, value = self._entry(content, indent)
            if key in result:
                raise YamlError(f"line {self.pos}: duplicate key {key!r}")
            result[key] = value

    def _entry(self, content: str, indent: int) -> tuple[str, Any]:
        key, colon, rest = content.partition(":")
        if not colon or (rest and not rest.startswith(" ")) or not _KEY.fullmatch(key):
            raise YamlError(f"line {self.pos + 1}: not a 'key: value' entry: {content!r}")
        rest = rest.strip()
        self.pos += 1
        if rest in ("|", "|-"):
            return key, self._block(indent, keep_newline=rest == "|")
        if rest:
            return key, _scalar(rest, self.pos)
        child = self._peek()
        if child is None or child[0] < indent or (child[0] == indent and not _is_item(child[1])):
            raise YamlError(f"line {self.pos}: {key!r} has no value")
        return key, self._node(child[0])

    def _sequence(self, indent: int) -> list[Any]:
        items: list[Any] = []
        while True:
            line = self._peek()
            if line is None or line[0] < indent or not _is_item(line[1]):
                return items
            if line[0] > indent:
                raise YamlError(f"line {self.pos + 1}: unexpected indentation")
            rest = line[1][1:].strip()
            if not rest:
                self.pos += 1
                child = self._peek()
                if child is None or child[0] <= indent:
                    raise YamlError(f"line {self.pos}: an empty sequence item")
                items.append(self._node(child[0]))
            elif _looks_like_entry(rest):
                # "- key: value" opens a mapping whose keys line up after "- ".
                items.append(self._mapping(indent + 2, first=rest))
            else:
                self.pos += 1
                items.append(_scalar(rest, self.pos))

    def _block(self, indent: int, *, keep_newline: bool) -> str:
        lines: list[str] = []
        while self.pos < len(self.lines):
            raw = self.lines[self.pos]
            if raw.strip() and len(raw) - len(raw.lstrip(" ")) <= indent:
                break
            lines.append(raw)
            self.pos += 1
        while lines and not lines[-1].strip():
            lines.pop()
        if not lines:
            raise YamlError(f"line {self.pos}: an empty block scalar")
        margin = min(len(line) - len(line.lstrip(" ")) for line in lines if line.strip())
        text = "\n".join(line[margin:] for line in lines)
        return text + "\n" if keep_newline else text


def _is_item(content: str) -> bool:
    return content == "-" or content.startswith("- ")


def _looks_like_entry(text: str) -> bool:
    key, colon, rest = text.partition(":")
    return bool(colon) and (not rest or rest.startswith(" ")) and bool(_KEY.fullmatch(key))


def _strip_comment(line: str) -> str:
    """``line`` without a trailing comment (a ``#`` at the start or after a space)."""
    quote = ""
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = ""
        elif char in "\"'" and (index == 0 or line[index - 1] in " [,"):
            quote = char  # opens a quoted scalar; an apostrophe inside a word does not
        elif char == "#" and (index == 0 or line[index - 1] == " "):
            return line[:index]
    return line


def _scalar(text: str, line: int) -> Any:
    if text.startswith('"'):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise YamlError(f"line {line}: a bad double-quoted scalar: {text!r}") from exc
        if not isinstance(value, str):
            raise YamlError(f"line {line}: a bad double-quoted scalar: {text!r}")
        return value
    if text.startswith("'"):
        if len(text) < 2 or not text.endswith("'") or "'" in text[1:-1].replace("''", ""):
            raise YamlError(f"line {line}: a bad single-quoted scalar: {text!r}")
        return text[1:-1].replace("''", "'")
    if text.startswith("["):
        if not text.endswith("]"):
            raise YamlError(f"line {line}: an unclosed flow sequence: {text!r}")
        inner = text[1:-1].strip()
        items = re.findall(r"\s*(\"(?:[^\"\\]|\\.)*\"|'(?:[^']|'')*'|[^,]+)\s*(?:,|$)", inner)
        if inner and ",".join(items).replace(" ", "") != inner.replace(" ", ""):
            raise YamlError(f"line {line}: a flow sequence outside the subset: {text!r}")
        return [_scalar(item.strip(), line) for item in items]
    if text == "{}":
        return {}
    if text[0] in "{&*!|>%@`" or ": " in text or text in _AMBIGUOUS:
        raise YamlError(f"line {line}: a plain scalar outside the subset: {text!r}")
    if text in ("true", "false"):
        return text == "true"
    if text in ("null", "~"):
        return None
    if _INT.fullmatch(text):
        # YAML 1.1, as Kubernetes reads it: a leading 0 makes an octal number.
        return (
            int(text, 8) if len(text.lstrip("-")) > 1 and text.lstrip("-")[0] == "0" else int(text)
        )
    if _FLOAT.fullmatch(text):
        return float(text)
    return text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\nb: x\n", {"a": 1, "b": "x"}),
        ("a:\n  b: [\"x\", 'y''s', 3]\n", {"a": {"b": ["x", "y's", 3]}}),
        ("a:\n- 1\n- b: 2\n  c: 3 # a comment\n", {"a": [1, {"b": 2, "c": 3}]}),
        ("a:\n  - name: x\n    v: 'a # b'\n", {"a": [{"name": "x", "v": "a # b"}]}),
        ("a: it's # a comment\n", {"a": "it's"}),
        ("a: |\n  x = 1\n\n  # kept\nb: 0440\n", {"a": "x = 1\n\n# kept\n", "b": 0o440}),
        (
            'a: ""\nb: "-"\nc: true\nd: null\ne: 1.5\n',
            {"a": "", "b": "-", "c": True, "d": None, "e": 1.5},
        ),
    ],
)
def test_the_subset_parser_reads(text: str, expected: Any) -> None:
    assert YamlSubset(text).parse() == expected


@pytest.mark.parametrize(
    "text",
    [
        "a: yes\n",  # a YAML 1.1 boolean
        "a: 1\na: 2\n",  # duplicate key
        "a: 1\n   b: 2\n",  # bad indentation
        "a:\n",  # no value
        "a: &anchor x\n",  # anchors are outside the subset
        "a: {b: 1}\n",  # flow mappings too
        "a:b\n",  # not an entry
        "a: [1, 2\n",  # unclosed
        "a: 'x\n",  # unclosed quote
        "a:\n\tb: 1\n",  # a tab
    ],
)
def test_the_subset_parser_refuses(text: str) -> None:
    with pytest.raises(YamlError):
        YamlSubset(text).parse()


# -- reading k8s/ ---------------------------------------------------------------------


def manifest_files() -> list[Path]:
    return sorted(path for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml")


def manifests() -> list[dict[str, Any]]:
    """Every object that ``kubectl apply -k k8s/`` applies."""
    return [
        document
        for path in manifest_files()
        if path.name not in NOT_APPLIED
        for document in YamlSubset.documents(path.read_text())
    ]


def find(kind: str, name: str) -> dict[str, Any]:
    found = [m for m in manifests() if m["kind"] == kind and m["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def broker() -> dict[str, Any]:
    return find("Deployment", "asbp-broker")


def broker_container() -> dict[str, Any]:
    (container,) = broker()["spec"]["template"]["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def redis() -> dict[str, Any]:
    return find("StatefulSet", "asbp-redis")


def broker_toml() -> str:
    text = find("ConfigMap", "asbp-broker-config")["data"]["broker.toml"]
    assert isinstance(text, str)
    return text


def config_path() -> str:
    """The TOML file the broker container is told to read."""
    args = broker_container()["args"]
    return str(args[args.index("--config") + 1])


def mounts() -> dict[str, dict[str, Any]]:
    """The broker container's mounts by mountPath, each with its volume."""
    volumes = {v["name"]: v for v in broker()["spec"]["template"]["spec"]["volumes"]}
    return {
        mount["mountPath"]: volumes[mount["name"]] for mount in broker_container()["volumeMounts"]
    }


def flags(arguments: list[str]) -> argparse.Namespace:
    """``arguments`` parsed as ``asbp broker`` parses them; an unknown flag fails."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_arguments(parser)
    try:
        namespace, unknown = parser.parse_known_args(arguments)
    except argparse.ArgumentError as exc:
        pytest.fail(f"asbp broker refuses {arguments}: {exc}")
    assert not unknown, f"asbp broker has no flags {unknown}"
    return namespace


def env_names(text: str) -> set[str]:
    return set(re.findall(r"\bASBP_[A-Z0-9_]+", text))


def install(tmp_path: Path) -> dict[str, str]:
    """The broker pod's files under ``tmp_path``; returns its ASBP_* environment.

    Each mount of the broker container becomes a directory under ``tmp_path``,
    filled as Kubernetes would: the ConfigMap's keys (its absolute paths under a
    mount moved under ``tmp_path`` too), and for each key secrets.example.yaml
    shows a real file: a TLS certificate and key, an agent's public key.
    """
    secrets = {
        secret["metadata"]["name"]: secret
        for secret in YamlSubset.documents((K8S / "secrets.example.yaml").read_text())
    }
    tls = generate_tls_files(tmp_path / "generated")
    _, public_pem = generate_agent_key()
    real = {"tls.crt": tls.cert.read_text(), "tls.key": tls.key.read_text()}

    def moved(match: re.Match[str]) -> str:
        path = match.group(1)
        inside = any(path == mount or path.startswith(mount + "/") for mount in mounts())
        return f'"{tmp_path}{path}"' if inside else match.group(0)

    for mount, volume in mounts().items():
        directory = tmp_path / mount.lstrip("/")
        directory.mkdir(parents=True)
        if "configMap" in volume:
            for key, text in find("ConfigMap", volume["configMap"]["name"])["data"].items():
                (directory / key).write_text(re.sub(r'"(/[^"]*)"', moved, text))
        elif "secret" in volume:
            for key in secrets[volume["secret"]["secretName"]]["stringData"]:
                (directory / key).write_text(real.get(key, public_pem))
    return {
        item["name"]: "asbp-broker-7d9f8c6b5-x2k4q" if "valueFrom" in item else item["value"]
        for item in broker_container().get("env", [])
    }


# -- the checks -----------------------------------------------------------------------


def test_every_manifest_parses_and_kustomize_applies_each_one() -> None:
    kustomization = YamlSubset((K8S / "kustomization.yaml").read_text()).parse()
    listed = set(kustomization["resources"])
    present = {path.name for path in manifest_files()}
    assert listed == present - NOT_APPLIED, "kustomization.yaml and k8s/*.yaml disagree"
    seen: set[tuple[str, str]] = set()
    for path in manifest_files():
        for document in YamlSubset.documents(path.read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(document), path.name
            key = (document["kind"], document["metadata"]["name"])
            assert key not in seen, f"{path.name}: {key} twice"
            seen.add(key)
            namespace = document["metadata"].get("namespace", kustomization["namespace"])
            assert namespace == kustomization["namespace"], path.name


def test_the_config_map_uses_only_settings_that_exist() -> None:
    known = {setting.key for setting in settings()}
    document = tomllib.loads(broker_toml())
    used: set[str] = set()
    for key, value in document.items():
        if key == "agents":  # [agents.<identity>]: identities are the operator's
            continue
        if isinstance(value, dict):
            used.update(f"{key}.{name}" for name in value)
        else:
            used.add(key)
    assert used, "the TOML is empty"
    assert used <= known, f"no such settings: {sorted(used - known)}"
    assert document["engine"] == "redis"


def test_the_config_map_loads_as_the_brokers_configuration(tmp_path: Path) -> None:
    environ = install(tmp_path)
    overrides = vars(flags(broker_container()["args"]))
    overrides["config"] = f"{tmp_path}{config_path()}"
    config = load_config(argparse.Namespace(**overrides), environ=environ)
    assert config.engine == "redis"
    assert config.host == "0.0.0.0"
    assert config.tls is not None, "Tubes need TLS that ends at the broker"
    assert config.broker_id == environ["ASBP_BROKER_ID"]
    assert config.agents, "no Application-Agent could connect"
    # The data_dir is a writable emptyDir, the root filesystem being read-only.
    data_dir = "/" + str(config.data_dir.relative_to(tmp_path))
    assert "emptyDir" in mounts()[data_dir]
    (port,) = broker_container()["ports"]
    assert config.port == port["containerPort"]


def test_every_asbp_variable_exists() -> None:
    known = {setting.env for setting in settings()} | {CONFIG_ENV_VAR}
    files = [path for path in K8S.rglob("*") if path.is_file()]
    for path in [*files, ROOT / "docs" / "kubernetes.md"]:
        used = env_names(path.read_text())
        assert used <= known, f"{path.name}: no such variables {sorted(used - known)}"
    assert "ASBP_BROKER_ID" in env_names((K8S / "broker-deployment.yaml").read_text())


def test_every_broker_flag_exists() -> None:
    container = broker_container()
    assert "command" not in container, "the image's entry point runs the broker"
    flags(container["args"])
    # Flags written anywhere else in the broker's files, its comments included.
    known = {"--config"}
    for setting in settings():
        if setting.flag is not None:
            known.add(setting.flag)
            if setting.kind == "bool":
                known.add("--no-" + setting.flag.removeprefix("--"))
    for name in ("broker-deployment.yaml", "broker-config.yaml"):
        used = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", (K8S / name).read_text()))
        assert used <= known, f"{name}: asbp broker has no flags {sorted(used - known)}"


def test_the_probes_ask_for_routes_the_app_serves() -> None:
    app = create_app(GatewayConfig())
    served = {
        route.path
        for route in app.routes
        if isinstance(route, Route) and "GET" in (route.methods or ())
    }
    container = broker_container()
    (port,) = container["ports"]
    tls = "tls" in tomllib.loads(broker_toml())
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        request = container[probe]["httpGet"]
        assert request["path"] == path and path in served, probe
        assert request["port"] in (port["name"], port["containerPort"]), probe
        assert request["scheme"] == ("HTTPS" if tls else "HTTP"), probe


def test_the_image_runs_the_installed_console_script() -> None:
    dockerfile = (K8S / "Dockerfile").read_text()
    instructions = [line for line in dockerfile.splitlines() if line and not line.startswith("#")]
    stages = [line.split()[1] for line in instructions if line.startswith("FROM ")]
    assert stages[-1] == "python:3.11-slim", "the image the broker runs in"
    (entrypoint,) = [line for line in instructions if line.startswith("ENTRYPOINT ")]
    program, *arguments = json.loads(entrypoint.removeprefix("ENTRYPOINT "))
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts.get(program) == "gateway.ops.cli:main"
    assert arguments == ["broker"]
    with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(io.StringIO()) as out:
        cli_main([*arguments, "--help"])
    assert exit_info.value.code == 0 and "Run a broker" in out.getvalue()
    # Installed without the spark extra, and run as a user that is not root.
    installs = [line for line in instructions if "pip " in line]
    assert installs and not any("spark" in line or "[" in line for line in installs)
    (user,) = [line.split()[1] for line in instructions if line.startswith("USER ")]
    uid = int(user.partition(":")[0])
    assert uid != 0
    assert broker()["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == uid


def test_broker_pods_run_locked_down() -> None:
    pod = broker()["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    context = broker_container()["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"]["drop"] == ["ALL"]
    assert broker_container()["resources"]["requests"]["cpu"], "the HPA scales on the request"


def test_the_grace_period_covers_the_graceful_stop() -> None:
    pod = broker()["spec"]["template"]["spec"]
    command = broker_container()["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    # On a bus the drain comes first (gateway.drain), and the closing steps after.
    drain = GatewayConfig().drain_timeout + 2
    needed = int(command[1]) + drain + GRACEFUL_TIMEOUT + STOP_GRACE + _STOP_BUDGET
    assert pod["terminationGracePeriodSeconds"] > needed


def test_names_selectors_and_ports_agree() -> None:
    broker_labels = broker()["spec"]["template"]["metadata"]["labels"]
    redis_labels = redis()["spec"]["template"]["metadata"]["labels"]
    assert broker()["spec"]["selector"]["matchLabels"].items() <= broker_labels.items()
    assert redis()["spec"]["selector"]["matchLabels"].items() <= redis_labels.items()
    for name in ("asbp-broker", "asbp-broker-peers"):
        service = find("Service", name)
        assert service["spec"]["selector"].items() <= broker_labels.items(), name
        for port in service["spec"]["ports"]:
            assert port["targetPort"] == broker_container()["ports"][0]["name"], name
    assert find("Service", "asbp-broker-peers")["spec"]["clusterIP"] == "None"
    pdb = find("PodDisruptionBudget", "asbp-broker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= broker_labels.items()
    target = find("HorizontalPodAutoscaler", "asbp-broker")["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", "asbp-broker")
    # Redis: reached by the name and port of redis_url, from brokers only.
    url = urllib.parse.urlsplit(tomllib.loads(broker_toml())["redis_url"])
    service = find("Service", str(url.hostname))
    assert service["spec"]["selector"].items() <= redis_labels.items()
    assert redis()["spec"]["serviceName"] == url.hostname
    (redis_port,) = redis()["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [port["port"] for port in service["spec"]["ports"]] == [url.port]
    assert url.port == redis_port["containerPort"]
    policy = find("NetworkPolicy", "asbp-redis")["spec"]
    assert policy["podSelector"]["matchLabels"].items() <= redis_labels.items()
    (rule,) = policy["ingress"]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"].items() <= broker_labels.items()
    assert [p["port"] for p in rule["ports"]] == [redis_port["containerPort"]]
    # Every Secret and ConfigMap the brokers mount is one the repository describes.
    examples = YamlSubset.documents((K8S / "secrets.example.yaml").read_text())
    secrets = {secret["metadata"]["name"] for secret in examples}
    for volume in mounts().values():
        if "secret" in volume:
            assert volume["secret"]["secretName"] in secrets
        if "configMap" in volume:
            find("ConfigMap", volume["configMap"]["name"])


def test_http_channels_need_no_affinity() -> None:
    # Any broker answers any request of an HTTP Channel (its mailbox is the plane's
    # Channel log), so requests spread over every broker (docs/kubernetes.md).
    service = find("Service", "asbp-broker")["spec"]
    assert service["sessionAffinity"] == "None"
    assert "sessionAffinityConfig" not in service


def test_redis_keeps_an_fsynced_aof_on_its_volume() -> None:
    (container,) = redis()["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    options = dict(zip(args[::2], args[1::2], strict=True))
    assert options["--appendonly"] == "yes"
    assert options["--appendfsync"] == "always"
    assert options["--maxmemory-policy"] == "noeviction"
    (claim,) = redis()["spec"]["volumeClaimTemplates"]
    (mount,) = container["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"]
    assert options["--dir"] == mount["mountPath"]
    assert redis()["spec"]["replicas"] == 1


def test_the_docs_describe_every_file() -> None:
    docs = (ROOT / "docs" / "kubernetes.md").read_text()
    for path in K8S.rglob("*"):
        assert f"{path.relative_to(ROOT).as_posix()}" in docs, path.name
    assert "(kubernetes.md)" in (ROOT / "docs" / "index.md").read_text()
    assert "(spark.md)" in docs


# -- monitoring ------------------------------------------------------------------------


def _exported_samples() -> set[str]:
    """Every sample name a scrape can hold (counters end in _total, histograms in
    _bucket, _sum and _count)."""
    names: set[str] = set()
    for metric in METRICS:
        if metric.kind == "counter":
            names.add(metric.name + "_total")
        elif metric.kind == "histogram":
            names |= {metric.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(metric.name)
    return names


def _expressions(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["expr"]] if isinstance(node.get("expr"), str) else []
        return found + [e for value in node.values() for e in _expressions(value)]
    if isinstance(node, list):
        return [e for value in node for e in _expressions(value)]
    return []


def test_the_dashboard_queries_only_metrics_the_broker_exports() -> None:
    dashboard = json.loads((K8S / "grafana-dashboard.json").read_text())
    expressions = _expressions(dashboard["panels"])
    assert len(expressions) >= 10
    exported = _exported_samples()
    used: set[str] = set()
    for expr in expressions:
        names = set(re.findall(r"\basbp_[a-z_]+", expr))
        assert names, f"a panel queries nothing of the broker's: {expr}"
        assert names <= exported, f"{expr}: no such metrics {sorted(names - exported)}"
        used |= names
    # The charts the issue names: Channels, Commands per second, faults per second.
    assert {"asbp_channels", "asbp_commands_total", "asbp_faults_total"} <= used


def test_prometheus_finds_the_brokers_metrics_where_the_app_serves_them() -> None:
    app = create_app(GatewayConfig())
    served = {route.path for route in app.routes if isinstance(route, Route)}
    template = broker()["spec"]["template"]
    annotations = template["metadata"]["annotations"]
    (port,) = broker_container()["ports"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] in served
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    tls = "tls" in tomllib.loads(broker_toml())
    assert annotations["prometheus.io/scheme"] == ("https" if tls else "http")

    [monitor] = YamlSubset.documents((K8S / "broker-servicemonitor.yaml").read_text())
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["path"] in served
    assert endpoint["scheme"] == ("https" if tls else "http")
    # It selects exactly one Service (else every broker is scraped twice), with that port.
    wanted = monitor["spec"]["selector"]["matchLabels"]
    services = [
        document
        for document in manifests()
        if document["kind"] == "Service"
        and wanted.items() <= document["metadata"].get("labels", {}).items()
    ]
    assert [s["metadata"]["name"] for s in services] == ["asbp-broker-peers"]
    assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}


# -- the Redis Cluster overlay (k8s/overlays/redis-cluster/) --------------------------

OVERLAY = K8S / "overlays" / "redis-cluster"


def overlay(name: str) -> dict[str, Any]:
    (document,) = YamlSubset.documents((OVERLAY / name).read_text())
    assert isinstance(document, dict)
    return document


def cluster_redis_options() -> dict[str, str]:
    (container,) = overlay("redis-cluster-patch.yaml")["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    return dict(zip(args[::2], args[1::2], strict=True))


def test_the_overlay_lists_every_file_and_patches_objects_of_the_base() -> None:
    kustomization = overlay("kustomization.yaml")
    assert (
        kustomization["namespace"]
        == YamlSubset((K8S / "kustomization.yaml").read_text()).parse()["namespace"]
    )
    assert "../../" in kustomization["resources"]
    listed = {r for r in kustomization["resources"] if r != "../../"}
    listed |= {patch["path"] for patch in kustomization["patches"]}
    present = {p.name for p in OVERLAY.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present, "kustomization.yaml and the overlay's files disagree"
    base = {(m["kind"], m["metadata"]["name"]) for m in manifests()}
    for patch in kustomization["patches"]:
        document = overlay(patch["path"])
        assert (document["kind"], document["metadata"]["name"]) in base, patch["path"]
    for resource in listed - {patch["path"] for patch in kustomization["patches"]}:
        document = overlay(resource)
        assert (document["kind"], document["metadata"]["name"]) not in base, resource


def test_every_cluster_node_keeps_the_base_s_durability_and_announces_its_name() -> None:
    base = redis()["spec"]["template"]["spec"]["containers"][0]["args"]
    options = cluster_redis_options()
    for flag, value in zip(base[::2], base[1::2], strict=True):
        assert options[flag] == value, flag  # every option of the base, unchanged
    assert options["--cluster-enabled"] == "yes"
    # nodes.conf on the volume, so that a node keeps its identity across restarts.
    assert options["--cluster-config-file"].startswith(options["--dir"] + "/")
    assert options["--cluster-announce-hostname"] == "$(POD_NAME).asbp-redis"
    assert options["--cluster-preferred-endpoint-type"] == "hostname"
    patch = overlay("redis-cluster-patch.yaml")
    assert patch["spec"]["replicas"] == 6
    (container,) = patch["spec"]["template"]["spec"]["containers"]
    assert {port["containerPort"] for port in container["ports"]} == {6379, 16379}
    assert container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_the_create_job_forms_three_primaries_with_a_replica_each_once() -> None:
    job = overlay("redis-cluster-create-job.yaml")
    (container,) = job["spec"]["template"]["spec"]["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = job["spec"]["template"]["spec"]["volumes"]
    assert mount["name"] == volume["name"]
    script_map = overlay("redis-cluster-create-script.yaml")
    assert volume["configMap"]["name"] == script_map["metadata"]["name"]
    (name,) = script_map["data"]
    assert container["command"] == ["sh", f"{mount['mountPath']}/{name}"]
    script = script_map["data"][name]
    assert "--cluster-replicas 1" in script
    assert "cluster_state:ok" in script  # a formed cluster is left alone
    assert script.count("asbp-redis-$n.asbp-redis") == 1
    assert "0 1 2 3 4 5" in script
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    labels = job["spec"]["template"]["metadata"]["labels"]
    policy = overlay("redis-networkpolicy-patch.yaml")
    admitted = [
        selector["podSelector"]["matchLabels"]["app.kubernetes.io/name"]
        for rule in policy["spec"]["ingress"]
        for selector in rule["from"]
    ]
    assert labels["app.kubernetes.io/name"] in admitted
    assert "asbp-redis" in admitted  # the cluster bus between nodes
    assert "asbp-broker" in admitted


def test_the_brokers_name_the_cluster_and_the_configuration_takes_it(tmp_path: Path) -> None:
    (container,) = overlay("broker-redis-url-patch.yaml")["spec"]["template"]["spec"]["containers"]
    assert container["name"] == broker_container()["name"]
    (variable,) = container["env"]
    assert variable["name"] == "ASBP_REDIS_URL"
    url = variable["value"]
    address = parse_cluster_url(url)
    assert {host for host, _ in address.seeds} <= {f"asbp-redis-{n}.asbp-redis" for n in range(6)}
    environ = install(tmp_path) | {"ASBP_REDIS_URL": url}
    overrides = vars(flags(broker_container()["args"]))
    overrides["config"] = f"{tmp_path}{config_path()}"
    config = load_config(argparse.Namespace(**overrides), environ=environ)
    assert config.redis_url == url


def test_redis_nodes_are_disrupted_one_at_a_time() -> None:
    pdb = overlay("redis-pdb.yaml")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == redis()["spec"]["selector"]["matchLabels"]
