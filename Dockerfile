# One image for the controller (`gpushare`), the profiler Job (`python -m profiler_job`) and the
# worker (`python -m worker`): the manifests in config/ and templates/ run those commands.
# Build: docker build -t gpushare-elastic:0.1.0 .   (the runtime extra pulls torch with CUDA)
FROM python:3.11-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends git openssh-client ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/gpushare
COPY pyproject.toml README.md ./
COPY controller controller
COPY gitops gitops
COPY profiler_job profiler_job
COPY worker worker
COPY schemas schemas
COPY templates templates
RUN pip install --no-cache-dir '.[runtime]'
ENV HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
USER 10001
