"""URLs for the test suite: the admin, and the REST API under /api/aaa/."""

from django.contrib import admin
from django.urls import path
from ninja import NinjaAPI

from aaa_django.api import VERSION
from aaa_django.api import router as aaa_router

api = NinjaAPI(title="aaa_django (tests)", version=VERSION, urls_namespace="aaa-tests")
api.add_router("/", aaa_router)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/aaa/", api.urls),
]
