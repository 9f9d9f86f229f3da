"""Migration operations of the app: SQL for one database vendor.

``VendorRunSQL("postgresql", sql, reverse_sql)`` is Django's ``RunSQL`` that runs only
on a connection of that vendor and is a no-op on any other, so one migration can carry
each vendor's dialect and ``sqlmigrate`` still prints the SQL a database would run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.db import migrations

if TYPE_CHECKING:
    from django.db.backends.base.schema import BaseDatabaseSchemaEditor
    from django.db.migrations.state import ProjectState


class VendorRunSQL(migrations.RunSQL):
    """``RunSQL`` for the databases whose ``connection.vendor`` is ``vendor``."""

    def __init__(self, vendor: str, sql: Any, reverse_sql: Any = None, **kwargs: Any) -> None:
        self.vendor = vendor
        super().__init__(sql, reverse_sql, **kwargs)

    def deconstruct(self) -> tuple[str, list[object], dict[str, object]]:
        name, args, kwargs = super().deconstruct()
        return name, [], {"vendor": self.vendor, **kwargs}

    def describe(self) -> str:
        return f"Raw SQL operation ({self.vendor} only)"

    def _applies(self, schema_editor: BaseDatabaseSchemaEditor) -> bool:
        return schema_editor.connection.vendor == self.vendor

    def database_forwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if self._applies(schema_editor):
            super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(
        self, app_label: str, schema_editor: BaseDatabaseSchemaEditor, from_state: ProjectState, to_state: ProjectState
    ) -> None:
        if self._applies(schema_editor):
            super().database_backwards(app_label, schema_editor, from_state, to_state)
