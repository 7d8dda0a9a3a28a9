FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY memstream ./memstream
COPY topics ./topics
COPY streams ./streams
COPY jobs ./jobs
COPY web ./web
COPY memory ./memory
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["memstream"]
CMD ["worker"]
