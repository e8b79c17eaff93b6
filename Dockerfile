# FC² platform image: one image for the web process (gunicorn), the Celery worker and the one-shot migrate step.
#
#   docker build -t fc2 .
#   docker run --rm -e SECRET_KEY=... -e DATABASE_URL=... -e REDIS_URL=... -p 8000:8000 fc2
#
# The source tree lives in /app and is installed in editable mode, so `fc2` imports from /app and settings.BASE_DIR
# is /app (templates/, static/, examples/ are found there). Runtime state goes to FC2_VAR_DIR=/var/lib/fc2.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DEBUG=false \
    FC2_VAR_DIR=/var/lib/fc2

RUN groupadd --system --gid 1000 fc2 \
    && useradd --system --uid 1000 --gid fc2 --create-home --home-dir /home/fc2 --shell /usr/sbin/nologin fc2 \
    && mkdir -p /app /var/lib/fc2 \
    && chown fc2:fc2 /var/lib/fc2

WORKDIR /app

# Dependencies first, read from pyproject.toml, so that a code change does not reinstall TensorFlow.
COPY pyproject.toml ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Then the project itself (dependencies are already in place).
COPY . .
RUN pip install --no-deps -e . \
    && cd / && python -c "import importlib.util as u; o = u.find_spec('fc2').origin; assert o == '/app/fc2/__init__.py', o"

USER fc2

# Static files into FC2_VAR_DIR/static (served by whitenoise). The key is a throwaway used only for this step.
RUN SECRET_KEY=collectstatic-build-only DEBUG=false python manage.py collectstatic --noinput

EXPOSE 8000

CMD ["gunicorn", "fc2.wsgi:application", "--bind", "0.0.0.0:8000", "--workers", "3", "--timeout", "120", \
     "--worker-tmp-dir", "/dev/shm", "--access-logfile", "-"]
