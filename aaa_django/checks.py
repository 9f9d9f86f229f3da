"""System checks for the ``AAA`` settings dict (registered in ``AaaConfig.ready``).

=========  =====================================================================
Id         Problem
=========  =====================================================================
aaa.E001   ``AAA`` is not a dict.
aaa.E002   ``AAA`` has a key this app does not know (a typo, usually).
aaa.E003   A value has the wrong type.
aaa.E004   ``BUS`` is not one of "inprocess", "celery".
aaa.E005   A number is out of range (negative).
aaa.E006   ``BLOB_STORAGE`` names no alias in ``STORAGES``.
=========  =====================================================================
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error

from .conf import BUSES, DEFAULTS, site_aaa

# key -> (accepted types, readable name). bool is refused where an int is wanted.
_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "BUS": ((str,), "a str"),
    "CLAIM_THRESHOLD": ((int,), "an int"),
    "BLOB_STORAGE": ((str, type(None)), "a str (a STORAGES alias) or None"),
    "SNAPSHOT_EVERY": ((int,), "an int"),
    "FOLD_CHECK_EVERY": ((int,), "an int"),
}
_NON_NEGATIVE = ("CLAIM_THRESHOLD", "SNAPSHOT_EVERY", "FOLD_CHECK_EVERY")


def check_aaa_settings(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    site = site_aaa()
    if not isinstance(site, dict):
        return [
            Error(
                f"AAA must be a dict, not {type(site).__name__}.",
                hint="Set AAA = {...} in your settings, or leave it out.",
                id="aaa.E001",
            )
        ]
    errors: list[Error] = []
    for key in sorted(set(site) - set(DEFAULTS), key=str):
        errors.append(
            Error(
                f"AAA has an unknown key {key!r}.",
                hint="Known keys: " + ", ".join(DEFAULTS) + ".",
                id="aaa.E002",
            )
        )
    badly_typed = set()
    for key, (types, readable) in _TYPES.items():
        if key not in site:
            continue
        value = site[key]
        if isinstance(value, bool) or not isinstance(value, types):
            badly_typed.add(key)
            errors.append(
                Error(
                    f"AAA[{key!r}] must be {readable}, not {type(value).__name__}.",
                    id="aaa.E003",
                )
            )
    if "BUS" in site and "BUS" not in badly_typed and site["BUS"] not in BUSES:
        errors.append(
            Error(
                f"AAA['BUS'] is {site['BUS']!r}.",
                hint="Use one of: " + ", ".join(sorted(BUSES)) + ".",
                id="aaa.E004",
            )
        )
    for key in _NON_NEGATIVE:
        if key in site and key not in badly_typed and site[key] < 0:
            errors.append(Error(f"AAA[{key!r}] must be >= 0, not {site[key]}.", id="aaa.E005"))
    alias = site.get("BLOB_STORAGE")
    if isinstance(alias, str) and alias not in getattr(settings, "STORAGES", {}):
        errors.append(
            Error(
                f"AAA['BLOB_STORAGE'] is {alias!r}, which is not an alias in STORAGES.",
                hint="Add STORAGES[" + repr(alias) + "] or set BLOB_STORAGE to None.",
                id="aaa.E006",
            )
        )
    return errors


from django.core.checks import Warning, register  # noqa: E402


@register("database")
def check_sqlite_transaction_mode(app_configs: Any = None, databases: Any = None, **kwargs: Any):
    """SQLite appenders need ``transaction_mode: IMMEDIATE``.

    In SQLite's default deferred mode a transaction that has read cannot take the write
    lock later: concurrent appenders (threads, the dev server, workers) fail with
    "database is locked" instead of waiting their turn.
    """
    warnings = []
    for alias, db in settings.DATABASES.items():
        if db.get("ENGINE") != "django.db.backends.sqlite3":
            continue
        if str(db.get("OPTIONS", {}).get("transaction_mode", "")).upper() != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"database {alias!r} is SQLite without transaction_mode IMMEDIATE: "
                    "concurrent appends to the event log may fail with 'database is locked'.",
                    hint=f'Set DATABASES[{alias!r}]["OPTIONS"]["transaction_mode"] = "IMMEDIATE".',
                    id="aaa.W101",
                )
            )
    return warnings
