import importlib

from django.db import migrations, models

from aaa_django.migration_ops import VendorRunSQL

changed = importlib.import_module("aaa_django.migrations.0012_runrecord_changed")


class Migration(migrations.Migration):
    """The run's lease (``aaa_django.store.leases``): which process drives it, until
    when, and the ledger of its adoptions.

    On SQLite, Django adds these columns by making the table again (a new table, the rows
    copied, the old one dropped), which drops the triggers on it: 0012's change-position
    triggers are made again after it (and, backwards, after the columns go)."""

    dependencies = [
        ('aaa', '0012_runrecord_changed'),
    ]

    operations = [
        # backwards, last: the table made again without these columns loses them too
        VendorRunSQL("sqlite", migrations.RunSQL.noop, changed.SQLITE_TRIGGERS_AGAIN),
        migrations.AddField(
            model_name='runrecord',
            name='held_by',
            field=models.CharField(blank=True, max_length=200, null=True, verbose_name='held by'),
        ),
        migrations.AddField(
            model_name='runrecord',
            name='held_until',
            field=models.FloatField(blank=True, null=True, verbose_name='held until'),
        ),
        migrations.AddField(
            model_name='runrecord',
            name='adopted_at',
            field=models.FloatField(blank=True, null=True, verbose_name='last adopted'),
        ),
        migrations.AddField(
            model_name='runrecord',
            name='adoptions',
            field=models.PositiveIntegerField(db_default=0, default=0, verbose_name='adoptions'),
        ),
            # the rows' positions stay as they were copied; the counter table is untouched
        VendorRunSQL("sqlite", changed.SQLITE_TRIGGERS_AGAIN, migrations.RunSQL.noop),
    ]
