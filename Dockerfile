# One container = one replica: HTTP API + workers + reaper. Scale with more replicas.
FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DL_HTTP_HOST=0.0.0.0
WORKDIR /app
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir . && useradd --create-home dataloader
USER dataloader
EXPOSE 8000
# Listening on every address, the service needs DL_API_TOKENS (or DL_ALLOW_UNAUTHENTICATED=true
# behind a proxy that authenticates) and refuses to start otherwise.
# Probes: GET /health (no database). Stop: SIGTERM (running jobs get DL_SHUTDOWN_TIMEOUT_SEC).
CMD ["python", "-m", "dataloader"]
