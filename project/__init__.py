"""The example site. Loads the Celery app when Celery is installed, so `celery -A project`
and shared tasks work; the embedded default runs without Celery."""

try:
    from .celery import app as celery_app
except ModuleNotFoundError as exc:  # only a missing Celery is tolerated
    if (exc.name or "").split(".")[0] not in ("celery", "kombu"):
        raise
    celery_app = None

__all__ = ("celery_app",)
