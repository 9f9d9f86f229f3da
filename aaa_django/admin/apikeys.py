"""API keys in the admin: create one (its secret is shown once), list them, revoke them.

The secret exists only in the answer to the creation form: ``ApiKey.create_key``
stores its SHA-256 and the admin renders the secret into that one response (no
redirect, no message, no session: nothing keeps it). The hash is never rendered.

Django's model permissions decide who sees and acts: ``aaa.view_apikey`` lists and
opens keys, ``aaa.add_apikey`` creates them, ``aaa.change_apikey`` revokes (and
renames) them; without any of them the pages answer 403. Keys are not deleted here: a
revoked key stays, the record of who had access and when the key was last used.

A key for *another* user lets its creator act as that user through the API, so
creating one also needs the permission to change users (``auth.change_user``), which
lets one set that user's password anyway. Without it, staff create keys for themselves.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.auth import get_permission_codename, get_user_model
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils.html import format_html

from aaa_django.models import ApiKey

if TYPE_CHECKING:
    from django.contrib.auth.base_user import AbstractBaseUser


def may_key_others(user: AbstractBaseUser) -> bool:
    """Whether ``user`` may create keys acting as other users (see the module's doc)."""
    opts = get_user_model()._meta
    return bool(user.has_perm(f"{opts.app_label}.{get_permission_codename('change', opts)}"))


class ApiKeyCreateForm(forms.Form):
    user = forms.ModelChoiceField(
        queryset=get_user_model()._default_manager.none(),
        help_text="The key acts as this user: it sees and does what the user may.",
    )
    name = forms.CharField(
        max_length=ApiKey._meta.get_field("name").max_length,
        required=False,
        help_text="What the key is for (\u201cCI\u201d, \u201cnightly report\u201d).",
    )
    expires_days = forms.IntegerField(
        label="Expires after (days)",
        min_value=1,
        max_value=36500,
        required=False,
        help_text="Empty: the key never expires (revoke it when it is no longer needed).",
    )

    def __init__(self, *args: Any, creator: AbstractBaseUser, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        users = get_user_model()._default_manager.filter(is_active=True)
        if not may_key_others(creator):
            users = users.filter(pk=creator.pk)
        field = self.fields["user"]
        field.queryset = users.order_by(get_user_model().USERNAME_FIELD)
        field.label_from_instance = lambda u: u.get_username()
        field.initial = creator.pk

    def create(self) -> tuple[ApiKey, str]:
        days = self.cleaned_data["expires_days"]
        return ApiKey.create_key(
            self.cleaned_data["user"], name=self.cleaned_data["name"], expires_in=timedelta(days=days) if days else None
        )


class StateFilter(admin.SimpleListFilter):
    """By :attr:`ApiKey.state <aaa_django.models.ApiKey.state>`."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: admin.ModelAdmin) -> list[tuple[str, str]]:
        return [("active", "active"), ("expired", "expired"), ("revoked", "revoked")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        if self.value() == "active":
            return queryset.active()
        if self.value() == "expired":
            return queryset.expired()
        if self.value() == "revoked":
            return queryset.revoked()
        return queryset


class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix_col", "user", "name", "state_col", "created_at", "last_used_at", "expires_at", "revoked_at")
    list_filter = (StateFilter,)
    search_fields = ("^prefix", "name", f"user__{get_user_model().USERNAME_FIELD}")
    list_select_related = ("user",)
    ordering = ("-created_at",)
    # ``hashed`` is in none of these, so no page renders it; only ``name`` is editable.
    fields = ("prefix_col", "user", "name", "state_col", "created_at", "last_used_at", "expires_at", "revoked_at")
    readonly_fields = ("prefix_col", "user", "state_col", "created_at", "last_used_at", "expires_at", "revoked_at")
    actions = ["revoke_keys"]
    change_form_template = "aaa/admin/apikey_change_form.html"

    @admin.display(description="key", ordering="prefix")
    def prefix_col(self, key: ApiKey) -> str:
        return format_html("<code>{}…</code>", key.prefix)

    @admin.display(description="state")
    def state_col(self, key: ApiKey) -> str:
        state = key.state
        css = {"active": "success", "expired": "cancelled", "revoked": "failed"}[state]
        return format_html('<span class="aaa-badge aaa-{}">{}</span>', css, state)

    def has_delete_permission(self, request: HttpRequest, obj: ApiKey | None = None) -> bool:
        return False  # revoke instead: the key stays as the record of who had access

    # -- revoking ----------------------------------------------------------------------

    @admin.action(description="Revoke the selected API keys", permissions=["change"])
    def revoke_keys(self, request: HttpRequest, queryset: QuerySet) -> None:
        keys = list(queryset.filter(revoked_at__isnull=True))
        for key in keys:
            self._revoke(request, key)
        messages.success(request, f"Revoked {len(keys)} key{'s' if len(keys) != 1 else ''}.")

    def _revoke(self, request: HttpRequest, key: ApiKey) -> None:
        key.revoke()
        self.log_change(request, key, [{"changed": {"fields": ["revoked_at"]}}])

    def get_urls(self) -> list[URLPattern]:
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        mine = [path("<path:object_id>/revoke/", self.admin_site.admin_view(self.revoke_view), name=f"{name}_revoke")]
        return mine + super().get_urls()

    def revoke_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        """GET: a confirmation page; POST: revoke the key (``aaa.change_apikey``)."""
        key = self.get_object(request, unquote(object_id))
        if key is None:
            raise Http404("no such API key")
        if not self.has_change_permission(request, key):
            raise PermissionDenied
        change_url = reverse(
            f"{self.admin_site.name}:{self.opts.app_label}_{self.opts.model_name}_change", args=(key.pk,)
        )
        if request.method == "POST":
            if key.revoked_at is None:
                self._revoke(request, key)
            messages.success(request, f"Key {key.prefix}… is revoked: it authenticates nobody now.")
            return HttpResponseRedirect(change_url)
        return TemplateResponse(
            request,
            "aaa/admin/apikey_revoke.html",
            {
                **self.admin_site.each_context(request),
                "opts": self.opts,
                "key": key,
                "change_url": change_url,
                "title": f"Revoke API key {key.prefix}…?",
            },
        )

    # -- creating ----------------------------------------------------------------------

    def add_view(
        self, request: HttpRequest, form_url: str = "", extra_context: dict[str, object] | None = None
    ) -> HttpResponse:
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = ApiKeyCreateForm(request.POST or None, creator=request.user)
        ctx = {**self.admin_site.each_context(request), "opts": self.opts, "form": form, "title": "Create an API key"}
        if request.method == "POST" and form.is_valid():
            key, secret = form.create()
            self.log_addition(request, key, [{"added": {}}])
            # The one response that carries the secret: rendered here, never redirected
            # to (a redirect would have to keep it somewhere). admin_view adds no-store.
            return TemplateResponse(
                request,
                "aaa/admin/apikey_created.html",
                {
                    **ctx,
                    "key": key,
                    "secret": secret,
                    "title": "API key created",
                    "may_open": self.has_view_or_change_permission(request, key),
                },
            )
        return TemplateResponse(request, "aaa/admin/apikey_add.html", ctx)
