"""The REST API (django-ninja): mount :data:`router` in the site's ``NinjaAPI``.

    from ninja import NinjaAPI
    from aaa_django.api import router as aaa_router

    api = NinjaAPI(urls_namespace="aaa")
    api.add_router("/", aaa_router)
    urlpatterns = [path("api/aaa/", api.urls)]
"""

from . import conversations, exchange  # noqa: F401  (on the same router: conversations; export, import, fork)
from .router import router

__all__ = ["router"]
