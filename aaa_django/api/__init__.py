"""The REST API (django-ninja): mount :data:`router` in the site's ``NinjaAPI``.

    from ninja import NinjaAPI
    from aaa_django.api import router as aaa_router

    api = NinjaAPI(urls_namespace="aaa")
    api.add_router("/", aaa_router)
    urlpatterns = [path("api/aaa/", api.urls)]
"""

from . import exchange  # noqa: F401  (export, import and fork, on the same router)
from .router import router

__all__ = ["router"]
