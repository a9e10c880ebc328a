"""Which training steps go to the train host (engines/train/ray_host.py), and how the host is named.

With a long-lived Ray cluster named (settings/rollout.py: EngineHosting) the warm DeepSpeed group lives in a
named actor; a cold config, or no Ray address, trains in the task process as before. The host's name follows
the settings that shape the engine only (a new time limit must not strand a warm group in an old host).
The behaviour on a real cluster: tests/integration/test_persistent_engines.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from engines.runtime import ray_actors
from engines.train import launch, ray_host
from settings.rollout import ENGINES_NAMESPACE_ENV, ENGINES_RAY_ADDRESS_ENV, EngineHosting
from settings.train import TrainConfig

ON_CLUSTER = EngineHosting(ray_address="127.0.0.1:6379", namespace="run-a")


def test_only_warm_steps_with_a_ray_address_go_to_the_train_host() -> None:
    warm, cold = TrainConfig(), TrainConfig(keep_workers_warm=False)
    assert launch._hosted(warm, ON_CLUSTER) == ON_CLUSTER
    assert launch._hosted(cold, ON_CLUSTER) is None  # a cold step has no group to keep
    assert launch._hosted(warm, EngineHosting()) is None  # no cluster: the task's own group, as before


def test_the_hosting_defaults_to_the_one_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINES_RAY_ADDRESS_ENV, "auto")
    monkeypatch.setenv(ENGINES_NAMESPACE_ENV, "run-b")
    assert launch._hosted(TrainConfig(), None) == EngineHosting(ray_address="auto", namespace="run-b")
    monkeypatch.delenv(ENGINES_RAY_ADDRESS_ENV)
    assert launch._hosted(TrainConfig(), None) is None


def test_one_host_per_engine_settings_named_for_removal() -> None:
    name = ray_host.host_name(launch.engine_key(TrainConfig()))
    assert name.startswith(ray_actors.HOSTED_PREFIXES) and len(name) == len("train-group-") + 12
    # Neither the time limit nor the warm switch shapes the engine: the same host.
    assert ray_host.host_name(launch.engine_key(TrainConfig(timeout_s=5.0))) == name
    assert ray_host.host_name(launch.engine_key(replace(TrainConfig(), lr=2e-3))) != name


def test_the_host_claims_a_gpu_per_rank_only_for_a_cuda_caller_or_a_deployed_client_pod(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from infra import environments

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(environments, "flyte_target", lambda: "local")
    assert ray_host.host_gpus(4) == 0  # a CPU cluster: its logical GPUs belong to the engines
    monkeypatch.setattr(environments, "flyte_target", lambda: "cluster")
    monkeypatch.setattr(environments, "cluster_settings", lambda: {"train_on_host": False})
    assert ray_host.host_gpus(4) == 0
    monkeypatch.setattr(environments, "cluster_settings", lambda: {"train_on_host": True})
    assert ray_host.host_gpus(4) == 4  # the deployed train task: a GPU-less client of a GPU host
    monkeypatch.setattr(environments, "flyte_target", lambda: "local")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ray_host.host_gpus(4) == 4  # `dapo run` on a GPU machine


# --- a group on several nodes (engines/train/node_group.py) --------------------------------------------------


def test_a_group_on_several_nodes_names_a_lead_and_a_peer_per_other_node_all_removed_with_the_hosting() -> None:
    key = launch.engine_key(replace(TrainConfig(), num_processes=4))
    names = ray_host.member_names(key, 2)
    assert names == [ray_host.host_name(key) + "-2nodes", ray_host.host_name(key) + "-2nodes-node1"]
    assert all(name.startswith(ray_actors.HOSTED_PREFIXES) for name in names)
    assert ray_host.member_names(key, 1) == [ray_host.host_name(key)]  # one node: the host as before


def test_each_node_owns_its_contiguous_block_of_ranks_and_fetches_only_their_optimizer_state() -> None:
    from fnmatch import fnmatch

    from engines.train.node_group import NodeGroup, other_ranks_state

    nodes = [NodeGroup(nodes=2, node_rank=r, nproc_per_node=2, master_addr="10.0.0.1", master_port=29500) for r in (0, 1)]
    assert [list(n.ranks) for n in nodes] == [[0, 1], [2, 3]] and nodes[1].world == 4
    files = [f"ds_state/step1/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)]
    skipped = [[any(fnmatch(f, p) for p in other_ranks_state(4, n.ranks)) for f in files] for n in nodes]
    assert skipped == [[False, False, True, True], [True, True, False, False]]
    assert other_ranks_state(4, range(4)) == ()  # one node: the state whole


def test_a_relayed_request_names_every_file_through_the_rename_and_keeps_the_rest() -> None:
    from engines.train.node_group import renamed

    request = {"parent_checkpoint": "/m/s3/b/ck1", "resume_ds_state": "/m/s3/b/ck1/ds_state", "out_dir": "/m/s3/b/.s2.st",
               "probe_path": None, "start_updates": 3, "write_state": True,
               "steps": [{"step": 2, "shards": ["/m/s3/b/batch2.parquet"], "parent_version": 1}]}
    out = renamed(request, lambda p: p.replace("/m/s3/", "s3://"))
    assert out == {**request, "parent_checkpoint": "s3://b/ck1", "resume_ds_state": "s3://b/ck1/ds_state",
                   "out_dir": "s3://b/.s2.st", "steps": [{"step": 2, "shards": ["s3://b/batch2.parquet"],
                                                            "parent_version": 1}]}
    assert request["steps"][0]["shards"] == ["/m/s3/b/batch2.parquet"]  # the lead's own request is unchanged


def test_a_group_on_several_nodes_refuses_what_it_cannot_run_before_any_work() -> None:
    with pytest.raises(launch.TrainInputError, match="num_processes=3 does not split over the plan's 2 train nodes"):
        launch._check_node_group(replace(TrainConfig(), num_processes=3), 2, step=4)
    launch._check_node_group(replace(TrainConfig(), num_processes=2, optimizer_state_every=5), 2, step=4)
