"""A second ``AdminSite`` beside Django's default one, with the app's admin classes
registered on it the way the README tells a site with its own AdminSite to do."""

from django.contrib import admin
from django.urls import path

from aaa_django.admin import ApiKeyAdmin, EventAdmin, RunAdmin, SnapshotAdmin
from aaa_django.models import ApiKey, EventRecord, RunRecord, SnapshotRecord

site = admin.AdminSite(name="second")
site.register(RunRecord, RunAdmin)
site.register(EventRecord, EventAdmin)
site.register(SnapshotRecord, SnapshotAdmin)
site.register(ApiKey, ApiKeyAdmin)

# The default site first: a link that ignores the site it is served by goes there.
urlpatterns = [
    path("admin/", admin.site.urls),
    path("second-admin/", site.urls),
]
