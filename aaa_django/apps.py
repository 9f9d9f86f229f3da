"""The Django app configuration."""

from django.apps import AppConfig
from django.core import checks

from .checks import check_aaa_settings, check_api_cache, check_api_settings, check_otel_settings
from .site.llm_settings import check_llm_settings
from .site.mcp_settings import check_mcp_settings

#: what the celery extra installs (``pip install 'aaa_django[celery]'``)
CELERY_EXTRA = frozenset({"celery", "kombu", "redis"})


class AaaConfig(AppConfig):
    name = "aaa_django"
    label = "aaa"
    verbose_name = "Agent runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        checks.register(check_aaa_settings)
        checks.register(check_api_settings)
        checks.register(check_api_cache)
        checks.register(check_llm_settings)
        checks.register(check_mcp_settings)
        checks.register(check_otel_settings)

        from .site.engines import load_agents  # imports the models: only once apps are ready

        load_agents()

        # A web process's first request starts its engine host, which adopts the runs
        # whose holder is gone (aaa_django.site.host; the in-process bus only).
        from django.core.signals import request_started

        from .site.host import on_request

        request_started.connect(on_request, dispatch_uid="aaa_django.site.host")

        # The Celery bus registers itself with the site's wiring where Celery is
        # installed; without it, the in-process bus only (aaa.E101 if BUS says celery).
        try:
            from .celery.wiring import register
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in CELERY_EXTRA:
                raise  # a module of ours, or a bug: not a missing extra
        else:
            register()
