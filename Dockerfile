FROM python:3.11-slim
WORKDIR /app
# torch first and exact: a loose torch pulls a multi-GB CUDA build on CPU images.
RUN pip install --no-cache-dir torch==2.13.0
COPY pyproject.toml README.md ./
COPY rsiweb rsiweb
COPY apps apps
COPY workers workers
COPY templates templates
COPY static static
COPY manage.py ./
RUN pip install --no-cache-dir .
RUN useradd --create-home rsiweb && mkdir -p /srv/rsiweb && chown rsiweb /srv/rsiweb
USER rsiweb
