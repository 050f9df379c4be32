# syntax=docker/dockerfile:1
# gpu_pipeline's image: the code server of the `gpu_pipeline` code location, and (the same image,
# started by the K8sRunLauncher) every run pod. Build and push (docs/deploy.md, "Cluster install"):
#   docker build -t registry.example.com/gpu-pipeline:0.17.1 .
#   docker push registry.example.com/gpu-pipeline:0.17.1

# --- builder: the native tokenizer and a venv with the package and its `cluster` extra ---------
FROM python:3.11-slim-bookworm AS builder

# the compiler for gpu_pipeline/native/exposition.c (the Makefile's $(NATIVE) rule)
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_pipeline ./gpu_pipeline

# The Makefile's $(NATIVE) rule with its NATIVE_CFLAGS; unlike `make`, a failed compile fails the
# build (an image without the tokenizer would parse on the slower Polars path without saying so).
ARG NATIVE_CFLAGS="-O2 -Wall -Wextra -shared -fPIC -pthread"
RUN cc ${NATIVE_CFLAGS} -o gpu_pipeline/native/libgpu_pipeline_native.so gpu_pipeline/native/exposition.c

# `cluster`: dagster-postgres, dagster-k8s, psycopg2-binary (the instance's Postgres storage and
# the K8sRunLauncher / k8s_job_executor); a non-editable install into /opt/venv
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/venv/bin/pip install --no-cache-dir '.[cluster]'

# --- runtime: the venv and the .so, no compiler -------------------------------------------------
FROM python:3.11-slim-bookworm

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    DAGSTER_HOME=/opt/dagster/dagster_home

# uid 10001, no login shell; DAGSTER_HOME (the Helm chart mounts the instance's dagster.yaml there)
# and the working folder (relative defaults such as data/raw land in it) belong to it
RUN groupadd --gid 10001 gpu \
    && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin gpu \
    && mkdir -p /opt/dagster/dagster_home /var/lib/gpu-pipeline \
    && chown -R 10001:10001 /opt/dagster /var/lib/gpu-pipeline

COPY --from=builder /opt/venv /opt/venv
# the tokenizer is not package data (pip does not copy it): it goes beside gpu_pipeline/native/__init__.py
COPY --from=builder /src/gpu_pipeline/native/libgpu_pipeline_native.so \
    /opt/venv/lib/python3.11/site-packages/gpu_pipeline/native/libgpu_pipeline_native.so
# the image is only good if the tokenizer loads (gpu_pipeline.native.available())
RUN python -c "import gpu_pipeline.native as n; assert n.available(), 'native tokenizer not loadable'"

USER 10001:10001
WORKDIR /var/lib/gpu-pipeline

# the code server's gRPC port (dagster-user-deployments' `port` in deploy/helm/values.yaml)
EXPOSE 3030

# No ENTRYPOINT: the chart's user deployment sets the container's args to
# `dagster code-server start -h 0.0.0.0 -p <port> <codeServerArgs>`, and run pods get
# `dagster api execute_run …`; both replace this CMD.
CMD ["dagster", "code-server", "start", "-h", "0.0.0.0", "-p", "3030", "-m", "gpu_pipeline.definitions"]
