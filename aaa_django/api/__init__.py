"""The REST API (django-ninja): mount :data:`router` in the site's ``NinjaAPI``.

from ninja import NinjaAPI
from aaa_django.api import VERSION, router as aaa_router

api = NinjaAPI(urls_namespace="aaa", version=VERSION)
api.add_router("/", aaa_router)
urlpatterns = [path("api/aaa/", api.urls)]
"""

from . import changes, conversations, exchange  # noqa: F401  (on the same router: the change stream; conversations; export, import, fork)
from .contract import VERSION
from .router import router

__all__ = ["VERSION", "router"]
