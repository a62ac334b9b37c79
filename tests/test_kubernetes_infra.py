"""SkyPilot's Kubernetes infra as a launch candidate: priced at compute.kubernetes_usd_per_gpu_hour (0 = your own
cluster), ranked by run cost among the spot candidates (no spot market, never an on-demand fallback), in the task
SkyPilot parses with use_spot false, metered at its own price on the node, and preflighted with a kubeconfig
check instead of cloud credentials. All offline: no cluster is reached."""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import REPO
from thrifty.config import ConfigError, build_config
from thrifty.launchers import skypilot as sp
from thrifty.launchers.skypilot.candidates import candidates
from thrifty.launchers.skypilot.plan import plan_ranking, plan_text
from thrifty.launchers.identity import identify
from thrifty.money.meter import NodeMeter, Price, prices_env
from thrifty.protocol import ENV_PRICES
from thrifty.storage import open_store

sky = pytest.importorskip("sky", reason="SkyPilot is part of the [cloud] extra that `make install` installs")


def k8s_cfg(tmp_path=None, **compute):
    data = {"run_name": "k8s-run", "recipe": "digits", "store": "s3://thrifty-test-bucket/runs",
            "compute": {"launcher": "skypilot", "clouds": ["kubernetes", "aws"], "accelerators": ["H100:1", "A10G:1"],
                        "workdir": str(REPO), **compute}}
    return build_config(data)


def test_a_free_cluster_ranks_first_fastest_gpu_first_and_spot_does_not_apply():
    cfg = k8s_cfg()
    ranking = plan_ranking(cfg, source="offline")
    order = [(x.candidate.infra, x.candidate.accelerator, x.candidate.market) for x in ranking.ranked]
    # $0 pods first (the faster GPU before the slower at equal cost), then aws spot, then the on-demand fallback
    assert order == [("kubernetes", "H100:1", "cluster"), ("kubernetes", "A10G:1", "cluster"),
                     ("aws", "A10G:1", "spot"), ("aws", "A10G:1", "on-demand")]
    assert [x.candidate.usd_per_hour for x in ranking.ranked[:2]] == [0.0, 0.0]
    assert ranking.winner.label() == "H100:1 cluster on kubernetes"
    text = plan_text(cfg, source="offline")
    assert "kubernetes: spot does not apply" in text and "(0: a cluster you already pay for)" in text
    assert "#   kubernetes         H100:1     cluster" in text


def test_a_user_rate_is_ranked_by_run_cost_against_the_clouds():
    """At $2.50 per GPU-hour an H100 pod still beats an A10G spot VM per unit of work (~8.9x faster by the table);
    an A10G pod does not, and goes after it."""
    cfg = k8s_cfg(kubernetes_usd_per_gpu_hour=2.5, accelerators=["H100:2", "A10G:1"], num_nodes=2)
    ranking = plan_ranking(cfg, source="offline")
    by = {(x.candidate.infra, x.candidate.accelerator, x.candidate.market): x for x in ranking.ranked}
    pod = by[("kubernetes", "H100:2", "cluster")]
    assert pod.candidate.quote.usd_per_hour == pytest.approx(5.0)  # 2 GPUs x $2.50, per node
    assert pod.candidate.usd_per_hour == pytest.approx(10.0)  # the job: 2 nodes
    order = list(by)
    assert order.index(("kubernetes", "H100:2", "cluster")) < order.index(("aws", "A10G:1", "spot")) \
        < order.index(("kubernetes", "A10G:1", "cluster"))
    costs = [x.per_work_usd for x in ranking.ranked if x.candidate.market != "on-demand"]
    assert costs == sorted(costs)
    assert "compute.kubernetes_usd_per_gpu_hour $2.5/GPU-hour x 2 (your rate)" in plan_text(cfg, source="offline")


def test_spot_only_still_offers_the_cluster_and_the_task_says_use_spot_false():
    cfg = k8s_cfg(on_demand_fallback=False, accelerators=["A10G:1"])
    cands, _ = candidates(cfg, "offline")
    assert [(k.cloud, k.spot) for k in cands] == [("kubernetes", False), ("aws", True)]
    task = sp.build_task(sp.task_config(cfg, source="offline"))  # SkyPilot's own parser
    resources = [(str(r.cloud), r.use_spot) for r in task.resources]
    assert resources == [("Kubernetes", False), ("AWS", True)]
    only = k8s_cfg(clouds=["kubernetes"], accelerators=["A10G:1"])  # use_spot true by default: not applicable
    config = sp.task_config(only, source="offline")
    assert config["resources"]["use_spot"] is False
    assert [str(r.cloud) for r in sp.build_task(config).resources] == ["Kubernetes"]


def test_the_node_on_a_pod_meters_at_the_cluster_price_not_the_dearest_cloud(tmp_path, monkeypatch):
    cfg = k8s_cfg(kubernetes_usd_per_gpu_hour=0.4, accelerators=["A10G:1"]).updated(
        {"store": str(tmp_path / "store")}, "a local store for the meter's records")
    config = sp.task_config(k8s_cfg(kubernetes_usd_per_gpu_hour=0.4, accelerators=["A10G:1"]), source="offline")
    prices = json.loads(config["envs"][ENV_PRICES])
    assert {p["cloud"] for p in prices} == {"kubernetes", "aws"}
    env = {ENV_PRICES: config["envs"][ENV_PRICES], "SKYPILOT_MANAGED_JOB_ID": "7", "SKYPILOT_NUM_NODES": "1",
           "SKYPILOT_CLUSTER_INFO": json.dumps({"cluster_name": "c", "cloud": "Kubernetes", "region": None})}
    meter = NodeMeter.from_env(open_store(cfg.store), cfg, env, identify=identify)
    assert (meter.price.cloud, meter.price.spot, meter.price.usd_per_hour) == ("kubernetes", False, pytest.approx(0.4))
    assert meter.rate == pytest.approx(0.4)
    # the same prices on an aws node that cannot tell its instance: the dearest aws candidate, never the pod's
    aws_env = {**env, "SKYPILOT_CLUSTER_INFO": json.dumps({"cloud": "AWS"})}
    free = prices_env([Price("kubernetes", "pod-A10G-1", False, 0.0, "A10G:1"),
                       Price("aws", "g5.xlarge", True, 0.302, "A10G:1")])
    assert NodeMeter.from_env(open_store(cfg.store), cfg, {**env, ENV_PRICES: free}, identify=identify).rate == 0.0
    import thrifty.launchers.identity as identity

    monkeypatch.setitem(identity._PROBES, "aws", lambda base: identity.NodeIdentity("aws"))  # no metadata server here
    assert NodeMeter.from_env(open_store(cfg.store), cfg, {**aws_env, ENV_PRICES: free},
                              identify=identity.identify).price.cloud == "aws"


def test_the_watcher_prices_a_kubernetes_attempt_at_the_users_rate():
    launcher = sp.SkyPilotLauncher(k8s_cfg(kubernetes_usd_per_gpu_hour=1.5))
    assert launcher._price("kubernetes", "4CPU--16GB--H100:1", "H100:1", False) == pytest.approx(1.5)
    assert launcher._price("kubernetes", None, "A10G:2", False) == pytest.approx(3.0)


def test_preflight_asks_for_a_kubeconfig_not_cloud_credentials(tmp_path):
    cfg = k8s_cfg(clouds=["kubernetes"])
    env = {"HOME": str(tmp_path)}
    with pytest.raises(ConfigError) as err:
        sp.preflight(cfg, env)
    msg = str(err.value)
    assert "no kubeconfig on this machine" in msg and "KUBECONFIG" in msg and "sky check kubernetes" in msg
    assert "no aws credentials" not in msg and "`aws configure`" not in msg  # no cloud account is asked for
    kubeconfig = tmp_path / "kind.yaml"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    client_missing = importlib.util.find_spec("kubernetes") is None
    env["KUBECONFIG"] = f"{tmp_path / 'missing'}:{kubeconfig}"
    if client_missing:
        with pytest.raises(ConfigError) as err:
            sp.preflight(cfg, env)
        assert "kubeconfig" not in str(err.value) and "pip install 'skypilot[kubernetes]==0.14.1'" in str(err.value)
    else:
        sp.preflight(cfg, env)
    assert sp.kubeconfig(env) == str(kubeconfig)
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\n")
    assert sp.kubeconfig({"HOME": str(tmp_path)}) == str(tmp_path / ".kube" / "config")


def test_kubernetes_is_a_cloud_the_config_accepts_with_a_non_negative_rate():
    with pytest.raises(ConfigError, match="kubernetes_usd_per_gpu_hour"):
        k8s_cfg(kubernetes_usd_per_gpu_hour=-1.0)
    with pytest.raises(ConfigError, match="clouds"):
        k8s_cfg(clouds=["k8s"])
