"""prefect.yaml is the one source of the scheduled runs: what `serve`, `worker` and `prefect deploy` read."""

from __future__ import annotations

import inspect

import pytest
import yaml

from pipeline.core.io import ConfigError
from pipeline.orchestration.schedule import DEPLOYMENT_FILE, load
from tests.conftest import ROOT


def test_the_shipped_deployment_names_the_repro_flow_and_only_its_parameters():
    from pipeline.orchestration.orchestrate import repro_flow

    shipped = load(path=ROOT / DEPLOYMENT_FILE)
    raw = yaml.safe_load((ROOT / DEPLOYMENT_FILE).read_text())["deployments"][0]
    assert raw["entrypoint"] == "pipeline/orchestration/orchestrate.py:repro_flow" \
        and shipped.full_name == "repro/nightly"
    assert set(shipped.parameters) <= set(inspect.signature(repro_flow.fn).parameters)
    assert shipped.cron == "0 3 * * *" and shipped.timezone == "UTC" and shipped.pool == "pipeline"
    from pipeline.evaluation.compare import parse_gate

    assert [parse_gate(g) for g in shipped.parameters["gate"]] == [("sft_extended", 0.02)]


def write(tmp_path, deployments) -> object:
    path = tmp_path / "prefect.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "deployments": deployments}))
    return path


def test_bad_deployment_files_name_what_is_wrong(tmp_path):
    with pytest.raises(ConfigError, match="prefect.yaml: file not found"):
        load(path=tmp_path / "prefect.yaml")
    one = {"name": "a", "schedules": [{"cron": "0 1 * * *"}], "work_pool": {"name": "p"}}
    assert load(path=write(tmp_path, [one])).timezone == "UTC"  # Prefect's own default
    with pytest.raises(ConfigError, match=r"no deployment 'b' \(known: a\)"):
        load("b", path=write(tmp_path, [one]))
    with pytest.raises(ConfigError, match=r"deployments\.a\.schedules: one cron schedule expected"):
        load(path=write(tmp_path, [one | {"schedules": [{"interval": 60}]}]))
    with pytest.raises(ConfigError, match=r"deployments\.a\.work_pool\.name: missing"):
        load(path=write(tmp_path, [one | {"work_pool": {}}]))
