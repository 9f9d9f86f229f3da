"""The Django app configuration."""

from django.apps import AppConfig
from django.core import checks

from .checks import check_aaa_settings, check_api_cache, check_api_settings, check_otel_settings
from .site.llm_settings import check_llm_settings
from .site.mcp_settings import check_mcp_settings


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

        try:
            from .celery.duty import install
        except ImportError:  # no Celery: no workers to hook
            return
        install()
