# syntax=docker/dockerfile:1
# Targets: production (non-root, serves the app behind a sign-in), development (non-root;
# adds the test tools and JupyterLab). docs/SECURITY.md. Every dependency is installed
# before any code is copied, and the code is copied last, in one layer, from the `code`
# stage: a code-only change rebuilds that stage and layer and no pip install (docs/CI.md).
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIPELINE_DOCTOR_RUNS_DIR=/data/runs
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
RUN useradd --create-home --uid 10001 doctor \
    && mkdir -p /data/runs \
    && chown -R doctor:doctor /data

# The compiled modules (diagnostics/trace/event_scan.c: traces load 3-4x faster;
# diagnostics/facts/nesting/op_nesting.c: operators nest 2x faster), built where a compiler is
# installed; the targets get the modules alone, not the compiler.
FROM base AS scanner
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /build
COPY pyproject.toml /build/
COPY diagnostics/trace/event_scan.c /build/diagnostics/trace/
COPY diagnostics/arrow_c_data.h /build/diagnostics/
COPY diagnostics/facts/nesting/op_nesting.c /build/diagnostics/facts/nesting/
# declared in pyproject.toml ([[tool.setuptools.ext-modules]])
RUN python -c "from setuptools import setup; setup()" --quiet build_ext --inplace

# The application's files, in one place for both targets, compiled to bytecode here: the
# image never writes .pyc files (PYTHONDONTWRITEBYTECODE), so without this every CLI run and
# every analysis child would compile its ~110 modules from source first (0.1 s of a
# 1.3 s analysis of a 54 MB trace). checked-hash: a source edited in place (JupyterLab, in the
# development target) is seen, whatever the file times are.
FROM base AS code
COPY app.py /app/
COPY pages /app/pages
COPY app_ui /app/app_ui
COPY .streamlit /app/.streamlit
COPY diagnostics /app/diagnostics
COPY --from=scanner /build/diagnostics/trace/ /app/diagnostics/trace/
COPY --from=scanner /build/diagnostics/facts/nesting/ /app/diagnostics/facts/nesting/
COPY trainer /app/trainer
COPY probe /app/probe
COPY scripts/serve.py /app/scripts/serve.py
RUN python -m compileall -q -j 0 --invalidation-mode checked-hash \
    /app/app.py /app/pages /app/app_ui /app/diagnostics /app/trainer /app/probe /app/scripts

FROM base AS production
# Authlib: Streamlit's st.login (OpenID Connect) needs it when [auth] is configured.
RUN pip install --no-cache-dir Authlib==1.9.10
# owned by root: the server's user reads the code but cannot change it
COPY --from=code /app /app
# Every interface, so a published port reaches it: scripts/serve.py then refuses to start
# unless PIPELINE_DOCTOR_TOKEN or [auth] in /app/.streamlit/secrets.toml is set (or, for a
# read-only demo, PIPELINE_DOCTOR_ALLOW_ANONYMOUS=1).
ENV PIPELINE_DOCTOR_ADDRESS=0.0.0.0
USER 10001:10001
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status == 200 else 1)"]
CMD ["python", "scripts/serve.py", "--port", "8501"]

FROM base AS development
COPY requirements-dev.txt .
RUN pip install --no-cache-dir -r requirements-dev.txt jupyterlab==4.6.6
# the developer's user owns the tree (JupyterLab edits it)
COPY --chown=doctor:doctor --from=code /app /app
COPY --chown=doctor:doctor pyproject.toml ./
COPY --chown=doctor:doctor tests ./tests
COPY --chown=doctor:doctor bench ./bench
USER 10001:10001
# JupyterLab runs code: loopback and a token by default (JUPYTER_TOKEN, else one Jupyter
# generates and prints). To reach it through a published port, set JUPYTER_IP=0.0.0.0
# together with a JUPYTER_TOKEN of your own.
ENV JUPYTER_IP=127.0.0.1
EXPOSE 8501 8888
CMD ["sh", "-c", "exec python -m jupyter lab --ip=\"$JUPYTER_IP\" --port=8888 --no-browser"]
