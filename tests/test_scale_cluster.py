"""A pool across two nodes of a local Ray cluster (``ray.cluster_utils.Cluster``): the command
joins it by address and leaves it running; a node lost mid-run is survived, bit-identically.

The cluster (two nodes of one CPU each, on this machine) serves the module; losing a node is
the last test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from click.testing import CliRunner  # noqa: E402

import esbox  # noqa: E402
from esbox.adapters.functions import get_function  # noqa: E402
from esbox.adapters.scale import RayPool, VectorReplica, state_checksum  # noqa: E402
from esbox.cli.main import cli  # noqa: E402
from esbox.runner import Budget, Runner  # noqa: E402

REPLICA = VectorReplica(get_function("rosenbrock"), np.linspace(-1.0, 1.5, 10))
OPTIONS = {"population": 8, "subspaces": 2, "sigma": 0.05, "learning_rate": 0.01}
SPREAD = {"num_cpus": 0.5, "scheduling_strategy": "SPREAD"}  # one actor on each node


@pytest.fixture(scope="module")
def cluster():
    head = {"num_cpus": 1, "include_dashboard": False}
    nodes = cluster_utils.Cluster(initialize_head=True, head_node_args=head)
    worker = nodes.add_node(num_cpus=1)
    nodes.wait_for_nodes()
    yield nodes, worker
    if ray.is_initialized():
        ray.shutdown()
    nodes.shutdown()


def connect(address: str) -> None:
    if not ray.is_initialized():
        ray.init(address=address, log_to_driver=False, configure_logging=False)


def metrics(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "wall_seconds"} for row in rows]


def alive_nodes() -> int:
    return sum(node["Alive"] for node in ray.nodes())


def test_the_command_joins_a_cluster_by_address_and_leaves_it_running(cluster, tmp_path):
    nodes, _ = cluster
    if ray.is_initialized():
        ray.shutdown()  # the command connects by itself
    runs = {}
    for name, scale in {"single": [], "joined": [f"scale.address={nodes.address}"]}.items():
        settings = ["problem.dimension=10", "budget.max_steps=4", "budget.max_evaluations=null"]
        if scale:
            scale += ["scale.workers=2", "scale.cpus=0.5", "scale.placement=spread"]
        args = ["optimize", "-q", "--out", str(tmp_path / name)]
        args += [f"--set={s}" for s in settings + scale]
        result = CliRunner().invoke(cli, args, catch_exceptions=False)
        assert result.exit_code == 0, result.output
        runs[name] = tmp_path / name
    assert not ray.is_initialized()  # the command left the cluster...
    connect(nodes.address)
    assert alive_nodes() == 2  # ...and did not shut it down
    for name in ("final.npy", "best.npy"):
        assert np.load(runs["single"] / name).tobytes() == np.load(runs["joined"] / name).tobytes()
    assert metrics(runs["single"]) == metrics(runs["joined"])


def test_a_pool_across_two_nodes_survives_losing_one(cluster) -> None:
    nodes, worker = cluster
    connect(nodes.address)
    space, evaluator = REPLICA()
    es = esbox.make_strategy("copes", space, seed=1, **OPTIONS)
    single = Runner(space, es, evaluator, Budget(max_steps=4))
    single.run()
    with RayPool(REPLICA, 2, actor_options=SPREAD) as pool:
        where = [ray.get(a.describe.remote())["node"] for a in pool.actors]
        assert set(where) == {nodes.head_node.node_id, worker.node_id}
        lost = where.index(worker.node_id)

        def lose_the_worker_node(runner: Runner, metrics: dict) -> None:
            if runner.strategy.step == 2:
                nodes.remove_node(worker)  # its actor dies with it

        es = esbox.make_strategy("copes", pool.space, seed=1, **OPTIONS)
        pooled = pool.runner(es, Budget(max_steps=4), callbacks=[lose_the_worker_node])
        pooled.run()
        assert [(r.actor, r.step) for r in pool.replacements] == [(lost, 2)]
        assert alive_nodes() == 1
        drop = [{k: v for k, v in m.items() if k != "wall_seconds"} for m in pooled.history]
        assert drop == [{k: v for k, v in m.items() if k != "wall_seconds"} for m in single.history]
        assert pool.checksums() == [state_checksum(space)] * 2
