"""``dapo deploy`` refuses train.optimizer_state_every > 1: the deployed train task starts fresh Elastic
pods every step, which would replay the steps since the last written optimizer state on every step."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli import deploy

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    deploy.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_deploy_refuses_optimizer_state_every_above_one(capsys) -> None:
    code = deploy.run_cli(_args("--dry-run", "--config", str(TINY), "--set", "train.optimizer_state_every=10"))
    err = capsys.readouterr().err
    assert code == 2
    assert "train.optimizer_state_every" in err and "DAPO_ENGINES_RAY_ADDRESS" in err
