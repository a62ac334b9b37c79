"""Work pools beyond processes: the Docker and Kubernetes prefect.yaml variants checked against the code and
Prefect's own parser, the Dockerfile against the project, and `thrifty deploy --pool-type docker|kubernetes`
against a real Prefect server (pools created with Prefect's worker types, deployments on them).

Not run here: `docker build` and a Docker or Kubernetes worker (no Docker daemon, no cluster on this machine).
"""

from __future__ import annotations

import fnmatch
import re
import tomllib

import pytest
import yaml
from prefect import Flow
from prefect.cli.deploy._models import PrefectYamlModel

from conftest import REPO
from deployments.deploy import IMAGE, POOL_KINDS, base_job_template
from prefect_server import BIN, Server
from test_deployments_e2e import load_entrypoint
from thrifty.config import build_config

PROCESS = yaml.safe_load((REPO / "prefect.yaml").read_text())
VARIANTS = ("docker", "kubernetes")
WORKDIR = "/opt/thrifty"  # the Dockerfile's WORKDIR


def variant(kind: str) -> dict:
    return yaml.safe_load((REPO / POOL_KINDS[kind].prefect_file).read_text())


@pytest.mark.parametrize("kind", VARIANTS)
def test_variant_is_prefect_yaml_on_another_pool(kind):
    """Same deployments as prefect.yaml (entrypoints, parameters, schedules, limits); only the pool and its image
    differ; Prefect's own prefect.yaml model keeps every key (it ignores unknown ones silently)."""
    spec, pk = variant(kind), POOL_KINDS[kind]
    assert pk.type == kind and pk.pool == f"thrifty-{kind}"
    model = PrefectYamlModel.model_validate(spec)
    assert model.pull == [{"prefect.deployments.steps.set_working_directory": {"directory": WORKDIR}}]
    assert len(model.deployments) == len(spec["deployments"]) == len(PROCESS["deployments"])
    for raw, parsed, process in zip(spec["deployments"], model.deployments, PROCESS["deployments"]):
        kept = parsed.model_dump(exclude_unset=True, mode="json")
        assert set(kept) == set(raw), f"{raw['name']}: Prefect drops {set(raw) - set(kept)}"
        assert {k: v for k, v in raw.items() if k != "work_pool"} == \
               {k: v for k, v in process.items() if k != "work_pool"}, f"{raw['name']} drifted from prefect.yaml"
        flow = load_entrypoint(raw["entrypoint"])
        assert isinstance(flow, Flow)
        if "config" in (raw.get("parameters") or {}):
            build_config(raw["parameters"]["config"], source=f"{pk.prefect_file} {raw['name']}")
        pool = raw["work_pool"]
        assert pool["name"] == pk.pool
        job_vars = pool["job_variables"]
        assert job_vars["image"] == IMAGE
        # every job variable is one the worker type's base job template declares (a typo would be ignored)
        declared = base_job_template(kind)["variables"]["properties"]
        assert set(job_vars) <= set(declared), f"{kind}: unknown job variables {set(job_vars) - set(declared)}"
    if kind == "docker":  # the local store outlives each container
        assert any(v.endswith(f":{WORKDIR}/.thrifty") for v in spec["definitions"]["work_pool"]["job_variables"]["volumes"])


def test_dockerfile_builds_the_project_as_make_installs_it():
    """The image tag is the project's version; the Dockerfile installs with constraints.txt and the cloud extra,
    pins torch as pyproject does, copies every package setuptools installs, and .dockerignore lets them in."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert IMAGE == f"thrifty:{project['project']['version']}"
    text = (REPO / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim$", text, re.M)
    assert f"WORKDIR {WORKDIR}" in text
    assert "-c constraints.txt" in text and "'.[cloud]'" in text and "optional-dependencies']['cloud']" in text
    [torch_pin] = [d for d in project["project"]["dependencies"] if d.startswith("torch")]
    assert torch_pin in text
    copied = [src for line in re.findall(r"^COPY (.+)$", text, re.M) for src in line.split()[:-1]]
    packages = {p.rstrip("*") for p in project["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages <= set(copied)
    ignore = [line for line in (REPO / ".dockerignore").read_text().splitlines() if line and not line.startswith("#")]

    def sent(path: str) -> bool:  # .dockerignore semantics for these simple patterns: the last match wins
        keep = True
        for pat in ignore:
            negate, pat = pat.startswith("!"), pat.lstrip("!").rstrip("/")
            if fnmatch.fnmatch(path, pat) or path.startswith(pat + "/"):
                keep = negate
        return keep

    for src in copied:
        assert (REPO / src).exists(), f"Dockerfile copies {src}, which does not exist"
        assert sent(src), f".dockerignore keeps {src} out of the build context"
    assert not sent(".venv") and not sent(".thrifty") and not sent(".git")
    assert f"docker build -t {IMAGE} ." in (REPO / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_deploy_pool_type_creates_docker_and_kubernetes_pools(tmp_path):
    """`thrifty deploy --pool-type docker|kubernetes` on a real server: the pool is created with Prefect's worker
    type and that type's template, every deployment lands on it with the image and the image's working directory;
    a pool of the wrong type already there is refused with exit 2."""
    server = Server(tmp_path)
    try:
        server.wait_healthy(server.spawn("server", "server", "start", "--host", "127.0.0.1",
                                         "--port", server.env["PREFECT_SERVER_API_PORT"]))
        for kind in VARIANTS:  # the same deployment names: the second deploy moves them to its pool
            pk = POOL_KINDS[kind]
            out = server.run(str(BIN / "thrifty"), "deploy", "--pool-type", kind)
            assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
            assert f"work pool '{pk.pool}' ({kind}) created" in out.stderr
            assert f"pip install {pk.worker_package}" in out.stderr and f"docker build -t {IMAGE} ." in out.stderr
            with server.client() as client:
                pool = client.read_work_pool(pk.pool)
                assert pool.type == kind
                assert pool.base_job_template == base_job_template(kind)
                deps = client.read_deployments()
                assert sorted(d.name for d in deps) == sorted(d["name"] for d in PROCESS["deployments"])
                for d in deps:
                    assert d.work_pool_name == pk.pool
                    assert d.job_variables["image"] == IMAGE
                    assert d.pull_steps == [{"prefect.deployments.steps.set_working_directory":
                                             {"directory": WORKDIR}}]
        from prefect.client.schemas.actions import WorkPoolCreate

        with server.client() as client:  # the process pool's name taken by a docker pool
            client.create_work_pool(WorkPoolCreate(name="thrifty-process", type="docker",
                                                   base_job_template=base_job_template("docker")))
        out = server.run(str(BIN / "thrifty"), "deploy")
        assert out.returncode == 2, out.stderr
        assert "exists with type 'docker', not 'process'" in out.stderr
    finally:
        server.stop_all()
