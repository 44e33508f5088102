# syntax=docker/dockerfile:1
# Targets: base (runtime dependencies), production (non-root, serves the app),
# development (adds the test tools and JupyterLab).
FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIPELINE_DOCTOR_RUNS_DIR=/data/runs
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY app.py ./
COPY pages ./pages
COPY app_ui ./app_ui
COPY .streamlit ./.streamlit
COPY diagnostics ./diagnostics
COPY trainer ./trainer

FROM base AS production
RUN useradd --create-home --uid 10001 doctor \
    && mkdir -p /data/runs \
    && chown -R doctor:doctor /data
USER 10001:10001
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4).status == 200 else 1)"]
CMD ["python", "-m", "streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", "--server.headless=true", "--browser.gatherUsageStats=false"]

FROM base AS development
COPY requirements-dev.txt .
RUN pip install --no-cache-dir -r requirements-dev.txt jupyterlab==4.6.6
COPY tests ./tests
COPY bench ./bench
COPY pyproject.toml ./
EXPOSE 8501 8888
CMD ["python", "-m", "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root"]
