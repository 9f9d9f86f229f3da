from django.db import migrations, models


class Migration(migrations.Migration):
    """The run's lease (``aaa_django.store.leases``): which process drives it, until
    when, and the ledger of its adoptions."""

    dependencies = [
        ('aaa', '0012_runrecord_changed'),
    ]

    operations = [
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
    ]
