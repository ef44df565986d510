# stopserve sidecar: the default model baked in, non-root, configured by STOPSERVE_ variables.
#   docker build -t stopserve . && docker run -p 8080:8080 stopserve
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY stopserve ./stopserve
COPY models/default ./models/default
# LightGBM needs the GNU OpenMP runtime, which slim images lack
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
# the runtime and the Redis client (STOPSERVE_STORE=redis://... shares runs between replicas);
# the wheel carries models/default as stopserve/_default_model
RUN python -m pip install ".[redis]" \
    && useradd --system --uid 10001 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin stopserve \
    && mkdir -p /var/lib/stopserve \
    && chown stopserve /var/lib/stopserve

USER stopserve
ENV STOPSERVE_HOST=0.0.0.0 \
    STOPSERVE_PORT=8080 \
    STOPSERVE_LOG_DIR=/var/lib/stopserve
VOLUME ["/var/lib/stopserve"]
EXPOSE 8080
# slim has no curl: probe with the Python standard library
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD python -c "import os,sys,urllib.request; p=os.environ.get('STOPSERVE_PORT','8080'); sys.exit(0 if urllib.request.urlopen(f'http://127.0.0.1:{p}/healthz', timeout=4).status == 200 else 1)"
CMD ["stopserve", "serve"]
