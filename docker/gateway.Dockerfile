# The RL Gateway (and the one-shot `register` job): a slim CPU image, no torch, no vLLM.
# Build from the repository root:  docker build -f docker/gateway.Dockerfile -t rlgw-gateway .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RLGW_HOME=/var/lib/rlgw \
    RLGW_HOST=0.0.0.0 \
    RLGW_PORT=8000

# The project without the `trainer` extra: the gateway needs neither torch nor transformers.
COPY . /tmp/rlgw-src
RUN pip install /tmp/rlgw-src \
    && rm -rf /tmp/rlgw-src \
    && useradd --system --uid 10001 --home-dir /var/lib/rlgw --create-home rlgw

USER rlgw
WORKDIR /var/lib/rlgw
EXPOSE 8000

HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=6 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

# Migrations first (idempotent), then the gateway. RLGW_DATABASE_URL and RLGW_ADMIN_KEY come from
# the environment; the gateway refuses to bind 0.0.0.0 with an empty or default admin key.
CMD ["sh", "-c", "rlgw db upgrade && exec rlgw serve --host 0.0.0.0 --port 8000"]
