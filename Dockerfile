# The image Prefect's Docker and Kubernetes work pools run thrifty's flows in
# (deployments/prefect.docker.yaml, deployments/prefect.kubernetes.yaml; README "Work pools beyond processes").
#
#   docker build -t thrifty:0.1.0 .
#
# It installs the project the way `make` does: pip with constraints.txt, so every version is the one the test
# suite ran with, and the `cloud` extra (SkyPilot) because the flow launches from inside the container.
# torch is pinned exactly as pyproject.toml says (torch==2.13.0). From PyPI that is the default Linux wheel,
# which carries CUDA libraries (several GB): right for a flow that trains on the worker's GPU, more than a
# flow needs when it only launches SkyPilot jobs or trains on CPU. For a CPU-only image (~1 GB smaller) add
# `--build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu` where that index is reachable.
FROM python:3.11-slim

ARG TORCH_INDEX=""
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The deployments' pull step sets this working directory: flow entrypoints (flows/...) and the relative
# store (.thrifty/store) resolve here, as they do in a checkout.
WORKDIR /opt/thrifty

# Dependencies first, in their own layer: a code change rebuilds only the last layers.
COPY pyproject.toml constraints.txt README.md ./
RUN if [ -n "$TORCH_INDEX" ]; then pip install -c constraints.txt --index-url "$TORCH_INDEX" torch==2.13.0; fi
# pyproject's dependencies and its cloud extra, as a requirements file (the code is not copied yet)
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['cloud']))" > /tmp/requirements.txt
RUN pip install -c constraints.txt -r /tmp/requirements.txt

COPY thrifty ./thrifty
COPY training ./training
COPY tasks ./tasks
COPY flows ./flows
COPY deployments ./deployments
COPY examples ./examples
COPY prefect.yaml ./
RUN pip install --no-deps -c constraints.txt '.[cloud]' && python -c "import thrifty, training, flows, tasks"

# No secrets in the image: cloud credentials, PREFECT_API_URL and the store come from the work pool's
# job variables (env) or the cluster's secrets at run time.
CMD ["thrifty", "--help"]
