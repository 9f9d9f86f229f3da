"""The AAA settings dict: defaults, merging, and the system checks that validate it."""

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings

from aaa_django.checks import check_aaa_settings
from aaa_django.conf import DEFAULTS, aaa_settings


def ids_for(aaa) -> list[str]:
    with override_settings(AAA=aaa):
        return [error.id for error in check_aaa_settings()]


def test_defaults_apply_when_the_site_sets_nothing():
    with override_settings(AAA={}):
        assert aaa_settings() == DEFAULTS
    assert DEFAULTS["BUS"] == "inprocess"
    assert DEFAULTS["CLAIM_THRESHOLD"] == 16384


def test_site_values_are_merged_over_defaults():
    with override_settings(AAA={"BUS": "celery", "FOLD_CHECK_EVERY": 8}):
        merged = aaa_settings()
    assert merged == {**DEFAULTS, "BUS": "celery", "FOLD_CHECK_EVERY": 8}


def test_a_valid_dict_passes():
    assert ids_for({"BUS": "celery", "CLAIM_THRESHOLD": 0, "BLOB_STORAGE": None}) == []
    assert ids_for({"STREAM_TOKENS": True}) == ids_for({"STREAM_TOKENS": False}) == []


def test_an_unknown_key_is_an_error_naming_the_key():
    with override_settings(AAA={"CLAIM_TRESHOLD": 10}):
        (error,) = check_aaa_settings()
    assert error.id == "aaa.E002"
    assert "CLAIM_TRESHOLD" in error.msg


@pytest.mark.parametrize(
    "aaa, expected",
    [
        ([("BUS", "celery")], ["aaa.E001"]),
        ({"CLAIM_THRESHOLD": "16k"}, ["aaa.E003"]),
        ({"FOLD_CHECK_EVERY": True}, ["aaa.E003"]),
        ({"BUS": 1}, ["aaa.E003"]),
        ({"BUS": "rabbit"}, ["aaa.E004"]),
        ({"FOLD_CHECK_EVERY": -1}, ["aaa.E005"]),
        ({"MAX_ABANDONED_ATTEMPTS": 0}, ["aaa.E008"]),
        ({"MAX_ABANDONED_ATTEMPTS": 1.5}, ["aaa.E003"]),
        ({"BLOB_STORAGE": "nowhere"}, ["aaa.E006"]),
        ({"BLOB_STORAGE": 3}, ["aaa.E003"]),
        ({"STREAM_TOKENS": 1}, ["aaa.E003"]),
        ({"BUS": "kafka", "NOPE": 1}, ["aaa.E002", "aaa.E004"]),
    ],
)
def test_bad_values_produce_the_expected_check_ids(aaa, expected):
    assert sorted(ids_for(aaa)) == expected


def test_blob_storage_may_name_a_storages_alias(settings):
    settings.STORAGES = {
        **settings.STORAGES,
        "blobs": {"BACKEND": "django.core.files.storage.InMemoryStorage"},
    }
    assert ids_for({"BLOB_STORAGE": "blobs"}) == []


def test_a_blob_storage_whose_backend_does_not_import_is_an_error(settings):
    """(An S3 storage without the ``s3`` extra: tests/install, on the base install.)"""
    settings.STORAGES = {**settings.STORAGES, "blobs": {"BACKEND": "nowhere.storage.Storage"}}
    with override_settings(AAA={"BLOB_STORAGE": "blobs"}):
        (error,) = check_aaa_settings()
    assert error.id == "aaa.E007"
    assert "'nowhere.storage.Storage' cannot be imported" in error.msg
    assert error.hint == ("Install the package that provides the backend, or correct its dotted path.")


# From Django 6.1, `manage.py check` gives the model checks every database (a JSONField
# asks the database whether it supports JSON): the command needs the test database.
@pytest.mark.django_db
def test_the_check_is_registered_with_django():
    with override_settings(AAA={"BUS": "rabbit"}):
        with pytest.raises(SystemCheckError, match="aaa.E004"):
            call_command("check")


# The check reads settings.DATABASES (not the connections): overriding them is the
# point here, and Django's warning that it does not reconfigure the connections is noise.
@pytest.mark.filterwarnings("ignore:Overriding setting DATABASES:UserWarning")
def test_sqlite_without_immediate_transactions_is_warned():
    from django.test import override_settings

    from aaa_django.checks import check_sqlite_transaction_mode

    deferred = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}}
    with override_settings(DATABASES=deferred):
        assert [w.id for w in check_sqlite_transaction_mode()] == ["aaa.W001"]
    immediate = {"default": {**deferred["default"], "OPTIONS": {"transaction_mode": "IMMEDIATE"}}}
    with override_settings(DATABASES=immediate):
        assert check_sqlite_transaction_mode() == []


def retention_ids(aaa) -> list[str]:
    from aaa_django.checks import check_retention_settings

    with override_settings(AAA=aaa):
        return sorted(error.id for error in check_retention_settings())


@pytest.mark.parametrize(
    "aaa, expected",
    [
        ({"RETENTION": {"success": 30, "failed": 90.5, "*": None}, "RETENTION_BATCH": 10, "ORPHAN_GRACE": 0}, []),
        ({"RETENTION": [("success", 30)]}, ["aaa.E030"]),
        ({"RETENTION": {"success": 0}}, ["aaa.E030"]),
        ({"RETENTION": {"success": "30d"}}, ["aaa.E030"]),
        ({"RETENTION": {"succes": 30}}, ["aaa.E031"]),
        ({"RETENTION_BATCH": 0}, ["aaa.E032"]),
        ({"RETENTION_BATCH": True}, ["aaa.E032"]),
        ({"ORPHAN_GRACE": -1}, ["aaa.E032"]),
    ],
)
def test_retention_settings_are_checked(aaa, expected):
    assert retention_ids(aaa) == expected


def test_each_check_id_is_issued_by_one_module_and_named_in_the_settings_reference():
    """A check id means one thing (a site silences it by id: ``SILENCED_SYSTEM_CHECKS``),
    so one module issues it; the settings reference (``docs/settings.md``) names each
    (alone, or in a range ``aaa.E001`` ... ``aaa.E006``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    issued: dict[str, set[str]] = {}
    for path in (root / "aaa_django").rglob("*.py"):
        for found in re.finditer(r'id="(aaa\.[EW]\d{3})"', path.read_text()):
            issued.setdefault(found.group(1), set()).add(str(path.relative_to(root)))
    assert len(issued) > 20
    assert {i: m for i, m in issued.items() if len(m) > 1} == {}

    reference = (root / "docs" / "settings.md").read_text()
    named = set(re.findall(r"`(aaa\.[EW]\d{3})`", reference))
    for low, high in re.findall(r"`aaa\.([EW]\d{3})`\.\.\.`aaa\.([EW]\d{3})`", reference):
        named |= {f"aaa.{low[0]}{n:03d}" for n in range(int(low[1:]), int(high[1:]) + 1)}
    assert set(issued) - named == set()


def test_every_key_of_the_settings_has_a_row_in_the_settings_reference():
    from pathlib import Path

    reference = (Path(__file__).resolve().parents[2] / "docs" / "settings.md").read_text()
    assert [key for key in DEFAULTS if f"| `{key}` |" not in reference] == []
