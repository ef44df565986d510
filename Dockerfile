# stopserve sidecar: the default model baked in, non-root, configured by STOPSERVE_ variables.
#   docker build -t stopserve . && docker run -p 8080:8080 stopserve
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STOPSERVE_CACHE_DIR=/var/cache/stopserve

WORKDIR /app
COPY pyproject.toml README.md ./
COPY stopserve ./stopserve
COPY models/default ./models/default
# LightGBM needs the GNU OpenMP runtime, which slim images lack
RUN apt-get update \
    && apt-get install -y --no-install-recommends libgomp1 \
    && rm -rf /var/lib/apt/lists/*
# the runtime plus the `redis` (STOPSERVE_STORE=redis://... shares runs between replicas) and `fast`
# extras (the wheel carries models/default as stopserve/_default_model). The
# default model's boosters are compiled to shared libraries here, with a C compiler that is removed in
# the same step: the image serves them from the read-only cache in $STOPSERVE_CACHE_DIR. Another model
# mounted at run time finds no compiler and is served by LightGBM's predict (GET /v1/model says which).
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && python -m pip install ".[redis,fast]" \
    && python -c "from stopserve.policy import Policy; from stopserve.settings import default_model_dir; \
print(Policy.load(default_model_dir(), engine='tl2cgen').inference)" \
    && apt-get purge -y --auto-remove gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/* \
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
