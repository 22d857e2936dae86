# The numparity server (API, dashboard, migrations, CLI) — never the agent's torch.
#
#   docker build -t numparity-server .
#   docker run -p 8000:8000 numparity-server       # SQLite in /srv/numparity, one process
#
# A lab runs it on PostgreSQL with several replicas: docker-compose.yml.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# A fixed uid/gid, so volumes and Kubernetes' runAsNonRoot see the same numeric user.
RUN groupadd --system --gid 10001 numparity \
    && useradd --system --uid 10001 --gid numparity --home-dir /srv/numparity \
       --create-home --shell /usr/sbin/nologin numparity

WORKDIR /build

# Dependencies first, from pyproject.toml alone: editing the code does not reinstall them.
# The `server` extra only: no torch (the server never imports it).
COPY pyproject.toml setup.py README.md LICENSE ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; \
print('\n'.join(p['dependencies'] + p['optional-dependencies']['server']))" > requirements.txt \
    && pip install -r requirements.txt

# Then the code (setup.py maps agent/, server/ and migrations/ into the packages) and the
# manual's sources (the build puts the manual in the package: served at /manual/).
COPY agent ./agent
COPY server ./server
COPY migrations ./migrations
COPY mkdocs.yml ./
COPY docs ./docs
RUN pip install ".[server]" \
    && cd / && rm -rf /build \
    && numparity-server --help > /dev/null

USER 10001:10001
WORKDIR /srv/numparity

EXPOSE 8000

# Ready: the database answers and is at this server's schema (503 otherwise, and the
# python one-liner exits non-zero). slim has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4).status != 200)"]

CMD ["numparity-server", "serve", "--host", "0.0.0.0", "--port", "8000"]
