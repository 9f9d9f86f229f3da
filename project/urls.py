"""URLs of the example site: the admin, the REST API under /api/aaa/ (OpenAPI docs at
/api/aaa/docs, the schema at /api/aaa/openapi.json), and the chat page at /chat/."""

from django.contrib import admin
from django.urls import include, path
from ninja import NinjaAPI

from aaa_django.api import VERSION
from aaa_django.api import router as aaa_router

api = NinjaAPI(
    title="aaa_django example site",
    version=VERSION,
    description="Start, watch, answer and cancel agent runs (see docs/api.md).",
    urls_namespace="aaa",
)
api.add_router("/", aaa_router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/aaa/", api.urls),
    path("chat/", include("project.chat.urls")),
]
