# vLLM (GPU) with this project installed, so that vLLM can load our worker extension
# (--worker-extension-cls rlgw_vllm.extension.WeightUpdateExtension). The same image runs the
# trainer (`rlgw train`), which needs the image's torch and transformers and a GPU.
# Build from the repository root:  docker build -f docker/vllm.Dockerfile -t rlgw-vllm .
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

# The image already has torch, transformers, fastapi, httpx, pydantic, numpy and openai. Install
# this project without its dependencies, then only the light ones the image may lack, constrained
# to the versions already installed so that nothing vLLM depends on is upgraded or replaced.
# (pgserver, the embedded Postgres, is left out: in compose RLGW_DATABASE_URL is always set.)
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1
COPY . /tmp/rlgw-src
RUN python3 -m pip list --format=freeze > /tmp/image-pins.txt \
    && python3 -m pip install --no-deps /tmp/rlgw-src \
    && python3 -m pip install -c /tmp/image-pins.txt \
        "sqlalchemy[asyncio]>=2.0.30" "alembic>=1.13" "psycopg[binary]>=3.2" \
        "pydantic-settings>=2.3" "authlib>=1.3" "uvicorn[standard]>=0.30" \
    && rm -rf /tmp/rlgw-src /tmp/image-pins.txt \
    && python3 -c "import trainer, rlgw_cli, rlgw_vllm.extension, migrations.runner"

# Control endpoints (/pause, /resume, /collective_rpc, /update_weight_version) need dev mode.
ENV VLLM_SERVER_DEV_MODE=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1

# `vllm serve MODEL_DIR --served-model-name ... --worker-extension-cls ...` (see docker-compose.yml).
# The trainer service overrides the entrypoint with `rlgw`.
ENTRYPOINT ["vllm", "serve"]
