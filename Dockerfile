# The worker image: `memstream worker` (see docker-compose.yml for a whole deployment).
# The base is overridable (`--build-arg BASE_IMAGE=...`: any image with Python >= 3.11, pip,
# groupadd/useradd and `python` on PATH, e.g. scripts/build_image_podman.sh's local one).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

# A dedicated non-root user with a fixed uid/gid (not `nobody`, which owns nothing). It owns
# the data dir, created here: Docker copies an image directory's owner into an empty named
# volume mounted on it, so the worker can write its state from the first start on.
RUN groupadd --system --gid 10001 memstream \
 && useradd --system --uid 10001 --gid 10001 --create-home --home-dir /home/memstream \
      --shell /usr/sbin/nologin memstream \
 && mkdir -p /var/lib/memstream \
 && chown 10001:10001 /var/lib/memstream \
 && chmod 0750 /var/lib/memstream

WORKDIR /app
COPY pyproject.toml README.md VERSION LICENSE NOTICE ./
COPY memstream ./memstream
COPY topics ./topics
COPY streams ./streams
COPY jobs ./jobs
COPY web ./web
COPY memory ./memory
COPY core ./core
COPY ops ./ops
COPY dev ./dev
# the client distribution (memstream.client, memstream.contract): the server depends on it
COPY clients/python ./clients/python
# No compiler in this image: on x86-64 every dependency is a wheel; on arm64 faust-streaming
# has none, and its source build falls back to pure Python.
RUN pip install --no-cache-dir ./clients/python '.[otlp]'

# docker-compose.yml's entrypoint: a configuration error (exit 78) is not restarted
COPY deploy/docker/stop-on-config-error.sh /usr/local/bin/stop-on-config-error

ENV MEMSTREAM_DATA_DIR=/var/lib/memstream
VOLUME ["/var/lib/memstream"]
USER 10001:10001
EXPOSE 6066
ENTRYPOINT ["memstream"]
CMD ["worker"]
