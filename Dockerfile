# The like app (examples/like_app) as it is deployed: uvicorn with several
# worker processes, all counting into one Datastore. Build from the repository:
#   docker build -t like-app .
#   docker run -p 8080:8080 -e GDS_URL=datastore://PROJECT like-app
# Optional: GDS_CACHE_URL=redis://HOST:6379/0 (Memorystore) for the count
# cache every worker shares. App Engine flexible deploys it with app.yaml.
FROM python:3.11-slim
WORKDIR /app
COPY setup.cfg pyproject.toml README.md LICENSE ./
COPY gds_counter ./gds_counter
COPY examples/like_app ./examples/like_app
RUN pip install --no-cache-dir ".[web,redis]"
ENV PORT=8080
EXPOSE 8080
# WORKERS: one per core the instance has (4 on the test's machine).
ENV WORKERS=4
CMD ["sh", "-c", "exec uvicorn app:create_app --factory --app-dir examples/like_app --host 0.0.0.0 --port ${PORT} --workers ${WORKERS}"]
