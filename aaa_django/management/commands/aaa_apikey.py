"""Create, list and revoke REST API keys.

    python manage.py aaa_apikey create --user alice [--name ci] [--expires-days 90]
    python manage.py aaa_apikey list [--user alice]
    python manage.py aaa_apikey revoke PREFIX

``create`` prints the key once: only its SHA-256 is stored. ``PREFIX`` is the start
of a key as ``list`` shows it (``aaa_xxxxxxxx``).
"""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from aaa_django.models import ApiKey


class Command(BaseCommand):
    help = "Create, list and revoke REST API keys (only their hashes are stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="create a key and print it (once)")
        create.add_argument("--user", required=True, help="the username the key acts as")
        create.add_argument("--name", default="", help="what the key is for")
        create.add_argument(
            "--expires-days", type=int, default=None, help="expire after this many days (default: never)"
        )
        listing = sub.add_parser("list", help="list keys (prefixes, never secrets)")
        listing.add_argument("--user", default=None)
        revoke = sub.add_parser("revoke", help="revoke a key by its prefix")
        revoke.add_argument("prefix")

    def handle(self, *args: object, action: str, **options: object) -> None:
        getattr(self, f"_{action}")(**options)

    def _create(self, *, user: str, name: str, expires_days: int | None, **_: object) -> None:
        User = get_user_model()
        try:
            owner = User._default_manager.get_by_natural_key(user)
        except User.DoesNotExist:
            raise CommandError(f"no user {user!r}") from None
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1")
        expires = timedelta(days=expires_days) if expires_days else None
        key, raw = ApiKey.create_key(owner, name=name, expires_in=expires)
        self.stderr.write(
            f"Created key {key.prefix} for {owner.get_username()}"
            + (f", expiring {key.expires_at:%Y-%m-%d}" if key.expires_at else "")
            + ". It is shown once; store it now:"
        )
        self.stdout.write(raw)

    def _list(self, *, user: str | None, **_: object) -> None:
        keys = ApiKey.objects.select_related("user").order_by("created_at")
        if user:
            keys = keys.filter(user__username=user)
        for k in keys:
            used = f"{k.last_used_at:%Y-%m-%d %H:%M}" if k.last_used_at else "never"
            self.stdout.write(f"{k.prefix}  {k.user.get_username():<20} {k.state:<8} used {used:<16} {k.name}")

    def _revoke(self, *, prefix: str, **_: object) -> None:
        keys = list(ApiKey.objects.filter(prefix__startswith=prefix, revoked_at__isnull=True))
        if not keys:
            raise CommandError(f"no active key starts with {prefix!r}")
        if len(keys) > 1:
            raise CommandError(f"{len(keys)} keys start with {prefix!r}: give more of it")
        keys[0].revoke()
        self.stdout.write(f"Revoked {keys[0].prefix} ({keys[0].user.get_username()}).")
