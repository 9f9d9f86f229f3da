"""`manage.py demo_user`: make sure the demo staff superuser exists (idempotent)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create or reset the demo superuser (for the example site only)."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--password", default="demo")

    def handle(self, *args, username: str, password: str, **options):
        User = get_user_model()
        user, created = User.objects.get_or_create(**{User.USERNAME_FIELD: username})
        changed = created or not (user.is_staff and user.is_superuser and user.is_active)
        user.is_staff = user.is_superuser = user.is_active = True
        if not user.check_password(password):
            user.set_password(password)
            changed = True
        if changed:
            user.save()
        state = "created" if created else ("updated" if changed else "already present")
        self.stdout.write(f"Demo user {username!r} {state}.")
